"""One shared stack for the reliability tests that do not break it: model draft, API keys, spans to a receiver."""

from __future__ import annotations

import pytest

from tests.reliability.support import API_KEY, OtlpReceiver, Stack, authed_channel


@pytest.fixture(scope="session")
def otlp():
    receiver = OtlpReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def main_stack(tiny_pair, tmp_path_factory, otlp):
    """The three services over the tiny pair (model draft), auth on, gateway logging at DEBUG, traces exported."""
    target, draft = tiny_pair
    stack = Stack(target, draft, tmp_path_factory.mktemp("main-logs"), method="model", env=otlp.env(),
                  gateway_args=["--api-keys", f"other-key,{API_KEY}", "--log-level", "DEBUG"],
                  verifier_args=["--draft-timeout-ms", "2000"])
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def gateway_channel(main_stack):
    channel = authed_channel(main_stack.gateway.address)
    yield channel
    channel.close()
