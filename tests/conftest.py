"""Fixtures shared by every test: tiny seeded models built once per session."""

import pytest

from specdec.testing import build_tiny_pair


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(target_dir, draft_dir): tiny seeded models sharing one byte-level BPE tokenizer."""
    return build_tiny_pair(tmp_path_factory.mktemp("models"))
