"""Constrained decoding in the transformers engine: exact under speculation, forbidden drafts never accepted."""

import json

import jsonschema
import pytest
import torch

from devkit.testing import pooled_chi_square_p_value
from specdec.decoding.draft_block import DraftBlock
from specdec.decoding.grammar import GrammarCompiler
from specdec.decoding.sampling import SamplingParams, make_generator, probs_from_logits
from specdec.modeling.models import load_causal_lm, load_tokenizer
from specdec.v1 import common_pb2
from verifier_service.engines.transformers_engine import TransformersEngine, verify_block

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["name", "age"], "additionalProperties": False}
PROMPTS = ["Hello", '{"name": "Ada"', "SELECT id", "def add(a, b):", "café"]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def setup(tiny_pair):
    tokenizer = load_tokenizer(str(tiny_pair[0]))
    engine = TransformersEngine(load_causal_lm(str(tiny_pair[0])))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return engine, tokenizer, eos, GrammarCompiler(tokenizer, engine.vocab_size, [eos])


def decode(engine, compiler, compiled, constraint, prompt_ids, eos, blocks, sampling=SamplingParams()):
    """Constrained decoding; each round verifies `blocks(tokens, round)`. Returns (completion, accepted counts)."""
    grammar = compiler.matcher(compiled, constraint)
    state, generator, accepted = engine.start(prompt_ids), make_generator(0), []
    for i in range(MAX_TOKENS):
        verdict, _ = verify_block(engine, state, DraftBlock(blocks(state.tokens, i)), sampling, generator, grammar)
        accepted.append(verdict.num_accepted)
        if eos in state.tokens[len(prompt_ids):]:
            break
    completion = state.tokens[len(prompt_ids):]
    return completion[: completion.index(eos) + 1] if eos in completion else completion, accepted


def test_greedy_with_a_schema_equals_k0_and_validates_whatever_the_drafts(setup):
    engine, tokenizer, eos, compiler = setup
    constraint = common_pb2.Constraint(json_schema=json.dumps(SCHEMA), strict=True)
    compiled = compiler.compile_now(constraint)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        plain, _ = decode(engine, compiler, compiled, constraint, ids, eos, lambda tokens, i: [])
        assert plain[-1] == eos, f"{prompt!r}: no end within {MAX_TOKENS} tokens"
        jsonschema.validate(json.loads(tokenizer.decode(plain[:-1])), SCHEMA)
        # a perfect draft (the k=0 output itself), a shifted one, and one of arbitrary tokens
        perfect = lambda tokens, i, n=len(ids): plain[len(tokens) - n: len(tokens) - n + 4]  # noqa: E731
        shifted = lambda tokens, i, n=len(ids): plain[len(tokens) - n + 1: len(tokens) - n + 5]  # noqa: E731
        noise = lambda tokens, i: [(7 * i + j) % engine.vocab_size for j in range(3)]  # noqa: E731
        for blocks in (perfect, shifted, noise):
            assert decode(engine, compiler, compiled, constraint, ids, eos, blocks)[0] == plain, prompt
        assert sum(decode(engine, compiler, compiled, constraint, ids, eos, perfect)[1]) > 0  # speculation did happen


def test_grammar_invalid_drafts_are_never_accepted_and_change_nothing(setup):
    engine, tokenizer, eos, compiler = setup
    constraint = common_pb2.Constraint(regex="[0-9]{3,12}")
    compiled = compiler.compile_now(constraint)
    letters = tokenizer.encode("abcxyz", add_special_tokens=False)  # never allowed by the regex
    ids = tokenizer.encode("Hello", add_special_tokens=False)
    plain, _ = decode(engine, compiler, compiled, constraint, ids, eos, lambda tokens, i: [])
    drafted, accepted = decode(engine, compiler, compiled, constraint, ids, eos, lambda tokens, i: letters)
    assert drafted == plain and sum(accepted) == 0
    text = tokenizer.decode(plain[:-1] if plain[-1] == eos else plain)
    assert text.isdigit() and 3 <= len(text) <= 12, text


@pytest.mark.parametrize("drafted", [False, True])
def test_first_token_at_t1_follows_the_masked_renormalised_target(setup, drafted):
    """Chi-square of the first token against softmax(logits masked to the choices' first tokens)."""
    engine, tokenizer, eos, compiler = setup
    choices = ["yes", "no", "maybe", "SELECT", "code", "{"]
    compiled = compiler.compile_now(common_pb2.Constraint(choice=common_pb2.Choices(values=choices)))
    ids = tokenizer.encode("Hello", add_special_tokens=False)
    # the allowed first tokens, found from the token texts (not from the grammar code under test)
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    allowed = torch.tensor([bool(t) and any(c.startswith(t) for c in choices) for t in texts]
                           + [False] * (engine.vocab_size - len(texts)))  # [V]
    logits = engine.score(engine.start(ids), []).clone()  # [1, V]
    logits[:, ~allowed] = float("-inf")
    sampling = SamplingParams(temperature=1.0)
    expected = probs_from_logits(logits, sampling)[0]  # [V]
    assert int((expected > 0).sum()) >= 3
    # a draft that proposes a fixed allowed-or-not first token each time: rejection sampling must keep p
    draft = [int(expected.argmax())] if drafted else []
    counts = torch.zeros(engine.vocab_size)
    generator = make_generator(1234)
    for _ in range(600):
        grammar = compiler.matcher(compiled)
        state = engine.start(ids)
        verdict, _ = verify_block(engine, state, DraftBlock(draft), sampling, generator, grammar)
        counts[state.tokens[len(ids)]] += 1
        assert verdict.num_accepted <= len(draft)
    assert counts[expected == 0].sum() == 0  # never a token the grammar forbids
    expected = expected.double() / expected.double().sum()  # float32 sums miss scipy's tolerance
    assert pooled_chi_square_p_value(counts.double().numpy(), expected.numpy()) > 0.001
