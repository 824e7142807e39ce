"""The three services as real processes on free ports, over tiny seeded models."""

import shutil

import grpc
import pytest

from devkit.stack import running_stack
from specdec.v1 import gateway_pb2_grpc


# "METHOD:VARIANT" stacks: pipelined drafting off, or every block drafted ahead deliberately wrong
VARIANTS = {"": ([], []), "serial": ([], ["--draft-ahead", "false"]),
            "wrong_ahead": (["--enable-fault-injection", "true", "--inject-ahead-fault", "wrong_tokens"], [])}


@pytest.fixture(scope="session", params=["ngram", "model"])
def stack(request, tiny_pair, tmp_path_factory):
    """(method, services, Gateway stub) for each proposer (param "METHOD" or "METHOD:VARIANT"). Session-scoped:
    pytest groups the tests of every module by stack, so each stack starts once."""
    target, draft = tiny_pair
    method, _, variant = request.param.partition(":")
    draft_args, verifier_args = VARIANTS[variant]
    draft_args = ["--propose-ahead", "always", *draft_args]  # the model draft pipelines too (default: cheap only)
    with running_stack(target, draft, method=method, draft_args=draft_args, verifier_args=verifier_args,
                       log_dir=tmp_path_factory.mktemp("logs")) as services:
        channel = grpc.insecure_channel(services["gateway"].address)
        yield request.param, services, gateway_pb2_grpc.GatewayStub(channel)
        channel.close()


# SmolLM2's template is ChatML; the tiny test tokenizer has none, so the tests that chat give it this one.
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="session")
def chat_target(tiny_pair, tmp_path_factory):
    """A copy of the tiny target whose tokenizer has a ChatML chat template."""
    from transformers import AutoTokenizer

    target = tmp_path_factory.mktemp("chat") / "tiny-target-chat"
    shutil.copytree(tiny_pair[0], target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(target)
    return target
