"""specdec.runtime.targets: one reading of a fleet flag for every flag that names one (--verifier, --draft)."""

from __future__ import annotations

import pytest

from specdec.runtime.grpc_server import ConfigError
from specdec.runtime.targets import Targets, parse_targets


@pytest.mark.parametrize("flag,example", [("--verifier", "verifier-headless:50052"), ("--draft", "draft:50053")])
def test_a_refusal_names_the_flag_and_shows_its_example(flag, example):
    with pytest.raises(ConfigError, match=f"^{flag} 'dns:///x'.*dns:///{example}"):
        parse_targets("dns:///x", flag, example)
    with pytest.raises(ConfigError, match=f"^{flag} is empty"):
        parse_targets(" ", flag, example)


def test_the_forms_read_the_same_whatever_the_flag():
    assert parse_targets("a:1,b:2", "--draft", "d:1") == Targets(addresses=("a:1", "b:2"))
    assert parse_targets("dns:///draft:50053", "--draft", "d:1") == Targets(dns_host="draft", dns_port=50053)
