"""The request's grammar as a drafter (structured outputs): cut what it forbids, draft what it forces.

A constrained request (StartSequence.constraint) gets a `GrammarSequence` around the proposer's own sequence
(n-gram, suffix, model; or `NoDraft` for --method grammar). It keeps an xgrammar matcher on the output so far
(`tokens[output_start:]`), and each proposal:
1. takes the inner proposer's block and cuts it before its first token the grammar forbids (or a stop token:
   the target emits those itself): the verifier would cut it there anyway, a round trip later;
2. past the cut, or where the inner block ended, drafts the text the grammar forces (xgrammar's jump-forward
   string: a JSON key, the `": "` after it, the rest of an enum value), encoded by the tokenizer, while the
   grammar accepts each token, up to k in all. These are the block's last `num_forced` tokens.

Forced text is certain; its tokens nearly so: where the grammar allows exactly one token it is that token,
but a BPE vocabulary often spells forced text in several ways (`"date` or `"` + `date`), and the target picks
one. So the verifier judges forced tokens apart from the inner draft's (`SpeculationPolicy`), and the
grammar's cuts and forced tokens are lossless like any draft: the verifier masks and decides as always.

The draft is not the authority on the constraint: a constraint that does not compile here, or a compile queue
that is full, leaves the request drafting without the grammar (logged); the verifier answers for the
constraint. Compiling runs on the compiler's thread (`GrammarCompiler.submit`); until it is done the sequence
drafts without the grammar, then the matcher catches up on the output so far.

The matcher follows the sequence by position: `update(keep_length, append)` rolls it back to keep_length
(xgrammar keeps each accepted token's state for rollback) and accepts the appended tokens. A rollback deeper
than MAX_ROLLBACK tokens (never one the verifier sends: it rolls back at most a block and the draft's guess)
restarts the matcher and accepts the output again, so the rollback depth relied on stays bounded.
"""

from __future__ import annotations

import concurrent.futures
import logging

import torch

from draft_service.proposer import DraftSequence, Proposer
from specdec.decoding.draft_block import DraftBlock
from specdec.decoding.grammar import (GrammarBusy, GrammarCompileConfig, GrammarCompiler, SequenceGrammar,
                                     constraint_set)
from specdec.decoding.sampling import SamplingParams
from specdec.runtime import metrics
from specdec.v1 import common_pb2

log = logging.getLogger(__name__)

MAX_ROLLBACK = 256  # deeper rollbacks re-accept the output from a fresh matcher
MAX_FORCED_STRINGS = 8  # jump-forward strings per proposal at most (each is the longest one; this only guards)


class NoDraft(DraftSequence):
    """A sequence that drafts nothing itself (--method grammar: the grammar's forced tokens are the whole draft)."""

    def propose(self, k: int) -> DraftBlock:
        return DraftBlock.empty()

    def _extend(self, token_ids: list[int]) -> None:
        self.tokens.extend(token_ids)

    def _truncate(self, length: int) -> None:
        del self.tokens[length:]


