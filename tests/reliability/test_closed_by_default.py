"""Closed by default, through the real processes: a bare draft and verifier listen on loopback only; a
non-loopback bind without the internal token refuses to start (exit 2, one line) unless --insecure, which then
ignores a tenant from other machines; with the token, a raw Propose without it is UNAUTHENTICATED.

Each service is started as `python -m X` with only what the case needs (port 0: the log names the port).
"""

from __future__ import annotations

import ipaddress
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import grpc
import pytest

from specdec.runtime.loopback import is_loopback_host
from devkit.stack import REPO_ROOT
from specdec.v1 import draft_pb2, draft_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.reliability.support import SERVICE_ENV, wait_exit
from tests.specdec.runtime.test_loopback import non_loopback_address

pytestmark = pytest.mark.slow

TOKEN = "internal-5e8b2d7a9c1f4036b2e1"
SERVING = re.compile(r"serving on port (\d+)")
REFUSAL = "refusing to serve on --host"
TENANT_IGNORED = "set a tenant, but nothing authenticates it"


class Process:
    """`python -m module args` with its output in a file; `port` once its log says where it serves."""

    def __init__(self, module: str, args: list[str], log_dir: pathlib.Path, env: dict | None = None):
        self.log_path = log_dir / f"{module}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in stop)
        self.args = [sys.executable, "-m", module, "--metrics-port", "-1", *args]
        # the caller's SPECDEC_* must not decide the case
        base = {k: v for k, v in os.environ.items() if not k.startswith("SPECDEC_")}
        self.process = subprocess.Popen(self.args, cwd=REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                        env={**base, **SERVICE_ENV, "PYTHONUNBUFFERED": "1", **(env or {})})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def serving(self, timeout_s: float = 90.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = SERVING.search(self.log())
            if match:
                return int(match.group(1))
            assert self.process.poll() is None, f"exited with {self.process.returncode}:\n{self.log()[-2000:]}"
            time.sleep(0.1)
        raise TimeoutError(f"not serving after {timeout_s} s:\n{self.log()[-2000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            if wait_exit(self.process, 15) is None:
                self.process.kill()
                self.process.wait()
        self._log.close()


@pytest.fixture
def start(tmp_path):
    started = []

    def start_process(module: str, args: list[str], env: dict | None = None) -> Process:
        started.append(Process(module, args, tmp_path, env))
        return started[-1]

    yield start_process
    for process in started:
        process.stop()


def listening_addresses(port: int) -> set[str]:
    """Every local address a TCP socket listens on at `port`, from /proc/net/tcp and tcp6."""
    found = set()
    for table, width in (("tcp", 4), ("tcp6", 16)):
        path = pathlib.Path("/proc/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].split(":")
            if fields[3] != "0A" or int(port_hex, 16) != port:
                continue
            raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            address = ipaddress.ip_address(raw[:width])
            found.add(str(getattr(address, "ipv4_mapped", None) or address))
    return found


def refuses_connection(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        return sock.connect_ex((address, port)) != 0


@pytest.fixture(scope="module")
def outside() -> str:
    address = non_loopback_address()
    if not address:
        pytest.skip("this machine has no non-loopback address to call from")
    return address


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("secrets") / "internal-token"
    path.write_text(TOKEN + "\n")
    return path


def test_a_default_draft_and_verifier_listen_on_loopback_only(tiny_pair, start, outside):
    target, _ = tiny_pair
    draft = start("draft_service", ["--model", str(target), "--method", "ngram", "--port", "0"])
    verifier = start("verifier_service", ["--model", str(target), "--port", "0", "--threads", "1"])
    for name, process in (("draft", draft), ("verifier", verifier)):
        port = process.serving()
        bound = listening_addresses(port)
        line = next(line for line in process.log().splitlines() if SERVING.search(line))
        print(f"figure: default {name}: {line}; listening on {sorted(bound)}; "
              f"{outside}:{port} refuses connections: {refuses_connection(outside, port)}")
        assert bound and all(is_loopback_host(address) for address in bound), bound
        assert refuses_connection(outside, port)
        assert f"serving on port {port} at 127.0.0.1 (loopback only)" in process.log()


@pytest.mark.parametrize("module", ["draft_service", "verifier_service"])
@pytest.mark.parametrize("how", [["--host", "[::]"], ["--host", "0.0.0.0"], "env"], ids=["[::]", "0.0.0.0", "env"])
def test_a_non_loopback_bind_without_a_token_refuses_to_start(tiny_pair, start, module, how):
    target, _ = tiny_pair
    args, env = (how, None) if how != "env" else ([], {"SPECDEC_HOST": "[::]"})
    process = start(module, ["--model", str(target), "--port", "0", *args], env)
    started = time.monotonic()
    assert wait_exit(process.process, 60) == 2, process.log()[-2000:]
    log = process.log()
    lines = [line for line in log.splitlines() if line.strip()]
    print(f"figure: {module} {how}: exit 2 after {time.monotonic() - started:.1f} s: {lines[-1]}")
    assert len(lines) == 1 and REFUSAL in lines[0] and "--internal-token-file" in lines[0] \
        and "--insecure" in lines[0], log
    assert "Traceback" not in log


def test_insecure_starts_and_ignores_a_tenant_from_another_machine(tiny_pair, start, outside):
    target, _ = tiny_pair
    verifier = start("verifier_service", ["--model", str(target), "--port", "0", "--threads", "1", "--host", "[::]",
                                          "--insecure"])
    port = verifier.serving()
    assert "--insecure: serving on --host [::] without authenticating callers" in verifier.log()
    request = verifier_pb2.DecodeRequest(prompt_token_ids=[5, 6, 7], max_tokens=2, tenant="tenant-a")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        assert list(verifier_pb2_grpc.VerifierServiceStub(channel).Decode(request, timeout=60))
    assert TENANT_IGNORED not in verifier.log()  # loopback: trusted
    with grpc.insecure_channel(f"{outside}:{port}") as channel:
        for _ in range(2):
            assert list(verifier_pb2_grpc.VerifierServiceStub(channel).Decode(request, timeout=60))
    ignored = [line for line in verifier.log().splitlines() if TENANT_IGNORED in line]
    print(f"figure: Decode with a tenant from {outside}: served, tenant dropped: {ignored}")
    assert len(ignored) == 1 and "tenant-a" not in ignored[0], ignored


def test_with_the_token_a_raw_propose_without_it_is_unauthenticated(tiny_pair, start, outside, token_file):
    target, _ = tiny_pair
    draft = start("draft_service", ["--model", str(target), "--method", "suffix", "--port", "0", "--host", "[::]",
                                    "--internal-token-file", str(token_file)])
    port = draft.serving()
    assert "(reachable from other machines)" in draft.log()
    # the tokens of `{"name": "`, as in the issue: a stream that asks the draft to continue them
    start_message = draft_pb2.ProposeRequest(start=draft_pb2.StartSequence(
        request_id="raw", prompt_token_ids=[90, 1, 110, 97, 109, 101, 1, 58, 32, 1], tenant="tenant-a"))
    with grpc.insecure_channel(f"{outside}:{port}") as channel:
        with pytest.raises(grpc.RpcError) as raised:
            list(draft_pb2_grpc.DraftServiceStub(channel).Propose(iter([start_message]), timeout=30))
    print(f"figure: raw Propose to {outside}:{port} without the token: {raised.value.code().name}: "
          f"{raised.value.details()}")
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert TOKEN not in draft.log()
