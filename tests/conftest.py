"""Fixtures shared by every test: tiny seeded models built once per session."""

import pytest

from specdec.testing import build_tiny_pair


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(target_dir, draft_dir): tiny seeded models sharing one byte-level BPE tokenizer."""
    return build_tiny_pair(tmp_path_factory.mktemp("models"))


def pytest_configure(config):
    # Tiny models run fastest on one thread, and the services the tests spawn share the 2 cores.
    import os

    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
