"""The chat format SmolLM2-Instruct was trained on (ChatML), for tools that build prompts by hand."""

from __future__ import annotations


def chatml(prompt: str) -> str:
    """Wrap a user message in ChatML, ready for the assistant's answer."""
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
