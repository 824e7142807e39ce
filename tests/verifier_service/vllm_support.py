"""What the vLLM tests share: the vLLM interpreter, and the prompts of the one plain-vLLM reference run
(conftest.py runs it)."""

from __future__ import annotations

import os
import pathlib

import pytest

from devkit.stack import REPO_ROOT

VLLM_PYTHON = os.environ.get("SPECDEC_VLLM_PYTHON", str(REPO_ROOT / ".venv-vllm" / "bin" / "python"))
REFERENCE_MAX_TOKENS = 32
# text prompts (the engine tests, through the gateway) and token-id prompts (tensor parallel, at the verifier)
TEXT_PROMPTS = [
    "The quick brown fox", '{"name": "Ada", "age": 36}', "SELECT id FROM users", "def add(a, b):",
    "Speculative decoding", "café", "for i in range(10):", "Hello, world!", "a", "zzzz",
    '{"tags": ["math", "code"]} -> {"tags": [', "return a + b", "ORDER BY name;", "The lazy dog",
    "SELECT id, name FROM users WHERE age > 30 ORDER BY", "print(i * i)", "1 2 3 4 5 6 7 8", "The The The The",
    "over the", "jumps", "verifies them in one pass", "def f(x):\n    return", '"age": 36, "age": 36, "age":',
    "tokens and verifies",
]
ID_PROMPTS = [[1, 2, 3, 4, 5], [10, 20, 30], [7] * 12, [100, 200, 300, 40]]  # token ids of the tiny vocabulary


def need_vllm() -> None:
    if not pathlib.Path(VLLM_PYTHON).exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make setup-vllm` (or set SPECDEC_VLLM_PYTHON)")
