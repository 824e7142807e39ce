"""The grammar as a drafter, for the advisor: the rounds it would add, from its forced-token share.

The grammar drafter (draft_service/grammar_draft.py) drafts the text a structured-outputs constraint forces (keys,
`": "`, enum tails): runs of forced tokens, at no model cost. The advisor replays the other drafts over the
target's output; it does not replay the grammar (that needs the constrained output and the schema's matcher).
It takes three measured figures instead (`tools.grammar_draft_check` prints them per workload):
- share: of the output tokens, the share the grammar forces (grammar alone: its accepted tokens / output);
- run: forced tokens per grammar draft (its draft tokens / drafts);
- acceptance: the share of forced draft tokens the target accepts (below 1 where the target spells forced text
  otherwise than the tokenizer does: design.md, "The grammar drafts too").

Model: in the rounds where the base draft drafts nothing (every round, for the grammar alone), a share `share` of
the tokens is forced and comes in grammar drafts of b = min(run, k) tokens; each such round accepts b * acceptance
of them and emits one more. Those rounds replace the plain rounds that emitted the same tokens. It assumes the
forced tokens are spread evenly over those rounds: on top of suffix this is optimistic, since suffix's own
drafts already cover the most repeated forced text (the keys), so the share left to the grammar is lower.
"""

from __future__ import annotations

import dataclasses

GRAMMAR_PROPOSERS = ("grammar", "suffix+grammar")


@dataclasses.dataclass(frozen=True)
class ForcedTokens:
    share: float  # of the output tokens, forced by the grammar (0..1)
    run: float = 6.0  # forced tokens per grammar draft
    acceptance: float = 0.8  # of the forced draft tokens, accepted

    def problems(self) -> list[str]:
        out = []
        if not 0 < self.share <= 1:
            out.append(f"--forced-share must be in (0, 1], got {self.share}")
        if self.run < 1:
            out.append(f"--forced-run must be at least 1, got {self.run}")
        if not 0 < self.acceptance <= 1:
            out.append(f"--forced-acceptance must be in (0, 1], got {self.acceptance}")
        return out


def with_grammar(tokens: float, base: dict[float, float], forced: ForcedTokens, k: int) -> dict[float, float]:
    """Rounds by block length once the grammar drafts in the base's no-draft rounds (base {0: tokens}: the grammar
    alone). tokens: the output's; base: block length -> rounds (0: drafted nothing), one token each at 0."""
    plain = base.get(0, 0.0)
    block = min(forced.run, k)
    accepted = block * forced.acceptance
    if plain <= 0 or block <= 0 or tokens <= 0:
        return dict(base)
    grammar_rounds = forced.share * plain / accepted
    grammar_rounds = min(grammar_rounds, plain / (accepted + 1))  # they cannot emit more than the plain rounds did
    rounds = dict(base)
    rounds[0] = plain - grammar_rounds * (accepted + 1)
    rounds[block] = rounds.get(block, 0.0) + grammar_rounds
    return rounds
