"""Shared helpers for the offline deployment checks (compose, k8s, Dockerfiles).

The validators are pinned in requirements.txt and run without network:
check-jsonschema (compose-spec schema vendored), kubectl (`kubectl kustomize`,
kustomize built in), kubernetes-validate (Kubernetes JSON schemas vendored) and
hadolint (static binary). A missing tool FAILS the test with an install hint; it
never turns into a silent pass.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PYTHON = sys.executable

# Entry points the deployment may run, and nothing else.
KNOWN_MODULES = {"gateway", "verifier_service", "draft_service", "specdec.modeling.fetch_model", "specdec.runtime.health_probe"}
# Default gRPC / metrics ports (the product's contract).
GRPC_PORTS = {"gateway": 50051, "verifier_service": 50052, "draft_service": 50053}
METRICS_PORTS = {"gateway": 9101, "verifier_service": 9102, "draft_service": 9103}
# SPECDEC_* variables that are read directly rather than through a --flag.
ENV_ONLY = {"SPECDEC_MODEL_CACHE", "SPECDEC_DEBUG"}


def tool(name: str) -> str:
    """Path of a CLI installed by requirements.txt (venv bin first, then PATH)."""
    candidate = Path(PYTHON).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    pytest.fail(f"{name} not found: install the dev tools with `make setup`", pytrace=False)


def run(cmd: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, **kw)


def python_module_of(command) -> str | None:
    """`X` from a command that runs `python -m X` (list form or an `sh -c` string)."""
    if command is None:
        return None
    text = command if isinstance(command, str) else " ".join(str(c) for c in command)
    m = re.search(r"\bpython3?\s+-m\s+([A-Za-z_][\w.]*)", text)
    return m.group(1) if m else None


def runnable(module: str) -> bool:
    """True when `python -m module` has something to run (a module, or a package with __main__).

    Importing the parent packages is all this does; ImportError means "not written yet".
    """
    try:
        spec = importlib.util.find_spec(module)
        if spec is None:
            return False
        if spec.submodule_search_locations is not None:  # a package (maybe a namespace dir)
            return importlib.util.find_spec(module + ".__main__") is not None
        return True
    except ImportError:
        return False


@functools.cache
def module_help(module: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # Flags must not be satisfied by variables leaking in from the caller's shell.
    for key in list(env):
        if key.startswith("SPECDEC_"):
            del env[key]
    return run([PYTHON, "-m", module, "--help"], timeout=120, cwd=REPO, env=env)


def prefetch_help(modules) -> None:
    """Run the `--help` of several entry points in parallel (each may import torch)."""
    todo = [m for m in set(modules) if runnable(m)]
    with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
        list(pool.map(module_help, todo))


def help_flags(help_text: str) -> dict[str, list[str] | None]:
    """--flag -> its choices (or None) from argparse --help output."""
    flags: dict[str, list[str] | None] = {}
    for m in re.finditer(r"(--[a-z0-9][a-z0-9-]*)(?:[ =](\{[^}]*\}|[A-Z_]+))?", help_text):
        flag, arg = m.group(1), m.group(2)
        choices = arg[1:-1].split(",") if arg and arg.startswith("{") else None
        if flag not in flags or (choices and flags[flag] is None):
            flags[flag] = choices
    return flags


def env_to_flag(var: str) -> str:
    return "--" + var[len("SPECDEC_") :].lower().replace("_", "-")


def resolve_default(value) -> str:
    """Compose interpolation `${VAR:-default}` / `${VAR-default}` -> default; `${VAR}` -> ''."""
    text = "" if value is None else str(value)
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", text)


def check_env_against_help(module: str, env: dict[str, str], where: str) -> list[str]:
    """Every SPECDEC_X must be a --x flag of `module`, with a value among its choices."""
    problems = []
    result = module_help(module)
    if result.returncode != 0:
        return [f"{where}: `python -m {module} --help` exited {result.returncode}: {result.stderr.strip()[-400:]}"]
    flags = help_flags(result.stdout)
    for var, value in env.items():
        if not var.startswith("SPECDEC_") or var in ENV_ONLY:
            continue
        flag = env_to_flag(var)
        if flag not in flags:
            problems.append(f"{where}: {var} is not a flag of {module} (no {flag} in --help)")
            continue
        choices = flags[flag]
        if choices and value is not None and resolve_default(value) not in choices:
            problems.append(f"{where}: {var}={value!r} is not one of {choices}")
    return problems


def exposure_problems(name: str, env: dict) -> list[str]:
    """An internal service (verifier, draft) in a container listens beyond loopback, which is not its default
    (other containers could not reach it otherwise), and so needs the internal token, never --insecure."""
    from specdec.runtime.loopback import is_loopback_host

    problems = []
    host = resolve_default(env.get("SPECDEC_HOST"))
    if not host or is_loopback_host(host):
        problems.append(f"{name}: SPECDEC_HOST must be a non-loopback address such as [::] (got {host!r}): the "
                        "internal services listen on loopback unless told otherwise, out of other containers' reach")
    if not resolve_default(env.get("SPECDEC_INTERNAL_TOKEN_FILE")):
        problems.append(f"{name}: SPECDEC_INTERNAL_TOKEN_FILE must be set: without it, a non-loopback bind refuses "
                        "to start")
    if resolve_default(env.get("SPECDEC_INSECURE")).strip().lower() in {"1", "true", "yes", "on"}:
        problems.append(f"{name}: SPECDEC_INSECURE must not be set: the token authenticates the peers")
    return problems


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
