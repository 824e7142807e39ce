"""Workloads shipped as data: bench/workloads/<name>.jsonl, one request a line, played in file order.

Each line: {"id", "max_tokens", the conversation, optional "temperature" (default 0, greedy), "seed",
"stop", "chat" (default true: render the conversation as ChatML, as SmolLM2-Instruct expects), "schema" (the
answer's JSON Schema: sent as a structured-outputs constraint where a tool asks for it)}.
The conversation is one of:
- "prompt": one user message (with "chat": false, the raw text sent as is);
- "messages": a list of {"role", "content"} turns (user, assistant, ...), the assistant's answer next;
and, with either, an optional "system" message first.

Order matters: a draft that learns from earlier outputs (suffix) sees a workload's requests in
this order, so a Prompt carries its `position` in the file.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from bench.core.paths import WORKLOAD_DIR

# Production-like repetition (bench/workloads/make_repetitive.py writes them): a draft that learns from
# earlier outputs should pay here.
REPETITIVE_WORKLOADS = ["extraction", "agent_loop", "sql", "faq"]
CLASSIC_WORKLOADS = ["copy_heavy", "structured", "chat", "creative", "long_prompt"]
# The order of the default run and of the report (repetitive first: their draft cache starts cold).
DEFAULT_WORKLOADS = REPETITIVE_WORKLOADS + CLASSIC_WORKLOADS
# Shipped, not in the default run: code writing and refactoring (a code model's draft, the hybrid draft), and 20 chat
# questions (chat's 4 are too few to tell two drafts apart on a noisy machine); named with --workloads, or the set
# 'all'.
EXTRA_WORKLOADS = ["code", "function_calling", "chat_questions"]
# Workloads whose every line carries the JSON Schema of its answer (structured outputs).
SCHEMA_WORKLOADS = ["extraction", "agent_loop", "function_calling"]


@dataclasses.dataclass
class Prompt:
    workload: str
    id: str
    text: str  # chat-formatted, as sent
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    stop: list[str] = dataclasses.field(default_factory=list)
    position: int = 0  # index in the workload file: how many of the workload's requests come before it
    schema: dict | None = None  # the answer's JSON Schema, where the workload gives one

    def constraint(self):
        """The schema as a strict structured-outputs constraint (a common_pb2.Constraint), or None without one."""
        if self.schema is None:
            return None
        from specdec.v1 import common_pb2

        return common_pb2.Constraint(json_schema=json.dumps(self.schema), strict=True)


def chatml_conversation(messages: list[dict]) -> str:
    """ChatML of the turns, open for the assistant's answer (SmolLM2-Instruct's format)."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def conversation(item: dict) -> list[dict]:
    """The line's turns, system message first; a line needs exactly one of prompt and messages."""
    if ("prompt" in item) == ("messages" in item):
        raise ValueError(f"workload line {item.get('id')!r}: give exactly one of 'prompt' and 'messages'")
    turns = list(item["messages"]) if "messages" in item else [{"role": "user", "content": item["prompt"]}]
    for turn in turns:
        if set(turn) != {"role", "content"}:
            raise ValueError(f"workload line {item.get('id')!r}: each message needs 'role' and 'content', got {turn}")
    return ([{"role": "system", "content": item["system"]}] if "system" in item else []) + turns


def workload_path(name_or_path: str) -> pathlib.Path:
    path = pathlib.Path(name_or_path)
    return WORKLOAD_DIR / f"{name_or_path}.jsonl" if not path.suffix else path


def load_workload(name_or_path: str, max_prompts: int | None = None, max_tokens: int | None = None) -> list[Prompt]:
    path = workload_path(name_or_path)
    prompts = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if item.get("chat", True):
            text = chatml_conversation(conversation(item))
        elif "prompt" in item:
            text = item["prompt"]
        else:
            raise ValueError(f"{path}: line {item.get('id')!r} has 'chat': false, so it needs a raw 'prompt'")
        limit = int(item.get("max_tokens", 96))
        prompts.append(Prompt(
            workload=path.stem, id=item["id"], text=text,
            max_tokens=min(limit, max_tokens) if max_tokens else limit,
            temperature=float(item.get("temperature", 0.0)), seed=item.get("seed"), stop=list(item.get("stop", [])),
            position=len(prompts), schema=item.get("schema")))
    return prompts[:max_prompts] if max_prompts else prompts


def parse_workloads(spec: str) -> list[str]:
    """--workloads: comma-separated names or .jsonl paths; 'default', 'repetitive', 'classic' and 'all' name the
    sets."""
    sets = {"default": DEFAULT_WORKLOADS, "repetitive": REPETITIVE_WORKLOADS, "classic": CLASSIC_WORKLOADS,
            "all": DEFAULT_WORKLOADS + EXTRA_WORKLOADS}
    names: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        for name in sets.get(part, [part] if part else []):
            if name not in names:
                names.append(name)
    missing = [n for n in names if not workload_path(n).exists()]
    if missing:
        shipped = sorted(p.stem for p in WORKLOAD_DIR.glob("*.jsonl"))
        raise ValueError(f"unknown workload(s) {', '.join(missing)}: shipped are {', '.join(shipped)} "
                         "(or give a .jsonl path, or a set: default, repetitive, classic, all)")
    return names
