"""Config as small dataclasses, exposed as CLI flags and environment variables.

Each field `foo_bar` becomes the flag `--foo-bar` and the variable
`SPECDEC_FOO_BAR`; a flag beats the variable, which beats the default. Field
metadata may carry `help` and `choices`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing

ENV_PREFIX = "SPECDEC_"


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _converter(annotation) -> typing.Callable[[str], object]:
    base = {"int": int, "float": float, "bool": _parse_bool, "str": str}
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    name = name.replace("typing.", "").split("|")[0].strip()
    return base.get(name, str)


def add_arguments(parser, config_type: type, defaults: dict | None = None) -> None:
    """Add one flag per field of the dataclass `config_type`."""
    for field in dataclasses.fields(config_type):
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        default = (defaults or {}).get(field.name, default)
        help_text = field.metadata.get("help", "")
        is_bool = _converter(field.type) is _parse_bool
        parser.add_argument(
            flag_name(field.name),
            dest=field.name,
            type=_converter(field.type),
            nargs="?" if is_bool else None,  # a bare `--insecure` means true; `--insecure false` still parses
            const=True if is_bool else None,
            default=None,
            choices=field.metadata.get("choices"),
            metavar=field.metadata.get("metavar"),
            help=f"{help_text} (env {env_name(field.name)}; default: {default!r})",
        )


def from_namespace(config_type: type, namespace: argparse.Namespace, parser: argparse.ArgumentParser,
                   defaults: dict | None = None):
    """Build the dataclass from flags, then environment variables, then defaults."""
    values = {name: value for name, value in (defaults or {}).items()
              if name in {field.name for field in dataclasses.fields(config_type)}}
    for field in dataclasses.fields(config_type):
        value = getattr(namespace, field.name, None)
        if value is None and env_name(field.name) in os.environ:
            raw = os.environ[env_name(field.name)]
            try:
                value = _converter(field.type)(raw)
            except (ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"{env_name(field.name)}={raw!r}: {exc}")
            choices = field.metadata.get("choices")
            if choices and value not in choices:
                parser.error(f"{env_name(field.name)}={raw!r}: choose from {', '.join(map(str, choices))}")
        if value is not None:
            values[field.name] = value
    try:
        return config_type(**values)
    except ValueError as exc:  # a dataclass's own cross-field checks (__post_init__)
        parser.error(str(exc))


def parse(config_types: list[type], description: str, argv: list[str] | None = None,
          defaults: dict | None = None, prog: str | None = None) -> list:
    """Parse argv into one instance of each config dataclass; `defaults` overrides field defaults by name."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for config_type in config_types:
        group = parser.add_argument_group(config_type.__doc__.strip().splitlines()[0] if config_type.__doc__ else None)
        add_arguments(group, config_type, defaults)
    namespace = parser.parse_args(argv)
    return [from_namespace(config_type, namespace, parser, defaults) for config_type in config_types]


def option(default, help: str, **metadata):  # noqa: A002 (mirrors argparse)
    """A dataclass field with a help text (and optional choices/metavar)."""
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """gRPC server, metrics, TLS and logging"""

    host: str = option("[::]", "address to listen on ([::] or 0.0.0.0: every interface); the internal services "
                               "(verifier, draft) listen on loopback unless told otherwise")
    port: int = option(0, "gRPC port (0 picks a free one and logs it)")
    metrics_port: int = option(-1, "Prometheus /metrics port (-1 turns it off)")
    tls_cert: str = option("", "PEM server certificate; with --tls-key, serves TLS")
    tls_key: str = option("", "PEM private key for --tls-cert")
    tls_ca: str = option("", "PEM CA: verifies peers and, unless --tls-require-client-cert false, requires "
                                 "client certificates (mTLS)")
    tls_require_client_cert: bool = option(True, "with --tls-ca, require client certificates on this server "
                                                 "(set false on the gateway for TLS-only public clients)")
    max_message_mb: int = option(16, "largest gRPC message accepted, in MiB")
    log_level: str = option("INFO", "logging level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    log_format: str = option("text", "log lines as text, or as one JSON object per line (either way, control "
                                     "characters in messages are escaped)", choices=["text", "json"])
    internal_token_file: str = option(
        "", "file holding the shared service-to-service token: this service sends it on every call to a peer, and "
            "the internal services (verifier, draft) then refuse calls without it (UNAUTHENTICATED); health "
            "checks stay open. Empty: no token", metavar="PATH")
    grace_s: float = option(5.0, "seconds to drain in-flight calls on shutdown")


@dataclasses.dataclass(frozen=True)
class InternalServiceConfig:
    """Exposure of an internal service (the verifier, the draft)"""

    insecure: bool = option(
        False, "serve on a non-loopback --host although callers are not authenticated (no --internal-token-file, "
               "no mTLS): anyone who can reach the port can then decode on this service and read what the draft "
               "learnt. Without it, such a bind refuses to start; a loopback --host needs neither")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Model, device and threads: what a service that runs a torch model needs (the verifier and the draft)"""

    model: str = option("", "model directory")
    device: str = option("cpu", "torch device", choices=["cpu", "cuda"])
    dtype: str = option("float32", "model dtype (equality with plain greedy is exact in float32)",
                        choices=["float32", "bfloat16", "float16"])
    threads: int = option(0, "torch CPU threads (0 keeps torch's default)")


def choices(config_type: type, name: str) -> list:
    """The allowed values of one option, for tools that offer the same flag."""
    return next(f.metadata["choices"] for f in dataclasses.fields(config_type) if f.name == name)


def model_dir(text: str) -> str:
    """argparse type of a tool's --model: a local model directory, checked before any work (exit 2, one line)."""
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory; pass a local model directory "
                                         "(run `make model` for the default SmolLM2-135M-Instruct)")
    if not os.path.isfile(os.path.join(text, "config.json")):
        raise argparse.ArgumentTypeError(f"{text!r} has no config.json, so it is not a model directory; run "
                                         "`make model` for the default SmolLM2-135M-Instruct")
    return text


def optional_model_dir(text: str) -> str:
    """model_dir, or "" for "none"."""
    return model_dir(text) if text else text
