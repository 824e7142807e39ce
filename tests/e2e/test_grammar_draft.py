"""The grammar as a drafter through the three real processes (tiny seeded models, the transformers engine).

Greedy output with a JSON schema, drafted by the grammar alone (--method grammar) and by n-gram lookup with the
grammar (--grammar-draft on, the default), equals the same request with speculation off, token for token, and
the statistics count the forced tokens apart.
"""

from __future__ import annotations

import json

import grpc
import pytest

from devkit.stack import running_stack
from specdec.v1 import common_pb2, gateway_pb2_grpc
from tests.e2e.test_structured_outputs import PROMPTS, SCHEMA, generate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["grammar", "ngram"])
def stack(request, tiny_pair, tmp_path_factory):
    with running_stack(tiny_pair[0], tiny_pair[1], method=request.param,
                       log_dir=tmp_path_factory.mktemp("logs"), timeout_s=240) as services:
        with grpc.insecure_channel(services["gateway"].address) as channel:
            yield request.param, gateway_pb2_grpc.GatewayStub(channel)


def test_greedy_json_schema_output_with_the_grammar_draft_equals_k0(stack):
    method, gateway = stack
    constraint = common_pb2.Constraint(json_schema=json.dumps(SCHEMA), strict=True)
    forced = accepted = 0
    for prompt in PROMPTS:
        plain = generate(gateway, prompt, 0, constraint)
        assert plain.speculation.num_forced_tokens == 0
        fast = generate(gateway, prompt, 4, constraint)
        assert list(fast.token_ids) == list(plain.token_ids), (method, prompt)
        stats = fast.speculation
        assert stats.num_forced_tokens <= stats.num_draft_tokens
        if method == "grammar":  # the grammar is the whole draft
            assert stats.num_forced_tokens == stats.num_draft_tokens
        forced += stats.num_forced_tokens
        accepted += stats.num_accepted_tokens
    assert forced > 0 and accepted > 0, (method, forced, accepted)
