"""The grammar as a drafter: forced runs, cuts, rollback, a constraint it cannot compile, and exactness."""

import concurrent.futures
import json

import pytest
import torch

from draft_service import grammar_draft
from draft_service.grammar_draft import GrammarProposer, GrammarSequence
from draft_service.ngram import NgramProposer
from draft_service.proposer import DraftSequence
from specdec.decoding.draft_block import DraftBlock
from specdec.decoding.grammar import GrammarCompiler
from specdec.decoding.sampling import SamplingParams, make_generator
from specdec.v1 import common_pb2
from specdec.modeling.models import load_causal_lm, load_tokenizer
from verifier_service.engines.transformers_engine import TransformersEngine, verify_block

SCHEMA = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "tags": {"type": "array", "items": {"enum": ["math", "code"]},
                                                    "maxItems": 3}},
          "required": ["age", "tags"], "additionalProperties": False}
CONSTRAINT = common_pb2.Constraint(json_schema=json.dumps(SCHEMA), strict=True)
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def setup(tiny_pair):
    tokenizer = load_tokenizer(str(tiny_pair[0]))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return TransformersEngine(load_causal_lm(str(tiny_pair[0]))), tokenizer, eos


@pytest.fixture(scope="module")
def compiler(setup):
    """One GrammarCompiler for the module: each one starts a compile child process (it imports torch and xgrammar:
    seconds), and a proposer uses its compiler only through compile_now/matcher, which a shared one serves alike
    (compiled grammars are cached by constraint; every sequence still gets a fresh matcher)."""
    _engine, tokenizer, eos = setup
    shared = GrammarCompiler(tokenizer, len(tokenizer), [eos])
    yield shared
    shared.close()


def grammar_proposer(compiler: GrammarCompiler, inner, tokenizer, vocab_size: int, stop_token_ids: list[int]):
    """GrammarProposer(inner, tokenizer, vocab_size, stop_token_ids), built on the module's compiler (checked to be
    the compiler the proposer would have built) instead of a new one with its own compile child."""
    def build(tokenizer_, vocab_size_, stop_token_ids_, timeout_s):
        assert (tokenizer_, vocab_size_, list(stop_token_ids_), timeout_s) == \
            (compiler._tokenizer, compiler.vocab_size, compiler.stop_token_ids, compiler.timeout_s)
        return compiler

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grammar_draft, "GrammarCompiler", build)
        proposer = GrammarProposer(inner, tokenizer, vocab_size, stop_token_ids)
    assert proposer.compiler is compiler
    return proposer


def started(proposer: GrammarProposer, prompt: list[int], constraint=CONSTRAINT) -> DraftSequence:
    sequence = proposer.start(prompt, SamplingParams(), False, constraint=constraint)
    if isinstance(sequence, GrammarSequence):
        concurrent.futures.wait([sequence._pending])  # compiled (or failed): the grammar is there from the start
    return sequence


class Fixed(DraftSequence):
    """An inner draft that proposes the same tokens every round."""

    def __init__(self, prompt_ids, proposal):
        self.proposal = proposal
        super().__init__(prompt_ids)

    def propose(self, k):
        block = self.proposal[:k]
        self.tokens.extend(block)
        return DraftBlock(list(block))

    def _extend(self, token_ids):
        self.tokens.extend(token_ids)

    def _truncate(self, length):
        del self.tokens[length:]


class FixedProposer(NgramProposer):
    def __init__(self, proposal):
        super().__init__()
        self.proposal = proposal

    def start(self, prompt_ids, sampling, return_probs, tenant=""):
        return Fixed(prompt_ids, self.proposal)


class Sized(Fixed):
    """An inner draft like the hybrid's: its sized-only ask answers with the fixed tokens, marked sized by its
    evidence; its model side must not run then."""

    def propose(self, k):
        raise AssertionError("a sized-only ask ran the model side")

    def propose_sized(self, k):
        block = self.proposal[:k]
        self.tokens.extend(block)
        return DraftBlock(list(block), sized_by_draft=True)


class SizedProposer(FixedProposer):
    sizes_some_blocks = True

    def start(self, prompt_ids, sampling, return_probs, tenant=""):
        return Sized(prompt_ids, self.proposal)


def test_forced_text_is_drafted_and_counted(setup, compiler):
    """Alone (--method grammar), the draft proposes what the schema forces at the start: `{"age": `, no further."""
    _engine, tokenizer, eos = setup
    proposer = grammar_proposer(compiler, None, tokenizer, len(tokenizer), [eos])
    assert (proposer.method, proposer.inline, proposer.sizes_blocks) == ("grammar", True, True)
    prompt = tokenizer.encode("Hello")
    sequence = started(proposer, prompt)
    block = sequence.propose(16)
    assert tokenizer.decode(block.token_ids) == '{"age": '
    assert block.num_forced == len(block.token_ids) and sequence.tokens == prompt + block.token_ids
    assert sequence.propose(16).token_ids == []  # the age's digits are the model's choice: nothing is forced
    # k bounds the forced run, and the block's forced tokens survive a cut as its last ones
    sequence.update(len(prompt), [])
    short = sequence.propose(2)
    assert short.token_ids == block.token_ids[:2] and short.num_forced == 2 and short.cut(1).num_forced == 1


