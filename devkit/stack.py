"""Run the three services as real child processes: for `make run`, the benchmark and end-to-end tests.

Each service gets a port (free ones by default), a log file, and is waited on
until grpc.health.v1 says SERVING. Stopping sends SIGTERM, which each service
answers with health NOT_SERVING, a drain of in-flight calls, then exit.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import random
import socket
import subprocess
import sys
import time
import typing

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
# What the services run with unless the caller's environment says otherwise: the configuration the benchmark
# measures. OpenMP threads that spin while waiting (the default policy) starve the other services on a shared
# CPU host (each service's idle threads spin on the cores the others need); the Dockerfiles set the same.
SERVICE_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


_HANDED_OUT: set[int] = set()


def _ephemeral_low(default: int = 32768) -> int:
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def free_port() -> int:
    """A port no one listens on now, and that an outgoing connection will not take before the service binds it.

    A port the kernel hands out for bind(0) comes from the ephemeral range, the same range every client
    connection's local port comes from: between this check and the service's bind, a test's own gRPC channel
    could take it ("Address already in use", seen in CI). So ports come from below that range, at random, split
    by pytest-xdist worker so two workers never draw the same one, and never twice from one process.
    """
    low = _ephemeral_low()
    span_low, span_high = 15000, low - 1
    if span_high - span_low < 2000:  # an unusual range: fall back on the kernel's choice
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    width = (span_high - span_low) // workers
    start = span_low + (index % workers) * width
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(start, start + width)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port found in {start}-{start + width}")


def wait_serving(address: str, timeout_s: float = 60.0, process: subprocess.Popen | None = None,
                 credentials=None) -> None:
    """Block until grpc.health.v1 says SERVING, or raise with the process's exit status."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from specdec.runtime.grpc_server import RECONNECT_OPTIONS  # a service is seen when it is up, not a long backoff later

    deadline = time.monotonic() + timeout_s
    channel = (grpc.secure_channel(address, credentials, options=RECONNECT_OPTIONS) if credentials
               else grpc.insecure_channel(address, options=RECONNECT_OPTIONS))
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"{' '.join(map(str, process.args[:3]))} exited with {process.returncode} "
                                   "before serving")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{address} was not SERVING within {timeout_s} s")
    finally:
        channel.close()


class Service:
    """One service as a real child process on a free port."""

    def __init__(self, module: str, args: list[str], env: dict | None = None, log_dir: pathlib.Path | None = None,
                 port: int = 0, metrics_port: int = 0, python: str | None = None, launcher: typing.Sequence[str] = ()):
        """launcher: a command the service runs under, e.g. ["taskset", "-c", "1"]."""
        self.module = module
        self.port = port or free_port()
        self.metrics_port = metrics_port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = (log_dir or pathlib.Path(os.environ.get("TMPDIR", "/tmp"))) / f"{module}-{self.port}.log"
        python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        full_env = {**SERVICE_ENV_DEFAULTS, **os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": python_path,
                    **(env or {})}
        if module == "gateway" and not any(a.startswith("--http-port") for a in args):
            args = [*args, "--http-port", str(free_port())]  # never the fixed default: stacks run side by side
        self.http_port = next((int(b) for a, b in zip(args, args[1:]) if a == "--http-port"), None)
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [*launcher, python or sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(self.port),
             "--metrics-port", str(self.metrics_port), *args],
            cwd=REPO_ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@contextlib.contextmanager
def running_stack(target_dir, draft_dir=None, method: str = "ngram", verifier_args=(), draft_args=(), gateway_args=(),
                  env: dict | None = None, log_dir=None, timeout_s: float = 120.0, ports: dict | None = None,
                  verifier_python: str | None = None, verifiers: int = 1, drafts: int = 1):
    """Start draft, verifier and gateway as real processes; yield them as a dict; stop them after.

    ports: optional {"draft": (grpc, metrics), "verifier": (...), "gateway": (...), "gateway_http": port};
    free ports otherwise.
    verifier_python: the interpreter for the verifier (the vLLM engine lives in .venv-vllm).
    verifiers: how many verifiers, all behind the one gateway ("verifier", then "verifier2", "verifier3", ...).
    drafts: how many draft replicas ("draft", then "draft2", ...): every verifier's --draft lists them all (a draft
    tier); the gateway checks its tokenizer against the first.
    """
    services = {}
    ports = ports or {}
    try:
        from draft_service.config import MODEL_METHODS

        draft_model = str(draft_dir if method in MODEL_METHODS else target_dir)
        draft_names = ["draft", *(f"draft{i}" for i in range(2, drafts + 1))]
        for name in draft_names:
            services[name] = Service("draft_service", ["--model", draft_model, "--method", method, *draft_args],
                                     env, log_dir, *ports.get(name, (0, 0)))
        draft_tier = ",".join(services[name].address for name in draft_names)
        names = ["verifier", *(f"verifier{i}" for i in range(2, verifiers + 1))]
        for name in names:
            services[name] = Service(
                "verifier_service", ["--model", str(target_dir), "--draft", draft_tier, *verifier_args],
                env, log_dir, *ports.get(name, (0, 0)), python=verifier_python)
        http = ["--http-port", str(ports["gateway_http"])] if "gateway_http" in ports else []
        # The gateway starts beside the verifier and waits for it: as long as this waits for all three (a vLLM
        # verifier on a loaded machine can take longer than the gateway's default 60 s); gateway_args may override it.
        services["gateway"] = Service(
            "gateway", ["--model", str(target_dir), "--verifier", ",".join(services[n].address for n in names),
                        "--draft", services["draft"].address, "--peer-wait-s", str(timeout_s), *http, *gateway_args],
            env,
            log_dir, *ports.get("gateway", (0, 0)))
        for service in services.values():
            try:
                wait_serving(service.address, timeout_s, service.process)
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"{exc}\n--- {service.module} log ---\n{service.log()[-3000:]}") from exc
        yield services
    finally:
        stop_all(list(services.values()))


def stop_all(services: list[Service], timeout_s: float = 10.0) -> None:
    """SIGTERM every service at once (each drains on its own), then wait for each."""
    for service in services:
        if service.process.poll() is None:
            service.process.terminate()
    for service in reversed(services):
        service.stop(timeout_s)


def parse_metrics(text: str) -> dict[tuple[str, tuple], float]:
    """A /metrics page -> {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scrape_metrics(port: int, timeout_s: float = 10.0) -> dict[tuple[str, tuple], float]:
    """GET a service's /metrics -> {(sample name, sorted labels): value}."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as reply:
        return parse_metrics(reply.read().decode())
