"""Fault injection is refused unless asked for, and works when it is."""

import pytest

from draft_service.config import DraftConfig
from draft_service.faults import inject_ahead_fault, inject_draft_token
from specdec.runtime import config as specdec_config
from specdec.v1 import draft_pb2


@pytest.mark.parametrize("fault", [{"inject_delay_ms": 5.0}, {"inject_ahead_fault": "flood"}])
def test_a_fault_without_enable_fault_injection_is_refused(fault):
    with pytest.raises(ValueError, match="--enable-fault-injection"):
        DraftConfig(**fault)
    assert DraftConfig(enable_fault_injection=True, **fault)


def test_the_flag_refusal_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exited:
        specdec_config.parse([DraftConfig], "draft", ["--inject-delay-ms", "5"])
    assert exited.value.code == 2
    assert "--enable-fault-injection" in capsys.readouterr().err


def test_suffix_checks_still_run_beside_the_fault_checks():
    with pytest.raises(ValueError, match="--suffix-max-depth"):
        DraftConfig(suffix_max_depth=1)


def test_a_flood_sends_sixteen_extra_mis_tagged_blocks():
    message = draft_pb2.ProposeResponse(token_ids=[1, 2])
    sent = inject_ahead_fault("flood", message, vocab_size=10)
    assert len(sent) == 17 and all(m.ahead.keep_length == 1 for m in sent[1:])
    assert inject_ahead_fault("wrong_tokens", draft_pb2.ProposeResponse(token_ids=[9]), 10)[0].token_ids == [0]


def test_inject_draft_token_replaces_every_token_and_drops_q_and_forced():
    with pytest.raises(ValueError, match="--enable-fault-injection"):
        DraftConfig(inject_draft_token=5)
    message = draft_pb2.ProposeResponse(token_ids=[1, 2, 3], probs=b"\0" * 12, num_forced=2, num_chained=1)
    sent = inject_draft_token(7, message)
    assert list(sent.token_ids) == [7, 7, 7] and sent.probs == b"" and sent.num_forced == sent.num_chained == 0
    assert list(inject_draft_token(-1, draft_pb2.ProposeResponse(token_ids=[1])).token_ids) == [1]
