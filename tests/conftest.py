"""Fixtures shared by every test: tiny seeded models built once per session."""

import pytest

from devkit.testing import build_tiny_pair


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(target_dir, draft_dir): tiny seeded models sharing one byte-level BPE tokenizer."""
    return build_tiny_pair(tmp_path_factory.mktemp("models"))


# The slowest files (serial seconds, 2-core Xeon, 2026-12-01), started first: `make test` runs two
# workers, each taking whole files in collection order (`-n 2 --dist loadfile --no-loadscope-reorder`),
# so a slow file collected last would run alone at the end while the other worker idles.
SLOWEST_FIRST = (
    "tests/verifier_service/engines/test_vllm_engine.py",  # 207 s
    "tests/verifier_service/engines/test_vllm_structured.py",  # 280 s (two stacks; a loaded 2-core EPYC)
    "tests/verifier_service/engines/test_vllm_tensor_parallel.py",  # 127 s
    "tests/e2e/test_lossless_greedy.py",  # 155 s
    "tests/verifier_service/speculation/test_rejection_sampler.py",  # 107 s
    "tests/reliability/test_verifier_swap.py",  # 77 s
    "tests/tools/test_gpu_check.py",  # 85 s
    "tests/bench/test_studies.py",  # 70 s
)


def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


def pytest_configure(config):
    # Tiny models run fastest on one thread, and the services the tests spawn share the 2 cores.
    import os

    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
