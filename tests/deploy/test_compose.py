"""deploy/docker-compose*.yml: schema, wiring, entry points, and the health probe.

Nothing here needs a Docker engine. The files are validated against the
compose-spec JSON schema (check-jsonschema's vendored copy) and then checked for
the things the schema cannot see: depends_on targets, addresses and ports that
must agree between services, healthchecks, the GPU reservation, the tracing
exporter, and that every `python -m X` the containers run is a real entry point.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from concurrent import futures

import pytest
import yaml

from tests.deploy.conftest import (
    DEPLOY,
    GRPC_PORTS,
    KNOWN_MODULES,
    METRICS_PORTS,
    PYTHON,
    REPO,
    check_env_against_help,
    exposure_problems,
    module_help,
    prefetch_help,
    python_module_of,
    resolve_default,
    run,
    runnable,
    tool,
)

GPU_FILE = DEPLOY / "docker-compose.yml"
CPU_FILE = DEPLOY / "docker-compose.cpu.yml"
COMPOSE_FILES = [GPU_FILE, CPU_FILE]
SERVICE_OF_MODULE = {"gateway": "gateway", "verifier_service": "verifier", "draft_service": "draft"}
HTTP_PORT = 8000  # the gateway's OpenAI-compatible HTTP API (--http-port), beside gRPC 50051
VALID_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
SPEC_DECODE_COUNTERS = [
    "spec_decode_num_drafts_total",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
    "spec_decode_num_accepted_tokens_per_pos_total",
]


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # ["K=V", ...]
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return {k: (None if v is None else str(v)) for k, v in env.items()}


def host_port(value: str) -> tuple[str, int]:
    value = resolve_default(value)
    value = re.sub(r"^[a-z]+://", "", value).rstrip("/")
    host, _, port = value.rpartition(":")
    return host, int(port)


def published_ports(service: dict) -> list[int]:
    out = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            out.append(int(p["published"]))
        else:
            parts = resolve_default(p).split(":")
            out.append(int(parts[-2] if len(parts) >= 2 else parts[-1]))
    return out


def depends(service: dict) -> dict[str, str]:
    dep = service.get("depends_on") or {}
    if isinstance(dep, list):
        return {name: "service_started" for name in dep}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in dep.items()}


def gpu_devices(service: dict) -> list[dict]:
    return (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []


def services_running(services: dict, module: str, first: str) -> list[str]:
    """The services that run `python -m module`: `first` first, then the others (a profile's) in file order."""
    found = [n for n, s in services.items() if python_module_of(s.get("command")) == module]
    return sorted(found, key=lambda n: n != first)


def verifier_services(services: dict) -> list[str]:
    return services_running(services, "verifier_service", "verifier")


def aliases(service: dict) -> set[str]:
    networks = service.get("networks") or {}
    if isinstance(networks, list):
        return set()
    return {alias for spec in networks.values() for alias in ((spec or {}).get("aliases") or [])}


def fleet_address_problems(user: str, var: str, value: str, services: dict, module: str, first: str) -> list[str]:
    """`user`'s `var` (the gateway's SPECDEC_VERIFIER, a verifier's SPECDEC_DRAFT) may name a fleet: it must reach
    every service running `module`, each on its SPECDEC_PORT, and `user` must wait for `first` to be healthy."""
    from specdec.runtime.targets import parse_targets

    problems, fleet = [], services_running(services, module, first)
    try:
        targets = parse_targets(value, var, f"{first}s:1")
    except ValueError as exc:
        return [f"{user}: {var}={value!r}: {exc}"]
    if targets.dns:
        reached = [v for v in fleet if targets.dns_host == v or targets.dns_host in aliases(services[v])]
        addresses = [(v, targets.dns_port) for v in reached]
        if not reached:
            problems.append(f"{user}: {var} {value!r} names no {first} service or alias")
        for v in fleet:
            if v not in reached:
                problems.append(f"{user}: {var} {value!r} does not reach {v} (give {v} the network "
                                f"alias {targets.dns_host!r})")
    else:
        addresses = [host_port(a) for a in targets.addresses]
        for host, _ in addresses:
            if host not in fleet:
                problems.append(f"{user}: {var} host {host!r} is not a {first} service")
    for host, port in addresses:
        want = int(resolve_default(env_of(services.get(host) or {}).get("SPECDEC_PORT", "0")))
        if host in services and port != want:
            problems.append(f"{user}: {var} port {port} != {host}'s SPECDEC_PORT {want}")
    if depends(services.get(user) or {}).get(first) != "service_healthy":
        problems.append(f"{user}: uses {first} but does not wait for it to be healthy")
    return problems


def compose_problems(data: dict, expect_gpu: bool) -> list[str]:
    """Everything the compose schema cannot check. Empty list = consistent."""
    problems: list[str] = []
    services: dict = data.get("services") or {}
    named_volumes = set((data.get("volumes") or {}).keys())

    for required in ("gateway", "verifier", "draft", "jaeger", "model-init"):
        if required not in services:
            problems.append(f"missing service {required!r}")

    for name, svc in services.items():
        for target, condition in depends(svc).items():
            if target not in services:
                problems.append(f"{name}: depends_on unknown service {target!r}")
            if condition not in VALID_CONDITIONS:
                problems.append(f"{name}: depends_on {target} has bad condition {condition!r}")
            target_svc = services.get(target) or {}
            if condition == "service_healthy" and "healthcheck" not in target_svc:
                problems.append(f"{name}: waits for {target} to be healthy, but {target} has no healthcheck")
            if target == "model-init" and condition != "service_completed_successfully":
                problems.append(f"{name}: must wait for model-init with service_completed_successfully")
        for vol in svc.get("volumes") or []:
            source = vol.split(":")[0] if isinstance(vol, str) else vol.get("source", "")
            if source and not source.startswith((".", "/", "~", "$")) and source not in named_volumes:
                problems.append(f"{name}: volume {source!r} is not declared under top-level volumes")

    # The product services: command, ports, healthcheck, tracing, addresses.
    verifiers = verifier_services(services)
    drafts = services_running(services, "draft_service", "draft")
    for module, name in [*SERVICE_OF_MODULE.items(), *(("verifier_service", v) for v in verifiers[1:]),
                         *(("draft_service", d) for d in drafts[1:])]:
        svc = services.get(name)
        if svc is None:
            continue
        env = env_of(svc)
        if python_module_of(svc.get("command")) != module:
            problems.append(f"{name}: command must run `python -m {module}`, got {svc.get('command')!r}")
        if module != "gateway":
            problems += exposure_problems(name, env)
        port = int(resolve_default(env.get("SPECDEC_PORT", GRPC_PORTS[module])))
        if port != GRPC_PORTS[module]:
            problems.append(f"{name}: SPECDEC_PORT {port} differs from the contract port {GRPC_PORTS[module]}")
        metrics = env.get("SPECDEC_METRICS_PORT")
        if metrics is None or int(resolve_default(metrics)) != METRICS_PORTS[module]:
            problems.append(f"{name}: SPECDEC_METRICS_PORT must be {METRICS_PORTS[module]}, got {metrics!r}")
        hc = svc.get("healthcheck") or {}
        test = hc.get("test") or []
        test_text = " ".join(test) if isinstance(test, list) else str(test)
        if python_module_of(test_text) != "specdec.runtime.health_probe":
            problems.append(f"{name}: healthcheck must run `python -m specdec.runtime.health_probe`, got {test!r}")
        m = re.search(r"--addr[ =]\S*:(\d+)", test_text)
        if not m or int(m.group(1)) != port:
            problems.append(f"{name}: healthcheck probes {m.group(1) if m else '?'} but the service listens on {port}")
        if "model-init" not in depends(svc):
            problems.append(f"{name}: must depend on model-init (it reads the model volume)")
        if not env.get("OTEL_SERVICE_NAME"):
            problems.append(f"{name}: OTEL_SERVICE_NAME is not set")
        endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if not endpoint:
            problems.append(f"{name}: OTEL_EXPORTER_OTLP_ENDPOINT is not set")
        else:
            host, otlp_port = host_port(endpoint)
            if host != "jaeger" or otlp_port != 4317:
                problems.append(f"{name}: traces go to {endpoint!r}, expected the jaeger service on 4317")
        if "jaeger" not in depends(svc):
            problems.append(f"{name}: should start after jaeger")

    # Cross-service addresses: HOST must be the service, PORT its SPECDEC_PORT. The gateway's SPECDEC_VERIFIER
    # and each verifier's SPECDEC_DRAFT may name a fleet: a list of services, or dns:///NAME:PORT, NAME a
    # network alias they all carry.
    fleets = {("gateway", "SPECDEC_VERIFIER"): ("verifier_service", "verifier"),
              **{(v, "SPECDEC_DRAFT"): ("draft_service", "draft") for v in verifiers}}
    for (user, var), (module, first) in fleets.items():
        value = env_of(services.get(user) or {}).get(var)
        if value is not None:
            problems += fleet_address_problems(user, var, resolve_default(value), services, module, first)
    for name, svc in services.items():
        for var, target in (("SPECDEC_VERIFIER", "verifier"), ("SPECDEC_DRAFT", "draft")):
            if var not in env_of(svc) or (name, var) in fleets:
                continue
            try:
                host, port = host_port(env_of(svc)[var])
            except ValueError:
                problems.append(f"{name}: {var}={env_of(svc)[var]!r} is not HOST:PORT")
                continue
            if host != target:
                problems.append(f"{name}: {var} host {host!r} is not the {target!r} service")
            target_env = env_of(services.get(target) or {})
            want = int(resolve_default(target_env.get("SPECDEC_PORT", "0")))
            if port != want:
                problems.append(f"{name}: {var} port {port} != {target}'s SPECDEC_PORT {want}")
            if target not in depends(svc) or depends(svc)[target] != "service_healthy":
                problems.append(f"{name}: uses {target} but does not wait for it to be healthy")
    gw_env = env_of(services.get("gateway") or {})
    if "SPECDEC_VERIFIER" not in gw_env:
        problems.append("gateway: SPECDEC_VERIFIER is not set")
    if "SPECDEC_DRAFT" not in env_of(services.get("verifier") or {}):
        problems.append("verifier: SPECDEC_DRAFT is not set (the verifier pulls draft blocks)")

    # What reaches the host: the gateway's APIs (gRPC and HTTP) and the Jaeger UI
    # by default; everything else only behind a profile.
    allowed = {"gateway": {50051, HTTP_PORT}, "jaeger": {16686}}
    for name, svc in services.items():
        ports = set(published_ports(svc))
        if svc.get("profiles"):
            continue
        extra = ports - allowed.get(name, set())
        if extra:
            problems.append(f"{name}: publishes {sorted(extra)} to the host; only gateway 50051 and {HTTP_PORT} "
                            "and the Jaeger UI may")
    for name, must in (("gateway", 50051), ("gateway", HTTP_PORT), ("jaeger", 16686)):
        if name in services and must not in published_ports(services[name]):
            problems.append(f"{name}: must publish port {must}")
    http = env_of(services.get("gateway") or {}).get("SPECDEC_HTTP_PORT")
    if http is None or int(resolve_default(http)) != HTTP_PORT:
        problems.append(f"gateway: SPECDEC_HTTP_PORT must be {HTTP_PORT} (the published HTTP port), got {http!r}")
    jaeger = services.get("jaeger") or {}
    image = str(jaeger.get("image", ""))
    if not re.fullmatch(r"jaegertracing/jaeger:2\.\d+\.\d+", image):
        problems.append(f"jaeger: image must be jaegertracing/jaeger pinned to a 2.x.y tag, got {image!r}")
    for name, svc in services.items():
        img = str(svc.get("image", ""))
        if img and (":" not in img.rsplit("/", 1)[-1] or img.endswith(":latest")):
            problems.append(f"{name}: image {img!r} is not pinned to a tag")

    # GPU reservation: only the verifiers, and only in the GPU file.
    for name, svc in services.items():
        devices = gpu_devices(svc)
        if name in verifiers and expect_gpu:
            if not any(d.get("driver") == "nvidia" and "gpu" in (d.get("capabilities") or []) for d in devices):
                problems.append(f"{name}: no NVIDIA GPU reservation (deploy.resources.reservations.devices)")
            if env_of(svc).get("SPECDEC_DEVICE") != "cuda":
                problems.append(f"{name}: SPECDEC_DEVICE must be cuda when a GPU is reserved")
        elif devices:
            problems.append(f"{name}: reserves devices {devices} (CPU variant / non-verifier)")
        if not expect_gpu and env_of(svc).get("SPECDEC_DEVICE", "cpu") != "cpu":
            problems.append(f"{name}: SPECDEC_DEVICE must be cpu in the CPU variant")

    if expect_gpu:  # two verifiers on one GPU would share it; each verifier after the first names its own
        named = [tuple(d.get("device_ids") or ()) for v in verifiers for d in gpu_devices(services[v])]
        if len(verifiers) > 1 and (len(set(named)) < len(verifiers) or () in named[1:]):
            problems.append(f"verifiers {verifiers}: each after the first must reserve its own GPU (device_ids)")

    # model-init: one-shot fetcher writing the shared volume.
    mi = services.get("model-init") or {}
    if python_module_of(mi.get("command")) != "specdec.modeling.fetch_model":
        problems.append("model-init: must run `python -m specdec.modeling.fetch_model`")
    if str(mi.get("restart", "no")) != "no":
        problems.append("model-init: a one-shot job must not restart")

    # Monitoring stack only behind the `monitoring` profile.
    for name in ("prometheus", "grafana"):
        if name in services and "monitoring" not in (services[name].get("profiles") or []):
            problems.append(f"{name}: must sit behind the `monitoring` profile")
    return problems


# --- 1. schema -------------------------------------------------------------------------
def check_jsonschema(path):
    tool("check-jsonschema")  # fails with an install hint if requirements.txt is missing
    return run([PYTHON, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)])


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_matches_compose_spec_schema(path):
    result = check_jsonschema(path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["services"]["gateway"].__setitem__("ports", "50051:50051"),  # must be a list
        lambda d: d["services"]["verifier"].__setitem__("healthcheck", {"test": ["CMD"], "intervall": "10s"}),
        lambda d: d.__setitem__("servics", {}),
    ],
    ids=["ports-not-a-list", "misspelt-healthcheck-key", "unknown-top-level-key"],
)
def test_schema_rejects_a_broken_copy(tmp_path, mutate):
    data = load(GPU_FILE)
    mutate(data)
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(data, sort_keys=False))
    result = check_jsonschema(broken)
    assert result.returncode != 0, "check-jsonschema accepted a broken compose file:\n" + result.stdout


