"""The structured-outputs error table through the official openai client, against the three real processes (tiny
seeded models, the transformers engine): a bad schema, an unsupported keyword, an oversized schema (twice the
limit, and 1 MB), a regex and a grammar that do not compile, and two malformed requests are each a 400 whose
message names the problem (the 1 MB body is larger than any request the tiny model's 512-token context can take,
so it is a 413 refused unread; on SmolLM2 it reaches the gateway's size check and is the same 400), on /v1/completions and, for schemas, on /v1/chat/completions with the client's own
response_format argument. An oversized schema is refused without compiling: fast; a schema under the size cap whose
compile would take about a minute (2,000 optional properties) is refused at the compile deadline (2 s here); the
stack serves after."""

from __future__ import annotations

import json

import openai
import pytest

from devkit.stack import running_stack
from tools.structured_errors import cases, probe

pytestmark = pytest.mark.slow

CASES = cases()
COMPILE_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def base(chat_target, tiny_pair, tmp_path_factory):
    with running_stack(chat_target, tiny_pair[1], method="ngram", log_dir=tmp_path_factory.mktemp("logs"),
                       verifier_args=["--grammar-compile-timeout-s", str(COMPILE_TIMEOUT_S)],
                       timeout_s=240) as services:
        yield f"http://127.0.0.1:{services['gateway'].http_port}/v1", str(chat_target)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_bad_constraint_is_a_400_naming_the_problem(base, case):
    endpoints = [False, True] if set(case.extra_body) == {"response_format"} else [False]
    for chat in endpoints:
        row = probe(*base, case, chat=chat)
        if case.unread is None or row["status"] != 413:
            assert row["status"] == 400, row
            assert case.named in row["message"], row
            assert row["param"] == case.param, row
        assert row["ok"], row
        if "oversized" in case.name:
            assert row["seconds"] < 5, row  # refused by size, before any compile
        if "too complex" in case.name:
            assert COMPILE_TIMEOUT_S <= row["seconds"] < COMPILE_TIMEOUT_S + 30, row  # at the deadline, not after


def test_the_stack_serves_a_good_schema_after_the_errors(base):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    client = openai.OpenAI(base_url=base[0], api_key="none", max_retries=0, timeout=120)
    out = client.completions.create(model=base[1], prompt="Hello", max_tokens=16, temperature=0, extra_body={
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}})
    assert json.loads(out.choices[0].text) in ({"ok": True}, {"ok": False})