class GrammarSequence(DraftSequence):
    """An inner sequence whose blocks the grammar cuts and extends. `tokens` is the inner sequence's."""

    def __init__(self, inner: DraftSequence, pending: concurrent.futures.Future, tokenizer, output_start: int,
                 request_id: str = ""):
        """pending: the request's SequenceGrammar, compiling; output_start: where the constrained output begins
        in the sequence (the request's prompt length)."""
        # the tokens are the inner sequence's: DraftSequence.__init__ is not called
        self.inner = inner
        self.tokenizer = tokenizer
        self.output_start = output_start
        self.request_id = request_id
        self._pending: concurrent.futures.Future | None = pending
        self.grammar: SequenceGrammar | None = None
        self.matched = 0  # the matcher has accepted tokens[output_start : output_start + matched]

    @property
    def tokens(self) -> list[int]:
        return self.inner.tokens

    @property
    def source(self) -> str:
        """The inner proposer's side of the last block (hybrid), for the propose span event."""
        return self.inner.source

    def update(self, keep_length: int, append_token_ids: list[int], assumed: bool = False) -> None:
        self.inner.update(keep_length, append_token_ids, assumed)
        self._follow(keep_length)

    def confirm(self, length: int) -> None:
        self.inner.confirm(length)

    def set_min_sized(self, length: int) -> None:
        self.inner.set_min_sized(length)

    def finish(self) -> None:
        self.inner.finish()

    def close(self) -> None:
        self.inner.close()
        self.grammar = self._pending = None

    def _truncate(self, length: int) -> None:
        self.update(length, [], assumed=True)

    def _extend(self, token_ids: list[int]) -> None:
        self.update(len(self.tokens), token_ids, assumed=True)

    def propose(self, k: int) -> DraftBlock:
        return self._within_grammar(k, self.inner.propose)

    def propose_sized(self, k: int) -> DraftBlock:
        """The inner proposer's block sized by its evidence (the hybrid's suffix side), or none, held to the grammar
        as every block is; the forced tokens after it cost no model forward either."""
        return self._within_grammar(k, self.inner.propose_sized)

    def _within_grammar(self, k: int, propose) -> DraftBlock:
        """propose(k)'s block, cut at its first token the grammar forbids, then the tokens it forces after that."""
        grammar = self._ready()
        if grammar is None or k <= 0:
            return propose(k)
        start = len(self.tokens)
        block = propose(k)
        allowed = self._walk(block.token_ids)
        if allowed < len(block.token_ids):
            metrics.DRAFT_GRAMMAR_TOKENS.labels(kind="cut").inc(len(block.token_ids) - allowed)
            # unverified proposals, rolled back like an assumed sync: a suffix tree never indexes them
            self.inner.update(start + allowed, [], assumed=True)
            block = block.cut(allowed)
        forced = self._forced(k - allowed)
        if not forced:
            return block
        metrics.DRAFT_GRAMMAR_TOKENS.labels(kind="forced").inc(len(forced))
        self.inner.update(len(self.tokens), forced, assumed=True)
        probs = block.probs
        if probs is not None:  # a forced token's q is one-hot
            one_hot = torch.zeros(len(forced), probs.shape[1], dtype=probs.dtype)  # [f, V]
            one_hot[torch.arange(len(forced)), torch.tensor(forced)] = 1.0
            probs = torch.cat([probs, one_hot])  # [k', V]
        return DraftBlock(block.token_ids + forced, probs, block.ahead, block.num_chained, len(forced),
                          block.sized_by_draft)

    def _ready(self) -> SequenceGrammar | None:
        """The matcher, once compiled (then caught up on the output so far); None until then, or without one."""
        if self._pending is not None and self._pending.done():
            pending, self._pending = self._pending, None
            try:
                self.grammar = pending.result()
            except Exception as exc:  # noqa: BLE001 (a GrammarError or xgrammar's own: the verifier is the authority)
                log.warning("request %s: drafting without the grammar: %s", self.request_id, exc)
                return None
            self.matched = 0
            self._follow(len(self.tokens))
        return self.grammar

    def _follow(self, keep_length: int) -> None:
        """Move the matcher to the sequence: back to keep_length, then over the tokens after it."""
        if self.grammar is None:
            return
        keep = max(keep_length - self.output_start, 0)
        if keep < self.matched:
            depth = self.matched - keep
            if depth > MAX_ROLLBACK:
                self.grammar.matcher.reset()
                self.matched = 0
            else:
                self.grammar.matcher.rollback(depth)
                self.matched = keep
        for token in self.tokens[self.output_start + self.matched:]:
            if self.grammar.matcher.is_terminated() or not self.grammar.matcher.accept_token(token):
                # not the output the verifier's grammar allows (or past its end): nothing left to guide
                log.info("request %s: token %d at output position %d is outside the grammar; drafting without it",
                         self.request_id, token, self.matched)
                self.grammar = None
                return
            self.matched += 1

    def _allowed(self, token: int) -> bool:
        """Whether the grammar takes `token` next (and, if so, the matcher has taken it)."""
        grammar = self.grammar
        if token in grammar.stop_token_ids or token in grammar.banned or not 0 <= token < grammar.vocab_size:
            return False
        if grammar.matcher.is_terminated() or not grammar.matcher.accept_token(token):
            return False
        self.matched += 1
        return True

    def _walk(self, token_ids: list[int]) -> int:
        """How many of the draft's first tokens the grammar allows; the matcher takes them."""
        for n, token in enumerate(token_ids):
            if not self._allowed(token):
                return n
        return len(token_ids)

    def _forced(self, n: int) -> list[int]:
        """Up to n tokens of the text the grammar forces next, as the tokenizer encodes it; the matcher takes them."""
        forced: list[int] = []
        for _ in range(MAX_FORCED_STRINGS):
            if len(forced) >= n or self.grammar.matcher.is_terminated():
                break
            text = self.grammar.matcher.find_jump_forward_string()
            token_ids = self.tokenizer.encode(text, add_special_tokens=False) if text else []
            for token in token_ids:
                if len(forced) == n or not self._allowed(token):
                    return forced
                forced.append(token)
            if not token_ids:
                break
        return forced


class GrammarProposer(Proposer):
    """Wraps a proposer (or none: --method grammar) so that constrained requests draft with their grammar."""

    takes_constraints = True

    def __init__(self, inner: Proposer | None, tokenizer, vocab_size: int, stop_token_ids: list[int],
                 compile_timeout_s: float = GrammarCompileConfig.grammar_compile_timeout_s):
        self.inner = inner
        self.method = inner.method if inner is not None else "grammar"
        self.inline = inner.inline if inner is not None else True
        # alone, it drafts only where text is forced, and none elsewhere: ask it for its longest block
        self.sizes_blocks = inner.sizes_blocks if inner is not None else True
        # the verifier asks for those alone where the inner's model blocks do not pay (the hybrid): say so for it
        self.sizes_some_blocks = inner.sizes_some_blocks if inner is not None else False
        self.tokenizer = tokenizer
        self.compiler = GrammarCompiler(tokenizer, vocab_size, stop_token_ids, compile_timeout_s)

    def start(self, prompt_ids: list[int], sampling: SamplingParams, return_probs: bool, tenant: str = "",
              constraint: common_pb2.Constraint | None = None, output_start: int | None = None,
              request_id: str = "") -> DraftSequence:
        """output_start: where the constrained output begins in prompt_ids (default: after them all)."""
        inner = (self.inner.start(prompt_ids, sampling, return_probs, tenant) if self.inner is not None
                 else NoDraft(prompt_ids))
        if not constraint_set(constraint):
            return inner
        try:
            pending = self.compiler.submit(self._matcher, constraint)
        except GrammarBusy as exc:
            log.warning("request %s: drafting without the grammar: %s", request_id, exc)
            return inner
        start = len(prompt_ids) if output_start is None else output_start
        return GrammarSequence(inner, pending, self.tokenizer, start, request_id)

    def _matcher(self, constraint: common_pb2.Constraint) -> SequenceGrammar:
        """On the compile thread: the compiled grammar (cached) and a fresh matcher on it."""
        return self.compiler.matcher(self.compiler.compile_now(constraint), constraint)