# --- 2. wiring ------------------------------------------------------------------------
@pytest.mark.parametrize("path,gpu", [(GPU_FILE, True), (CPU_FILE, False)], ids=["gpu", "cpu"])
def test_compose_is_consistent(path, gpu):
    assert compose_problems(load(path), expect_gpu=gpu) == []


def test_cpu_variant_differs_from_gpu_only_in_the_verifier_device():
    gpu, cpu = load(GPU_FILE), load(CPU_FILE)
    assert set(gpu["services"]) == set(cpu["services"])
    assert gpu.get("volumes") == cpu.get("volumes")
    for name in gpu["services"]:
        g, c = copy.deepcopy(gpu["services"][name]), copy.deepcopy(cpu["services"][name])
        if name in verifier_services(gpu["services"]):
            for svc in (g, c):
                svc.pop("deploy", None)
                svc.pop("image", None)
                svc.pop("build", None)
                for var in ("SPECDEC_DEVICE", "SPECDEC_DTYPE"):
                    svc["environment"].pop(var, None)
        assert g == c, f"service {name} differs between {GPU_FILE.name} and {CPU_FILE.name}"


@pytest.mark.parametrize(
    "mutate,expected",
    [
        (
            lambda s: s["gateway"]["depends_on"].__setitem__("verifer", {"condition": "service_healthy"}),
            "depends_on unknown service 'verifer'",
        ),
        (
            lambda s: s["gateway"]["environment"].__setitem__("SPECDEC_VERIFIER", "verifier:50053"),
            "SPECDEC_VERIFIER port 50053",
        ),
        (
            lambda s: s["gateway"]["environment"].__setitem__("SPECDEC_VERIFIER", "dns:///verifierz:50052"),
            "names no verifier service or alias",
        ),
        (lambda s: s["verifier2"].pop("networks"), "does not reach verifier2"),
        (
            lambda s: s["gateway"]["environment"].__setitem__("SPECDEC_VERIFIER", "verifier:50052,draft:50053"),
            "host 'draft' is not a verifier service",
        ),
        (lambda s: s["verifier2"].pop("deploy"), "verifier2: no NVIDIA GPU reservation"),
        (lambda s: s["verifier2"]["deploy"]["resources"]["reservations"]["devices"][0].pop("device_ids"),
         "must reserve its own GPU"),
        (
            lambda s: s["verifier"]["environment"].__setitem__("SPECDEC_DRAFT", "drafts:50053"),
            "SPECDEC_DRAFT host 'drafts'",
        ),
        (lambda s: s["draft2"].pop("networks"), "verifier: SPECDEC_DRAFT 'dns:///drafts:50053' does not reach draft2"),
        (
            lambda s: s["verifier"]["environment"].__setitem__("SPECDEC_DRAFT", "dns:///draftz:50053"),
            "names no draft service or alias",
        ),
        (
            lambda s: s["draft"]["healthcheck"].__setitem__(
                "test", ["CMD", "python", "-m", "specdec.runtime.health_probe", "--addr", "127.0.0.1:50052"]
            ),
            "healthcheck probes 50052",
        ),
        (lambda s: s["verifier"].pop("deploy"), "no NVIDIA GPU reservation"),
        (lambda s: s["draft"].__setitem__("ports", ["9103:9103"]), "publishes [9103]"),
        (
            lambda s: s["gateway"]["depends_on"].__setitem__("model-init", {"condition": "service_started"}),
            "service_completed_successfully",
        ),
        (lambda s: s["gateway"]["environment"].pop("OTEL_EXPORTER_OTLP_ENDPOINT"), "OTEL_EXPORTER_OTLP_ENDPOINT"),
        (lambda s: s["gateway"]["environment"].__setitem__("SPECDEC_HTTP_PORT", "8080"), "SPECDEC_HTTP_PORT must be"),
        (lambda s: s["gateway"]["ports"].pop(), "must publish port 8000"),
        (lambda s: s["draft"]["environment"].pop("SPECDEC_HOST"), "draft: SPECDEC_HOST must be a non-loopback"),
        (lambda s: s["verifier"]["environment"].__setitem__("SPECDEC_INSECURE", "true"),
         "verifier: SPECDEC_INSECURE must not be set"),
    ],
    ids=[
        "missing-depends-target",
        "wrong-verifier-port",
        "verifier-dns-name-unknown",
        "second-verifier-not-aliased",
        "verifier-list-names-the-draft",
        "second-verifier-no-gpu",
        "second-verifier-shares-the-gpu",
        "wrong-draft-host",
        "second-draft-not-aliased",
        "draft-dns-name-unknown",
        "wrong-probe-port",
        "no-gpu",
        "leaked-port",
        "model-init-not-completed",
        "no-tracing",
        "wrong-http-port",
        "http-not-published",
        "draft-on-loopback",
        "verifier-insecure",
    ],
)
def test_consistency_check_rejects_a_broken_copy(tmp_path, mutate, expected):
    data = load(GPU_FILE)
    mutate(data["services"])
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(data, sort_keys=False))
    problems = compose_problems(load(broken), expect_gpu=True)
    assert any(expected in p for p in problems), problems