def test_inner_block_is_cut_at_its_first_forbidden_token_and_forced_text_follows(setup, compiler):
    _engine, tokenizer, eos = setup
    brace, quote, q = (tokenizer.convert_tokens_to_ids(t) for t in ("{", '"', "q"))
    proposer = grammar_proposer(compiler, FixedProposer([brace, quote, q, q]), tokenizer, len(tokenizer), [eos])
    prompt = tokenizer.encode("Hello")
    sequence = started(proposer, prompt)
    block = sequence.propose(6)
    # `{"` from the inner draft, then `q` is forbidden: cut there, and the key the grammar forces follows
    assert block.token_ids[:2] == [brace, quote] and q not in block.token_ids
    assert tokenizer.decode(block.token_ids).startswith('{"age')
    assert block.num_forced == len(block.token_ids) - 2 and sequence.tokens == prompt + block.token_ids


def test_an_inner_draft_that_sizes_some_blocks_keeps_its_sized_only_asks_under_the_grammar(setup, compiler):
    """The draft service wraps every method in the grammar draft: the hybrid's sizes_some_blocks must reach the
    verifier through the wrapper (else it never asks for the suffix side alone, nor sends its threshold), and a
    constrained sequence's sized-only ask is the inner's block, cut at its first forbidden token, still marked sized,
    with the forced text after it, and no model forward."""
    _engine, tokenizer, eos = setup
    brace, quote, q = (tokenizer.convert_tokens_to_ids(t) for t in ("{", '"', "q"))
    proposer = grammar_proposer(compiler, SizedProposer([brace, quote, q, q]), tokenizer, len(tokenizer), [eos])
    assert proposer.sizes_some_blocks and not grammar_proposer(compiler, FixedProposer([]), tokenizer,
                                                               len(tokenizer), [eos]).sizes_some_blocks
    prompt = tokenizer.encode("Hello")
    block = started(proposer, prompt).propose_sized(6)
    assert block.sized_by_draft and block.token_ids[:2] == [brace, quote] and q not in block.token_ids
    assert tokenizer.decode(block.token_ids).startswith('{"age') and block.num_forced == len(block.token_ids) - 2
    unconstrained = started(proposer, prompt, constraint=None)
    assert unconstrained.propose_sized(6) == DraftBlock([brace, quote, q, q], sized_by_draft=True)


def test_rollback_below_forced_tokens_restores_the_matcher(setup, compiler, monkeypatch):
    """update() that rolls back into (and below) forced tokens leaves the matcher where a fresh one fed the same
    output is, by rollback and (past MAX_ROLLBACK) by accepting the output again."""
    _engine, tokenizer, eos = setup
    compiled = compiler.compile_now(CONSTRAINT)

    def bitmask(matcher):
        import xgrammar

        mask = xgrammar.allocate_token_bitmask(1, len(tokenizer))
        matcher.fill_next_token_bitmask(mask, 0)
        return mask

    def check(sequence, output):
        fresh = compiler.matcher(compiled, CONSTRAINT).matcher
        for token in output:
            assert fresh.accept_token(token)
        assert sequence.matched == len(output)
        assert torch.equal(bitmask(sequence.grammar.matcher), bitmask(fresh))
        assert sequence.grammar.matcher.find_jump_forward_string() == fresh.find_jump_forward_string()

    for max_rollback in (grammar_draft.MAX_ROLLBACK, 1):
        monkeypatch.setattr(grammar_draft, "MAX_ROLLBACK", max_rollback)
        proposer = grammar_proposer(compiler, None, tokenizer, len(tokenizer), [eos])
        sequence = started(proposer, tokenizer.encode("Hello"))
        prompt = len(sequence.tokens)
        forced = sequence.propose(16).token_ids  # {"age":␣
        check(sequence, forced)
        sequence.update(prompt + 2, [])  # back into the forced run: `{"` is kept
        check(sequence, forced[:2])
        sequence.update(prompt, tokenizer.encode("{", add_special_tokens=False))  # below it, and another token
        check(sequence, tokenizer.encode("{", add_special_tokens=False))
        more = sequence.propose(16)
        assert tokenizer.decode(more.token_ids) == '"age": ' and more.num_forced == len(more.token_ids)
        digits = tokenizer.encode("36", add_special_tokens=False)
        sequence.update(len(sequence.tokens), digits)  # the target's tokens, past the forced ones
        check(sequence, sequence.tokens[prompt:])
        sequence.update(prompt, [])  # all the way back
        check(sequence, [])


