"""Per-tenant suffix budgets through the real stack (issue 32, item 6): one tenant's traffic cannot evict another
tenant's cached outputs, so tenant b's speculation statistics do not change, nor reveal, tenant a's traffic.

The budget is tiny (--suffix-max-cached-tokens 48: one output), k is fixed and the timing-dependent parts are
off (chaining, drafting ahead), so b's statistics depend only on what its cache holds.
"""

from __future__ import annotations

import grpc
import pytest

from specdec.v1 import gateway_pb2, gateway_pb2_grpc
from tests.reliability.support import LONG_PROMPT, Stack

pytestmark = pytest.mark.slow

KEY_A, KEY_B = "sk-tenant-a-31c9", "sk-tenant-b-77e2"


@pytest.fixture(scope="module")
def stack(tiny_pair, tmp_path_factory):
    target, draft = tiny_pair
    stack = Stack(target, draft, tmp_path_factory.mktemp("suffix-tenant-logs"), method="suffix",
                  gateway_args=["--api-keys", f"{KEY_A},{KEY_B}"],
                  draft_args=["--suffix-max-cached-tokens", "48", "--suffix-chain", "false"],
                  verifier_args=["--draft-ahead", "false", "--draft-timeout-ms", "10000"])
    yield stack
    stack.stop()


def _generate(stack, key: str, prompt: str) -> gateway_pb2.GenerateResponse:
    with grpc.insecure_channel(stack.gateway.address) as channel:
        return gateway_pb2_grpc.GatewayStub(channel).Generate(
            gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=32, num_speculative_tokens=4), timeout=120,
            metadata=(("authorization", f"Bearer {key}"),))


def _stats(reply: gateway_pb2.GenerateResponse) -> tuple[int, int, int]:
    return reply.speculation.num_draft_tokens, reply.speculation.num_accepted_tokens, reply.speculation.num_fallback_rounds


def test_tenant_bs_statistics_do_not_change_with_tenant_as_traffic(stack):
    first = _generate(stack, KEY_B, LONG_PROMPT)  # b's output enters b's cache
    repeat = _generate(stack, KEY_B, LONG_PROMPT)
    assert list(repeat.token_ids) == list(first.token_ids)
    assert repeat.speculation.num_accepted_tokens > first.speculation.num_accepted_tokens  # drafted from its cache
    for i in range(6):  # a's outputs, far over one tenant's budget
        _generate(stack, KEY_A, f"{LONG_PROMPT} number {i}: the quick brown fox")
    after = _generate(stack, KEY_B, LONG_PROMPT)
    assert list(after.token_ids) == list(first.token_ids)
    assert _stats(after) == _stats(repeat), (_stats(after), _stats(repeat))
    print(f"figure: tenant b's repeat (drafted, accepted, fallback rounds): {_stats(repeat)} before and "
          f"{_stats(after)} after tenant a's traffic; acceptance {repeat.speculation.acceptance_rate:.2f}")
