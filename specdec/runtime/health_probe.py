"""Minimal gRPC health probe: ``python -m specdec.runtime.health_probe --addr HOST:PORT``.

Calls ``grpc.health.v1.Health/Check`` once and exits 0 only when the answer is
SERVING. Anything else (NOT_SERVING, SERVICE_UNKNOWN, connection refused,
deadline, TLS failure, bad arguments) prints one line to stderr and exits non-zero,
never a stack trace. Used by the docker-compose healthchecks and the Kubernetes
exec probes of the TLS overlay (native ``grpc:`` probes cannot speak TLS).

Exit codes: 0 SERVING, 1 reachable but not serving, 2 usage / bad TLS files,
3 unreachable / RPC error.

TLS: ``--tls-ca`` turns TLS on and verifies the server with that CA;
``--tls-cert``/``--tls-key`` add a client certificate (mTLS); ``--tls-server-name``
overrides the name checked against the server certificate (needed when probing
``localhost`` while the certificate names the service). Each flag also reads
``SPECDEC_PROBE_<FLAG>`` from the environment.
"""

from __future__ import annotations

import argparse
import os
import sys

EXIT_SERVING = 0
EXIT_NOT_SERVING = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"SPECDEC_PROBE_{name}", default)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m specdec.runtime.health_probe",
        description="Exit 0 only if the gRPC health service reports SERVING.",
    )
    p.add_argument("--addr", default=_env("ADDR"), help="HOST:PORT of the gRPC server (required)")
    p.add_argument(
        "--service",
        default=_env("SERVICE", ""),
        help='service name to check; "" (default) is the whole server',
    )
    p.add_argument("--timeout", type=float, default=float(_env("TIMEOUT", "3")), help="seconds (default 3)")
    p.add_argument("--tls-ca", default=_env("TLS_CA"), help="CA bundle; enables TLS")
    p.add_argument("--tls-cert", default=_env("TLS_CERT"), help="client certificate (mTLS)")
    p.add_argument("--tls-key", default=_env("TLS_KEY"), help="client private key (mTLS)")
    p.add_argument("--tls-server-name", default=_env("TLS_SERVER_NAME"), help="expected server name (SNI)")
    args = p.parse_args(argv)
    if not args.addr:
        p.error("--addr HOST:PORT is required")
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert and --tls-key must be given together")
    if (args.tls_cert or args.tls_server_name) and not args.tls_ca:
        p.error("--tls-cert/--tls-server-name need --tls-ca")
    if args.timeout <= 0:
        p.error("--timeout must be > 0")
    return args


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _fail(code: int, msg: str) -> int:
    print(f"health_probe: {msg}", file=sys.stderr)
    return code


def probe(args: argparse.Namespace) -> int:
    # gRPC core logs handshake failures itself; keep the output to our one line.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = args.addr
    if args.tls_ca:
        try:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(args.tls_ca),
                private_key=_read(args.tls_key) if args.tls_key else None,
                certificate_chain=_read(args.tls_cert) if args.tls_cert else None,
            )
        except OSError as e:
            return _fail(EXIT_USAGE, f"cannot read TLS file: {e.filename}: {e.strerror}")
        options = []
        if args.tls_server_name:
            options.append(("grpc.ssl_target_name_override", args.tls_server_name))
        channel = grpc.secure_channel(target, creds, options=options)
    else:
        channel = grpc.insecure_channel(target)

    what = f"{target} service={args.service!r}"
    try:
        with channel:
            stub = health_pb2_grpc.HealthStub(channel)
            resp = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service),
                timeout=args.timeout,
                wait_for_ready=False,
            )
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else None
        details = (e.details() if hasattr(e, "details") else "") or ""
        details = " ".join(str(details).split())[:300]
        name = code.name if code is not None else "UNKNOWN_ERROR"
        if code == grpc.StatusCode.NOT_FOUND:
            return _fail(EXIT_NOT_SERVING, f"{what}: SERVICE_UNKNOWN ({details or 'not registered'})")
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return _fail(EXIT_NOT_SERVING, f"{what}: server does not implement grpc.health.v1")
        return _fail(EXIT_UNREACHABLE, f"{what}: RPC failed: {name}: {details}")
    except ValueError as e:  # malformed target and the like
        return _fail(EXIT_USAGE, f"{what}: {e}")

    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    if resp.status == health_pb2.HealthCheckResponse.SERVING:
        print(f"health_probe: {what}: SERVING")
        return EXIT_SERVING
    return _fail(EXIT_NOT_SERVING, f"{what}: {status}")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        return probe(args)
    except KeyboardInterrupt:
        return _fail(EXIT_UNREACHABLE, "interrupted")
    except Exception as e:  # noqa: BLE001 (the contract is one line, never a traceback)
        return _fail(EXIT_UNREACHABLE, f"{args.addr}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    sys.exit(main())
