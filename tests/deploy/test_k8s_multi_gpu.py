"""deploy/k8s/overlays/multi-gpu: a verifier on several GPUs through vLLM, the draft on its own GPU.

Rendered and validated offline like the base (`kubectl kustomize`, kubernetes-validate schemas,
the base's wiring checks), then the checks this overlay adds: the verifier's GPU count equals
vLLM's tensor x pipeline parallel size, the vLLM flags are set and are real flags of the
verifier, /dev/shm is a memory-backed volume large enough for the workers, the draft takes
exactly one GPU of its own, and the verifier speculates with the draft at tensor parallel 4. Each added check
is shown to fail on a broken copy.
"""

from __future__ import annotations

import os
import shutil

import pytest

from specdec.runtime.config import parse
from tests.deploy import test_k8s as base_checks
from tests.deploy.test_k8s import K8S, K8S_VERSIONS, by_kind, env_value, k8s_problems, render, schema_errors
from verifier_service.config import VerifierConfig
from verifier_service.engines.vllm_engine import parallel_args

OVERLAY = K8S / "overlays" / "multi-gpu"
# What this overlay changes on purpose in the base's rules: the draft has a GPU too.
INTENDED = {"draft: should not take a GPU"}
MIN_SHM_GIB = 8  # NCCL and vLLM's worker message queues live in /dev/shm


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return render(OVERLAY)


def gib(quantity: str) -> float:
    units = {"Gi": 1, "Mi": 1 / 1024, "Ti": 1024}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    raise ValueError(f"unexpected quantity {quantity!r}: use Mi, Gi or Ti")


def gpus(container: dict) -> dict[str, int]:
    resources = container.get("resources") or {}
    return {kind: int((resources.get(kind) or {}).get("nvidia.com/gpu", 0)) for kind in ("requests", "limits")}


def multi_gpu_problems(docs: list[dict]) -> list[str]:
    """What the multi-GPU overlay must hold beyond the base's wiring. Empty list = consistent."""
    problems = []
    deployments = by_kind(docs, "Deployment")
    config = by_kind(docs, "ConfigMap")["specdec-config"]["data"]
    if config.get("verifier.engine") != "vllm":
        problems.append(f"verifier.engine is {config.get('verifier.engine')!r}: only --engine vllm spans GPUs")

    pod = deployments["verifier"]["spec"]["template"]["spec"]
    verifier = pod["containers"][0]
    sizes = {name: int(env_value(verifier, f"SPECDEC_VLLM_{name}_PARALLEL_SIZE") or 1)
             for name in ("TENSOR", "PIPELINE")}
    world = sizes["TENSOR"] * sizes["PIPELINE"]
    if world < 2:
        problems.append(f"verifier: tensor x pipeline parallel size is {world}; this overlay is for several GPUs")
    for kind, count in gpus(verifier).items():
        if count != world:
            problems.append(f"verifier: {kind} nvidia.com/gpu {count} != tensor x pipeline parallel size {world}")
    backend = env_value(verifier, "SPECDEC_VLLM_DISTRIBUTED_EXECUTOR_BACKEND")
    if backend != "mp":
        problems.append(f"verifier: executor backend {backend!r}; one pod is one node, so mp")
    utilization = float(env_value(verifier, "SPECDEC_VLLM_GPU_MEMORY_UTILIZATION") or 0)
    if not 0.5 <= utilization <= 0.95:
        problems.append(f"verifier: gpu memory utilization {utilization} outside 0.5-0.95")
    if "vllm" not in verifier["image"]:
        problems.append(f"verifier: image {verifier['image']!r} is not the vLLM build (specdec:cuda-vllm)")

    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    shm = [m["name"] for m in verifier.get("volumeMounts") or [] if m["mountPath"].rstrip("/") == "/dev/shm"]
    shm_dir = (volumes.get(shm[0], {}) if shm else {}).get("emptyDir") or {}
    if shm_dir.get("medium") != "Memory":
        problems.append("verifier: /dev/shm must be a memory-backed emptyDir (medium: Memory)")
    elif gib(shm_dir.get("sizeLimit", "0Gi")) < MIN_SHM_GIB:
        problems.append(f"verifier: /dev/shm sizeLimit {shm_dir.get('sizeLimit')} under {MIN_SHM_GIB}Gi")

    draft_pod = deployments["draft"]["spec"]["template"]["spec"]
    draft = draft_pod["containers"][0]
    if gpus(draft) != {"requests": 1, "limits": 1}:
        problems.append(f"draft: needs exactly one GPU of its own, has {gpus(draft)}")
    if env_value(draft, "SPECDEC_DEVICE") != "cuda" or config.get("draft.method") != "model":
        problems.append("draft: a model draft on cuda (draft.method model, SPECDEC_DEVICE cuda)")
    if not draft_pod.get("nodeSelector") or not draft_pod.get("tolerations"):
        problems.append("draft: needs the GPU nodeSelector and toleration")

    claims = by_kind(docs, "PersistentVolumeClaim")
    for name, dep in deployments.items():
        for volume in dep["spec"]["template"]["spec"].get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim is not None and claim not in claims:
                problems.append(f"{name}: volume {volume['name']} claims unknown PersistentVolumeClaim {claim!r}")
    return problems


