"""Hardening that needs no running service: the shipped deployments' internal auth (k8s NetworkPolicies and the
internal token from a Secret; compose's token job), the served OpenMP setting, the CLI's usage errors,
`--api-keys` that names no key, and what a seed promises."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from gateway.auth import parse_keys
from specdec.runtime.grpc_server import ConfigError
from devkit.stack import REPO_ROOT, SERVICE_ENV_DEFAULTS
from tests.deploy.test_k8s import KUSTOMIZATIONS, by_kind, render

DEPLOY = REPO_ROOT / "deploy"
TOKEN_FILE_VAR = "SPECDEC_INTERNAL_TOKEN_FILE"
PORTS = {"gateway": {"grpc": 50051, "http": 8000, "metrics": 9101}, "verifier": {"grpc": 50052, "metrics": 9102},
         "draft": {"grpc": 50053, "metrics": 9103}}


# ---------------------------------------------------------------- k8s: who can reach which port


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer_matches(peer: dict, source: dict) -> bool:
    """source: {"labels": ..., "where": "namespace" | "cluster" | "outside"}."""
    if "ipBlock" in peer:
        return True
    if source["where"] == "outside":
        return False
    if "namespaceSelector" in peer:  # ours only selects namespaces with {}: every namespace
        return "podSelector" not in peer or _selects(peer["podSelector"], source["labels"])
    return source["where"] == "namespace" and _selects(peer.get("podSelector") or {}, source["labels"])


def reachable(policies: list[dict], source: dict, target_labels: dict, port: int) -> bool:
    """Whether Kubernetes lets `source` open a connection to `port` of a pod with `target_labels`."""
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], target_labels)
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            ports = [p["port"] for p in rule.get("ports") or []]
            if ports and port not in ports:
                continue
            peers = rule.get("from")
            if not peers or any(_peer_matches(peer, source) for peer in peers):
                return True
    return False


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_network_policies_let_only_the_gateway_reach_the_verifier_and_only_the_verifier_reach_the_draft(name):
    docs = render(KUSTOMIZATIONS[name])
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    pods = {dname: d["spec"]["template"]["metadata"]["labels"] for dname, d in by_kind(docs, "Deployment").items()}
    sources = {**{dname: {"labels": labels, "where": "namespace"} for dname, labels in pods.items()},
               "another pod in the namespace": {"labels": {"app": "debug"}, "where": "namespace"},
               "a pod in another namespace (Prometheus)": {"labels": {"app": "prometheus"}, "where": "cluster"},
               "outside the cluster": {"labels": {}, "where": "outside"}}
    expected = {
        ("gateway", "grpc"): set(sources), ("gateway", "http"): set(sources),
        ("verifier", "grpc"): {"gateway"}, ("draft", "grpc"): {"verifier"},
        **{(dname, "metrics"): set(sources) - {"outside the cluster"} for dname in pods},
    }
    for (target, port_name), allowed in expected.items():
        port = PORTS[target][port_name]
        got = {s for s, source in sources.items() if reachable(policies, source, pods[target], port)}
        assert got == allowed, f"{target}:{port} ({port_name}) is reachable from {sorted(got)}"
        print(f"figure: {name}: {target}:{port} ({port_name}) <- {sorted(got)}")
    # and a port nobody declared stays closed
    assert not any(reachable(policies, s, pods["verifier"], 6379) for s in sources.values())


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_service_reads_the_internal_token_from_a_secret(name):
    docs = render(KUSTOMIZATIONS[name])
    secrets = by_kind(docs, "Secret")
    for dname, deployment in by_kind(docs, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        main = pod["containers"][0]
        path = next((e.get("value") for e in main.get("env") or [] if e["name"] == TOKEN_FILE_VAR), None)
        assert path, f"{dname}: {TOKEN_FILE_VAR} is not set"
        directory, _, key = path.rpartition("/")
        mount = next((m for m in main.get("volumeMounts") or [] if m["mountPath"].rstrip("/") == directory), None)
        assert mount and mount.get("readOnly"), f"{dname}: {directory} is not a read-only mount"
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        secret = secrets[volume["secret"]["secretName"]]
        assert key in (secret.get("stringData") or {}) | (secret.get("data") or {}), f"{dname}: no key {key}"


# ---------------------------------------------------------------- compose: the token too


@pytest.mark.parametrize("file", ["docker-compose.yml", "docker-compose.cpu.yml"])
def test_compose_makes_a_token_and_every_service_uses_it(file):
    data = yaml.safe_load((DEPLOY / file).read_text())
    services = data["services"]
    job = services["internal-token"]
    assert str(job.get("restart")) == "no"
    job_mount = next(v for v in job["volumes"] if v.startswith("internal-token:"))
    for name in ("gateway", "verifier", "draft"):
        service = services[name]
        path = service["environment"][TOKEN_FILE_VAR]
        directory = path.rpartition("/")[0]
        mounts = service.get("volumes") or []
        assert f"internal-token:{directory}:ro" in mounts, (name, mounts)
        assert job_mount.split(":")[1] == directory
        assert service["depends_on"]["internal-token"]["condition"] == "service_completed_successfully"
    assert "internal-token" in data["volumes"]


# ---------------------------------------------------------------- OpenMP: served as measured


def test_services_wait_passively_in_openmp_as_the_benchmark_measures():
    assert SERVICE_ENV_DEFAULTS["OMP_WAIT_POLICY"] == "PASSIVE"  # make run, tests: devkit/stack.py
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):  # compose and k8s
        text = (DEPLOY / dockerfile).read_text()
        assert re.search(r"^ENV (?:[^\n]*\\\n)*\s*OMP_WAIT_POLICY=PASSIVE\b", text, re.MULTILINE), dockerfile


# ---------------------------------------------------------------- the CLI and --api-keys


@pytest.mark.parametrize("flags", [["--max-tokens", "-1"], ["--seed", "-5"], ["--top-k", "99999999999"],
                                   ["--temperature", "nan"], ["--top-p", "0"], ["-k", "-2"], ["--max-tokens", "x"],
                                   ["--tls-ca", "/no/such/ca.pem"]])
def test_cli_flags_out_of_range_are_one_line_usage_errors(flags):
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "hello", "--addr", "127.0.0.1:9", *flags],
                            capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and flags[0] in lines[0], lines
    print("figure:", lines[0])


def test_api_keys_that_name_no_key_are_refused():
    assert parse_keys("") == []  # empty: authentication off, as documented
    assert parse_keys(" a, ,b ,") == ["a", "b"]
    for text in [" , ", ",", " ,, "]:
        with pytest.raises(ConfigError, match="names no key"):
            parse_keys(text)


# ---------------------------------------------------------------- what a seed promises


def test_the_seed_says_exactly_what_it_guarantees():
    """The proto used to promise a reproducible request for any seed; it held only with an explicit k and no
    fallback rounds. With draws keyed by (seed, position) it holds whatever the draft and k on the transformers
    engine (tests/e2e/test_seeded_sampling.py); the vLLM engine keeps the narrower promise, and says so."""
    proto = (REPO_ROOT / "protos/specdec/v1/common.proto").read_text()
    comment = proto[:proto.index("optional uint64 seed = 4;")].rsplit("\n\n", 1)[-1]
    comment = comment[comment.index("// Random seed"):]
    for words in ["explicit num_speculative_tokens", "num_fallback_rounds", "num_speculative_tokens unset",
                  "Other requests running at the same time do not change it", "keyed by (seed, position)",
                  "whatever the draft proposes", "On the vLLM engine"]:
        assert words in " ".join(line.strip().lstrip("/ ") for line in comment.splitlines()), words