def test_monitoring_config_matches_services():
    services = load(GPU_FILE)["services"]
    prom = load(DEPLOY / "prometheus" / "prometheus.yml")
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    for name in SERVICE_OF_MODULE.values():
        port = int(env_of(services[name])["SPECDEC_METRICS_PORT"])
        assert f"{name}:{port}" in targets, f"prometheus does not scrape {name}:{port}"
    for mount in services["prometheus"]["volumes"] + services["grafana"]["volumes"]:
        source = mount.split(":")[0]
        assert (DEPLOY / source).exists(), f"bind-mount source {source} is missing"
    datasource = load(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")["datasources"][0]
    dashboard = json.loads((DEPLOY / "grafana/dashboards/specdec.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    for counter in SPEC_DECODE_COUNTERS:
        assert counter in exprs, f"dashboard has no panel on {counter}"
    assert "histogram_quantile" in exprs
    for p in dashboard["panels"]:
        if p.get("type") != "row":
            assert p["datasource"]["uid"] == datasource["uid"], p["title"]


# --- 3. entry points ------------------------------------------------------------------
def _commands():
    """(where, module, env) for every `python -m X` the compose files run (commands and healthchecks)."""
    out = []
    for path in COMPOSE_FILES:
        for name, svc in load(path)["services"].items():
            module = python_module_of(svc.get("command"))
            if module:
                out.append((f"{path.name}:{name}", module, env_of(svc)))
            hc = (svc.get("healthcheck") or {}).get("test")
            module = python_module_of(hc)
            if module:
                out.append((f"{path.name}:{name}:healthcheck", module, {}))
    return out


COMMANDS = _commands()
MODULES = sorted({m for _, m, _ in COMMANDS})


def test_compose_runs_only_known_entry_points():
    assert set(MODULES) <= KNOWN_MODULES, set(MODULES) - KNOWN_MODULES
    assert {"gateway", "verifier_service", "draft_service", "specdec.modeling.fetch_model", "specdec.runtime.health_probe"} <= set(
        MODULES
    )


@pytest.fixture(scope="module")
def helps():
    prefetch_help(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_entry_point_help_exits_zero_and_accepts_the_env(module, helps):
    if not runnable(module):
        pytest.skip(f"`python -m {module}` does not exist yet (ImportError / no __main__)")
    result = module_help(module)
    assert result.returncode == 0, f"python -m {module} --help exited {result.returncode}:\n{result.stderr[-2000:]}"
    problems = []
    for where, mod, env in COMMANDS:
        if mod == module:
            problems += check_env_against_help(module, env, where)
    assert problems == []


# --- the health probe used by every healthcheck ---------------------------------------
@pytest.fixture(scope="module")
def health_server():
    grpc = pytest.importorskip("grpc")
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.set("specdec.v1.Busy", health_pb2.HealthCheckResponse.NOT_SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(None)


def probe(*args):
    return run([PYTHON, "-m", "specdec.runtime.health_probe", *args], timeout=30, cwd=REPO)


def test_health_probe_exit_codes(health_server):
    addr = f"127.0.0.1:{health_server}"
    results = {}

    def go(key, *args):
        results[key] = probe(*args)

    cases = {
        "serving": ("--addr", addr),
        "not_serving": ("--addr", addr, "--service", "specdec.v1.Busy"),
        "unknown": ("--addr", addr, "--service", "nope"),
        "closed": ("--addr", "127.0.0.1:1", "--timeout", "2"),
        "usage": (),
        "bad_ca": ("--addr", addr, "--tls-ca", "/nonexistent/ca.pem"),
    }
    threads = [threading.Thread(target=go, args=(k, *a)) for k, a in cases.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["serving"].returncode == 0, results["serving"].stderr
    assert results["not_serving"].returncode == 1 and "NOT_SERVING" in results["not_serving"].stderr
    assert results["unknown"].returncode == 1 and "SERVICE_UNKNOWN" in results["unknown"].stderr
    assert results["closed"].returncode == 3 and "UNAVAILABLE" in results["closed"].stderr
    assert results["usage"].returncode == 2
    assert results["bad_ca"].returncode == 2
    for key, r in results.items():
        assert "Traceback" not in r.stderr, (key, r.stderr)
        if key not in ("serving", "usage"):
            assert len(r.stderr.strip().splitlines()) == 1, (key, r.stderr)


def test_entry_point_check_rejects_broken_modules(tmp_path, monkeypatch):
    """The --help / env check fails on a bad flag, a bad choice and a crashing entry point."""
    (tmp_path / "fake_specdec_entry.py").write_text(
        "import argparse\n"
        "p = argparse.ArgumentParser()\n"
        "p.add_argument('--log-level', choices=['DEBUG', 'INFO'])\n"
        "p.add_argument('--port', type=int)\n"
        "p.parse_args()\n"
    )
    (tmp_path / "fake_specdec_crash.py").write_text("raise SystemExit('boom: missing dependency')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    ok = check_env_against_help("fake_specdec_entry", {"SPECDEC_PORT": "1", "SPECDEC_LOG_LEVEL": "INFO"}, "t")
    assert ok == []
    bad = check_env_against_help("fake_specdec_entry", {"SPECDEC_PROT": "1", "SPECDEC_LOG_LEVEL": "${LOG:-info}"}, "t")
    assert any("SPECDEC_PROT is not a flag" in p for p in bad), bad
    assert any("SPECDEC_LOG_LEVEL='${LOG:-info}' is not one of" in p for p in bad), bad
    crash = check_env_against_help("fake_specdec_crash", {}, "t")
    assert crash and "exited 1" in crash[0], crash
