"""Workloads shipped as data: bench/workloads/<name>.jsonl, one prompt a line.

Each line: {"id", "prompt" (the user message), "max_tokens", optional "temperature" (default 0, greedy),
"seed", "stop", "chat" (default true: wrap the prompt with ChatML, as SmolLM2-Instruct expects)}.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from specdec.chat_format import chatml

WORKLOAD_DIR = pathlib.Path(__file__).resolve().parent / "workloads"
# The order of the default run and of the report.
DEFAULT_WORKLOADS = ["copy_heavy", "structured", "chat", "creative", "long_prompt"]


@dataclasses.dataclass
class Prompt:
    workload: str
    id: str
    text: str  # chat-formatted, as sent
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    stop: list[str] = dataclasses.field(default_factory=list)


def load_workload(name_or_path: str, max_prompts: int | None = None, max_tokens: int | None = None) -> list[Prompt]:
    path = pathlib.Path(name_or_path)
    if not path.suffix:
        path = WORKLOAD_DIR / f"{name_or_path}.jsonl"
    prompts = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        text = chatml(item["prompt"]) if item.get("chat", True) else item["prompt"]
        limit = int(item.get("max_tokens", 96))
        prompts.append(Prompt(
            workload=path.stem, id=item["id"], text=text,
            max_tokens=min(limit, max_tokens) if max_tokens else limit,
            temperature=float(item.get("temperature", 0.0)), seed=item.get("seed"), stop=list(item.get("stop", []))))
    return prompts[:max_prompts] if max_prompts else prompts
