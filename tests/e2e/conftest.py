"""The three services as real processes on free ports, over tiny seeded models."""

import grpc
import pytest

from specdec.stack import running_stack
from specdec.v1 import gateway_pb2_grpc


@pytest.fixture(scope="module", params=["ngram", "model"])
def stack(request, tiny_pair, tmp_path_factory):
    """(method, services, Gateway stub) for each proposer."""
    target, draft = tiny_pair
    with running_stack(target, draft, method=request.param, log_dir=tmp_path_factory.mktemp("logs")) as services:
        channel = grpc.insecure_channel(services["gateway"].address)
        yield request.param, services, gateway_pb2_grpc.GatewayStub(channel)
        channel.close()