def verifier_config(docs: list[dict], monkeypatch) -> VerifierConfig:
    """The VerifierConfig the verifier pod would parse: the ConfigMap's SPECDEC_* plus its own env."""
    config = by_kind(docs, "ConfigMap")["specdec-config"]["data"]
    container = by_kind(docs, "Deployment")["verifier"]["spec"]["template"]["spec"]["containers"][0]
    env = {k: v for k, v in config.items() if k.startswith("SPECDEC_")}
    for e in container.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("configMapKeyRef")
        env[e["name"]] = config[ref["key"]] if ref else e.get("value")
    for name in [k for k in os.environ if k.startswith("SPECDEC_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return parse([VerifierConfig], "verifier", argv=[])[0]


def test_overlay_validates_against_the_kubernetes_schemas(docs):
    for version in K8S_VERSIONS:
        assert schema_errors(docs, version) == [], version


def test_overlay_keeps_the_base_wiring(docs):
    assert set(k8s_problems(docs, tls=False)) == INTENDED


def test_overlay_spans_gpus(docs):
    assert multi_gpu_problems(docs) == []
    verifier = by_kind(docs, "Deployment")["verifier"]["spec"]["template"]["spec"]["containers"][0]
    assert gpus(verifier) == {"requests": 4, "limits": 4}
    assert env_value(verifier, "SPECDEC_VLLM_TENSOR_PARALLEL_SIZE") == "4"


def test_overlay_verifier_speculates_at_tensor_parallel_4(docs, monkeypatch):
    """The drafts reach every rank through vLLM's scheduler: the overlay's verifier keeps the draft."""
    cfg = verifier_config(docs, monkeypatch)
    assert (cfg.engine, cfg.draft) == ("vllm", "dns:///draft:50053")  # the draft tier, behind its headless Service
    assert parallel_args(cfg)["tensor_parallel_size"] == 4


def test_overlay_env_is_made_of_verifier_flags(docs):
    """SPECDEC_VLLM_* and the rest are real flags of the entry points, with allowed values."""
    base_checks.test_k8s_env_matches_entry_point_flags({"base": docs, "mtls": []})


BROKEN_COPIES = {  # id: (file, text, replacement, expected problem)
    "fewer-gpus": ("patch-verifier.yaml", "nvidia.com/gpu: 4\n            limits", "nvidia.com/gpu: 2\n            limits",
                   "requests nvidia.com/gpu 2 != tensor x pipeline parallel size 4"),
    "more-tp": ("patch-verifier.yaml", 'TENSOR_PARALLEL_SIZE, value: "4"', 'TENSOR_PARALLEL_SIZE, value: "8"',
                "limits nvidia.com/gpu 4 != tensor x pipeline parallel size 8"),
    "shm-on-disk": ("patch-verifier.yaml", "medium: Memory", 'medium: ""', "memory-backed emptyDir"),
    "small-shm": ("patch-verifier.yaml", "sizeLimit: 16Gi", "sizeLimit: 512Mi", "/dev/shm sizeLimit 512Mi"),
    "draft-without-gpu": ("patch-draft.yaml", "nvidia.com/gpu: 1\n            limits",
                          "nvidia.com/gpu: 0\n            limits", "draft: needs exactly one GPU"),
    "transformers": ("patch-configmap.yaml", "verifier.engine: vllm", "verifier.engine: transformers",
                     "only --engine vllm"),
    "wrong-claim": ("patch-verifier.yaml", "claimName: specdec-models", "claimName: specdec-model",
                    "unknown PersistentVolumeClaim 'specdec-model'"),
}


@pytest.mark.parametrize("file,old,new,expected", BROKEN_COPIES.values(), ids=BROKEN_COPIES.keys())
def test_multi_gpu_check_rejects_a_broken_copy(tmp_path, file, old, new, expected):
    shutil.copytree(K8S, tmp_path / "k8s")
    patch = tmp_path / "k8s" / "overlays" / "multi-gpu" / file
    text = patch.read_text()
    assert old in text, old
    patch.write_text(text.replace(old, new, 1))
    problems = multi_gpu_problems(render(tmp_path / "k8s" / "overlays" / "multi-gpu"))
    assert any(expected in p for p in problems), problems


def test_flag_check_rejects_an_unknown_executor_backend(tmp_path):
    shutil.copytree(K8S, tmp_path / "k8s")
    patch = tmp_path / "k8s" / "overlays" / "multi-gpu" / "patch-verifier.yaml"
    patch.write_text(patch.read_text().replace("EXECUTOR_BACKEND, value: mp}", "EXECUTOR_BACKEND, value: torchrun}"))
    with pytest.raises(AssertionError, match="torchrun"):
        base_checks.test_k8s_env_matches_entry_point_flags({"base": render(tmp_path / "k8s" / "overlays" / "multi-gpu"),
                                                "mtls": []})
