"""Helpers for the reliability tests: processes, metrics, RSS, certificates, an OTLP receiver.

Everything runs on loopback. Services are real child processes (devkit.stack.Service);
`Stack` starts the three of them, optionally over TLS, and waits for grpc.health.v1.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import ipaddress
import pathlib
import re
import threading
import time
import urllib.request

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from devkit.stack import Service, free_port, stop_all, wait_serving
from draft_service.config import MODEL_METHODS

API_KEY = "sk-reliability-7f3c1e9a0b5d"  # a canary: it must never show up in a log or a span
PROMPT_CANARY = "Canary prompt: zebra quasar marmalade"  # likewise, by default
# One torch thread per service: three processes on two cores otherwise spend their time spinning.
SERVICE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
# "Hello" runs to max_tokens on the tiny target without hitting EOS (greedy), so it makes long requests.
LONG_PROMPT = "Hello"


# ---------------------------------------------------------------- processes


class Stack:
    """draft -> verifier -> gateway as real processes on free ports; TLS when `tls` (a Certs) is given."""

    def __init__(self, target_dir, draft_dir, log_dir: pathlib.Path, method: str = "model", verifier_args=(),
                 draft_args=(), gateway_args=(), env: dict | None = None, tls: Certs | None = None,
                 timeout_s: float = 240.0):
        self.target_dir, self.draft_dir, self.method = str(target_dir), str(draft_dir), method
        self.log_dir, self.tls, self.timeout_s = log_dir, tls, timeout_s
        self.env = {**SERVICE_ENV, **(env or {})}
        self.draft_args = list(draft_args)
        self.services: dict[str, Service] = {}
        tls_args = tls.service_args() if tls else []
        try:
            self.services["draft"] = self._draft(self.draft_args)
            self.verifier_args = list(verifier_args)
            self.services["verifier"] = self._verifier(self.target_dir, self.verifier_args)
            self.services["gateway"] = Service(
                "gateway", ["--model", self.target_dir, "--verifier", self.verifier.address, "--draft",
                            self.draft.address, "--grace-s", "1", *tls_args, *gateway_args], self.env, log_dir)
            for service in self.services.values():
                self.wait(service)
        except BaseException:
            self.stop()
            raise

    def _draft(self, args, port: int = 0, metrics_port: int = 0) -> Service:
        model = self.draft_dir if self.method in MODEL_METHODS else self.target_dir
        tls_args = self.tls.service_args() if self.tls else []
        return Service("draft_service", ["--model", model, "--method", self.method, "--grace-s", "1", *tls_args,
                                         *args], self.env, self.log_dir, port, metrics_port)

    def _verifier(self, model, args, port: int = 0, metrics_port: int = 0, draft: bool = True) -> Service:
        tls_args = self.tls.service_args() if self.tls else []
        peer = ["--draft", self.draft.address] if draft else []
        return Service("verifier_service", ["--model", str(model), *peer, "--threads", "1", "--grace-s", "1",
                                            *tls_args, *args], self.env, self.log_dir, port, metrics_port)

    def replace_verifier(self, model=None) -> Service:
        """A new verifier process on the SAME ports, serving `model` (default: the target; another model runs
        without the draft, which would not pair with it)."""
        old = self.verifier
        old.stop()
        time.sleep(0.2)
        self.services["verifier"] = self._verifier(model or self.target_dir, self.verifier_args, old.port,
                                                   old.metrics_port, draft=model is None)
        self.wait(self.verifier)
        return self.verifier

    def restart_draft(self, args=None) -> Service:
        """A new draft process on the SAME ports (the verifier reconnects to the same address)."""
        old = self.draft
        if old.process.poll() is None:
            old.kill()
        old.stop()
        time.sleep(0.2)
        self.services["draft"] = self._draft(self.draft_args if args is None else args, old.port, old.metrics_port)
        self.wait(self.draft)
        return self.draft

    def wait(self, service: Service) -> None:
        try:
            wait_serving(service.address, self.timeout_s, service.process,
                         credentials=self.tls.client_credentials() if self.tls else None)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}\n--- {service.module} log ---\n{service.log()[-3000:]}") from exc

    @property
    def draft(self) -> Service:
        return self.services["draft"]

    @property
    def verifier(self) -> Service:
        return self.services["verifier"]

    @property
    def gateway(self) -> Service:
        return self.services["gateway"]

    def logs(self) -> str:
        return "\n".join(service.log() for service in self.services.values())

    def stop(self) -> None:
        stop_all(list(self.services.values()))


def wait_exit(process, timeout_s: float) -> int | None:
    try:
        return process.wait(timeout_s)
    except Exception:  # noqa: BLE001 (subprocess.TimeoutExpired)
        return None


# ---------------------------------------------------------------- metrics and memory


def scrape(service: Service) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{service.metrics_port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def gauge(service: Service, name: str = "specdec_live_sequences") -> float:
    match = re.search(rf"^{name} (\S+)$", scrape(service), re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


def counter(service: Service, name: str) -> float:
    """Sum of all samples of a counter (every label set)."""
    samples = re.findall(rf"^{name}_total(?:{{[^}}]*}})? (\S+)$", scrape(service), re.MULTILINE)
    return sum(float(v) for v in samples)


def wait_for(predicate, timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


def rss_mib(pid: int) -> float:
    """VmRSS from /proc/PID/status, in MiB."""
    text = pathlib.Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE).group(1)) / 1024


# ---------------------------------------------------------------- TLS


class Certs:
    """A throwaway CA, one certificate for the services (SAN 127.0.0.1/localhost), and one from another CA."""

    def __init__(self, out_dir: pathlib.Path):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        self.dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)

        def name(common_name):
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

        def write(filename, data):
            path = out_dir / filename
            path.write_bytes(data)
            return path

        def pem_key(key):
            return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())

        def make_ca(common_name):
            key = ec.generate_private_key(ec.SECP256R1())
            cert = (x509.CertificateBuilder().subject_name(name(common_name)).issuer_name(name(common_name))
                    .public_key(key.public_key()).serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(minutes=5))
                    .not_valid_after(now + datetime.timedelta(days=1))
                    .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                    .sign(key, hashes.SHA256()))
            return key, cert

        def make_leaf(common_name, ca_key, ca_cert):
            key = ec.generate_private_key(ec.SECP256R1())
            cert = (x509.CertificateBuilder().subject_name(name(common_name)).issuer_name(ca_cert.subject)
                    .public_key(key.public_key()).serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(minutes=5))
                    .not_valid_after(now + datetime.timedelta(days=1))
                    .add_extension(x509.SubjectAlternativeName([
                        x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                        critical=False)
                    .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                          ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                    .sign(ca_key, hashes.SHA256()))
            return key, cert

        ca_key, ca_cert = make_ca("specdec test CA")
        key, cert = make_leaf("specdec-service", ca_key, ca_cert)
        rogue_ca_key, rogue_ca_cert = make_ca("some other CA")
        rogue_key, rogue_cert = make_leaf("intruder", rogue_ca_key, rogue_ca_cert)
        self.ca = write("ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM))
        self.cert = write("service.pem", cert.public_bytes(serialization.Encoding.PEM))
        self.key = write("service.key", pem_key(key))
        self.rogue_cert = write("rogue.pem", rogue_cert.public_bytes(serialization.Encoding.PEM))
        self.rogue_key = write("rogue.key", pem_key(rogue_key))

    def service_args(self) -> list[str]:
        return ["--tls-cert", str(self.cert), "--tls-key", str(self.key), "--tls-ca", str(self.ca)]

    def client_credentials(self, ca: bool = True, client_cert: str = "ours") -> grpc.ChannelCredentials:
        """ca: trust our CA (else the system roots); client_cert: "ours", "rogue" or "none"."""
        pair = {"ours": (self.key, self.cert), "rogue": (self.rogue_key, self.rogue_cert), "none": (None, None)}
        key, cert = pair[client_cert]
        return grpc.ssl_channel_credentials(
            self.ca.read_bytes() if ca else None,
            key.read_bytes() if key else None,
            cert.read_bytes() if cert else None,
        )


# ---------------------------------------------------------------- tracing


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """A minimal OTLP trace receiver on loopback that keeps the raw export requests (to grep them)."""

    def __init__(self):
        self.exports: list[bytes] = []
        self._lock = threading.Lock()
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request, context):
        with self._lock:
            self.exports.append(request.SerializeToString())
        return trace_service_pb2.ExportTraceServiceResponse()

    def env(self) -> dict:
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.port}",
                "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_BSP_SCHEDULE_DELAY": "200"}

    def raw(self) -> bytes:
        with self._lock:
            return b"".join(self.exports)

    def stop(self) -> None:
        self.server.stop(0)


class ApiKey(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer KEY` to every call of a sync channel."""

    def __init__(self, key: str):
        self.metadata = [("authorization", f"Bearer {key}")]

    def _details(self, details):
        return details._replace(metadata=list(details.metadata or []) + self.metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)


def authed_channel(address: str, key: str = API_KEY, options=None) -> grpc.Channel:
    return grpc.intercept_channel(grpc.insecure_channel(address, options=options), ApiKey(key))


__all__ = [
    "API_KEY",
    "LONG_PROMPT",
    "PROMPT_CANARY",
    "ApiKey",
    "Certs",
    "OtlpReceiver",
    "Service",
    "Stack",
    "authed_channel",
    "counter",
    "free_port",
    "gauge",
    "rss_mib",
    "scrape",
    "wait_exit",
    "wait_for",
]
