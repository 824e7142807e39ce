"""Structured outputs on the vLLM engine: a request's Constraint handed to vLLM's own structured outputs.

The constraint becomes the grammar the transformers engine and the draft's grammar enforce
(`specdec.decoding.grammar.constraint_grammar`), passed to vLLM as EBNF text in
`SamplingParams.structured_outputs`. vLLM's xgrammar backend then does the rest, as for any request:

- it masks the target's logits with the grammar's bitmask at every position of a draft block, and at the
  bonus position, before rejection sampling (so a forbidden token is never sampled or accepted);
- it cuts each of our draft blocks at its first token the grammar forbids as it takes them from the
  proposer (`scheduler.update_draft_token_ids` -> `StructuredOutputManager.validate_tokens`), so such a
  token is not even scored;
- it advances its matcher with the accepted tokens and rolls back with the KV cache.

Why the grammar text and not vLLM's `json` field: vLLM compiles a JSON schema with free whitespace (or,
engine-wide, with "," and ":" separators) and always in xgrammar's strict mode. Ours is compact with ", "
and ": " and strict only where asked, and the draft's grammar drafts that text: under vLLM's own schema
grammar its forced tokens would be cut, and the two engines would constrain to different outputs.

The verifier has already compiled the constraint with its GrammarCompiler (a bad one is INVALID_ARGUMENT
naming the problem before it gets here); vLLM compiles it once more in its own compiler, cached there.
"""

from __future__ import annotations

import collections
import threading

from specdec.decoding.grammar import CACHE_ENTRIES, constraint_grammar, constraint_key
from specdec.v1 import common_pb2

_texts: collections.OrderedDict[str, str] = collections.OrderedDict()  # constraint_key -> EBNF, recent last
_last_allowed: tuple[frozenset[int], int, list[int]] | None = None  # (banned, vocab_size, allowed ids)
_lock = threading.Lock()


def engine_args(vllm) -> dict:
    """What vLLM needs at start-up for structured outputs: its tokenizer (the xgrammar backend builds its
    vocabulary from it; our prompts stay token ids) and the xgrammar backend, the one our grammar is written for."""
    return dict(skip_tokenizer_init=False,
                structured_outputs_config=vllm.config.StructuredOutputsConfig(backend="xgrammar"))


def grammar_text(constraint: common_pb2.Constraint) -> str:
    """The constraint's grammar as xgrammar EBNF, cached by a hash of the constraint."""
    key = constraint_key(constraint)
    with _lock:
        if key in _texts:
            _texts.move_to_end(key)
            return _texts[key]
    text = str(constraint_grammar(constraint))
    with _lock:
        _texts[key] = text
        while len(_texts) > CACHE_ENTRIES:
            _texts.popitem(last=False)
    return text


def sampling_fields(vllm, constraint: common_pb2.Constraint | None, banned: frozenset[int], vocab_size: int) -> dict:
    """The vllm.SamplingParams fields that enforce the request's constraint; {} without one.

    banned: token ids forbidden on top of the grammar (SequenceGrammar.banned: for JSON, the tokens holding a
    raw control character, which xgrammar's strings admit on some vocabularies). They go to vLLM as
    allowed_token_ids, which its sampler and rejection sampler apply at every position, drafts' included, as
    the transformers engine applies the ban after the grammar's mask. Converting a large schema takes a while:
    call it off the event loop."""
    if constraint is None or constraint.WhichOneof("kind") is None:
        return {}
    fields = {"structured_outputs": vllm.sampling_params.StructuredOutputsParams(grammar=grammar_text(constraint))}
    if banned:
        fields["allowed_token_ids"] = _allowed(banned, vocab_size)
    return fields


def _allowed(banned: frozenset[int], vocab_size: int) -> list[int]:
    """Every id of the vocabulary but the banned ones (the last set's list is kept: it is the same every time)."""
    global _last_allowed
    with _lock:
        if _last_allowed is not None and _last_allowed[0] is banned and _last_allowed[1] == vocab_size:
            return _last_allowed[2]
    allowed = [i for i in range(vocab_size) if i not in banned]
    with _lock:
        _last_allowed = (banned, vocab_size, allowed)
    return allowed