def test_a_constraint_the_draft_cannot_compile_drafts_without_the_grammar(setup, compiler, caplog):
    _engine, tokenizer, eos = setup
    proposer = grammar_proposer(compiler, NgramProposer(), tokenizer, len(tokenizer), [eos])
    prompt = tokenizer.encode("abcabcabc")
    sequence = started(proposer, prompt, common_pb2.Constraint(regex="[0-9"))
    block = sequence.propose(3)  # the n-gram's own block, uncut
    assert block.token_ids and block.num_forced == 0 and "drafting without the grammar" in caplog.text
    assert not isinstance(proposer.start(prompt, SamplingParams(), False), GrammarSequence)  # no constraint


def decode(engine, compiler, compiled, prompt, eos, sequence: DraftSequence | None, k: int):
    """Greedy constrained decoding; each round verifies the drafter's block of k (none: k = 0). Returns the output,
    and the draft tokens and forced ones verified, the accepted ones."""
    grammar = compiler.matcher(compiled, CONSTRAINT)
    state, generator = engine.start(prompt), make_generator(0)
    drafted = forced = accepted = 0
    while len(state.tokens) - len(prompt) < MAX_TOKENS and eos not in state.tokens[len(prompt):]:
        before = len(state.tokens)  # the draft holds these same tokens
        block = sequence.propose(k) if sequence is not None else DraftBlock.empty()
        verdict, _ = verify_block(engine, state, block, SamplingParams(), generator, grammar)
        drafted, forced, accepted = drafted + len(block.token_ids), forced + block.num_forced, \
            accepted + verdict.num_accepted
        if sequence is not None:  # keep the accepted drafts, append the target's token
            kept = before + verdict.num_accepted
            sequence.update(kept, state.tokens[kept:])
            assert sequence.tokens == state.tokens
    output = state.tokens[len(prompt):]
    return output[:output.index(eos) + 1] if eos in output else output, drafted, forced, accepted


@pytest.mark.parametrize("inner", ["grammar", "invalid"])
def test_greedy_output_with_the_grammar_draft_equals_k0(setup, compiler, inner):
    """Greedy constrained decoding with the grammar's blocks equals k = 0 token for token. With an inner draft whose
    every token the grammar forbids, none of its tokens is verified, let alone accepted: only forced ones are."""
    engine, tokenizer, eos = setup
    compiled = compiler.compile_now(CONSTRAINT)
    q = tokenizer.convert_tokens_to_ids("q")  # no key or value of the schema holds a q
    forced_total = accepted_total = 0
    for text in ("Hello", '{"age": 36', "SELECT id"):
        prompt = tokenizer.encode(text, add_special_tokens=False)
        plain, *_ = decode(engine, compiler, compiled, prompt, eos, None, 0)
        json.loads(tokenizer.decode(plain[:-1] if plain[-1] == eos else plain))
        proposer = grammar_proposer(compiler, None if inner == "grammar" else FixedProposer([q] * 8), tokenizer,
                                    engine.vocab_size, [eos])
        output, drafted, forced, accepted = decode(engine, compiler, compiled, prompt, eos,
                                                   started(proposer, prompt), 6)
        assert output == plain, text
        assert drafted == forced  # every verified draft token was forced: the inner's were all cut
        forced_total += forced
        accepted_total += accepted
    assert forced_total > 0 and accepted_total > 0


def test_a_model_drafts_q_rows_for_its_tokens_and_one_hot_rows_for_forced_ones(setup, compiler, tiny_pair):
    """At temperature 1 the model draft sends q; the grammar's cut keeps the rows of the tokens it keeps, and each
    forced token's q is one-hot on it."""
    from draft_service.model_draft import ModelProposer

    _engine, tokenizer, eos = setup
    proposer = grammar_proposer(compiler, ModelProposer(load_causal_lm(str(tiny_pair[1]))), tokenizer, len(tokenizer),
                                [eos])
    assert (proposer.method, proposer.inline) == ("model", False)
    prompt = tokenizer.encode("Hello")
    sequence = proposer.start(prompt, SamplingParams(temperature=1.0, seed=None), True, constraint=CONSTRAINT)
    concurrent.futures.wait([sequence._pending])
    forced = 0
    for _ in range(6):
        block = sequence.propose(6)
        assert block.probs is not None and block.probs.shape[0] == len(block.token_ids)
        first_forced = len(block.token_ids) - block.num_forced
        for row, token in zip(block.probs[first_forced:], block.token_ids[first_forced:]):
            assert row[token] == 1.0 and row.sum() == 1.0
        forced += block.num_forced
        sequence.update(len(sequence.tokens) - len(block.token_ids), block.token_ids[:1])  # keep one, as if judged
    assert forced > 0
