"""vLLM fixtures shared by the vLLM engine tests: one tiny seeded pair, and one plain-vLLM reference run.

vLLM takes tens of seconds to start on 2 cores, so the reference (vLLM's own greedy output at tensor
parallel 1, no speculation) is computed once, in one process, for every prompt any vLLM test compares.
It is started as soon as the first test asks, so that it starts up beside that test's own vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from devkit.stack import REPO_ROOT
from devkit.testing import VLLM_TINY_SHAPE, build_tiny_pair
from tests.verifier_service.vllm_support import (
    ID_PROMPTS,
    REFERENCE_MAX_TOKENS,
    TEXT_PROMPTS,
    VLLM_PYTHON,
    need_vllm,
)


@pytest.fixture(scope="session")
def vllm_pair(tmp_path_factory):
    return build_tiny_pair(tmp_path_factory.mktemp("vllm-models"), shape=VLLM_TINY_SHAPE)


@pytest.fixture(scope="session")
def vllm_tokenizer(vllm_pair):
    from specdec.modeling.models import load_tokenizer

    return load_tokenizer(str(vllm_pair[0]))


@pytest.fixture(scope="session")
def vllm_reference_job(vllm_pair, vllm_tokenizer, tmp_path_factory):
    """The running reference process and its work directory."""
    need_vllm()
    work = tmp_path_factory.mktemp("vllm-reference")
    prompts = [vllm_tokenizer.encode(p, add_special_tokens=False) for p in TEXT_PROMPTS] + ID_PROMPTS
    (work / "prompts.json").write_text(json.dumps(prompts))
    eos = str(vllm_tokenizer.convert_tokens_to_ids("<|im_end|>"))
    process = subprocess.Popen([VLLM_PYTHON, str(REPO_ROOT / "tools" / "vllm_generate.py"),
                                "--model", str(vllm_pair[0]), "--prompts", str(work / "prompts.json"),
                                "--out", str(work / "out.json"), "--max-tokens", str(REFERENCE_MAX_TOKENS),
                                "--eos", eos],
                               cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, "VLLM_CACHE_ROOT": str(work / "cache")})
    yield process, work, prompts
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def vllm_reference(vllm_reference_job) -> dict[tuple[int, ...], list[int]]:
    """Plain vLLM's greedy output (up to REFERENCE_MAX_TOKENS) per prompt's token ids."""
    process, work, prompts = vllm_reference_job
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr.decode(errors="replace")[-3000:]
    return {tuple(ids): out for ids, out in zip(prompts, json.loads((work / "out.json").read_text()))}
