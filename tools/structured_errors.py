"""The structured-outputs error table, through the official `openai` client: each bad constraint is a 400 whose
message names the problem.

Sends each case of CASES to /v1/completions (the constraint as response_format or vLLM's structured_outputs, in
extra_body) and, for the json_schema cases, to /v1/chat/completions with the client's own `response_format`
argument. Prints a markdown table (case, how it was sent, HTTP status, error param, the message, seconds to the
answer) and writes it as JSON with --out. Exit status 1 when a case is not a 400 naming its problem.

    python -m tools.structured_errors --model .cache/models/smollm2-135m-instruct   # starts a stack
    python -m tools.structured_errors --base-url http://127.0.0.1:8000/v1 --served-model NAME
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib
import time

from specdec.runtime.limits import MAX_CONSTRAINT_BYTES


def _big_schema(target_bytes: int) -> dict:
    """A valid schema of about target_bytes when serialised: an object with many string properties."""
    properties, size, i = {}, 40, 0
    while size < target_bytes:
        properties[f"field_{i:06d}"] = {"type": "string"}
        size += len(f'"field_{i:06d}": {{"type": "string"}}, ')
        i += 1
    return {"type": "object", "properties": properties}


def _optional_schema(count: int) -> dict:
    """A valid schema under the size cap whose compile takes long: many optional properties (xgrammar's compile
    grows faster than linearly in their number, whatever the vocabulary; 2,000 take about a minute)."""
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(count)}}


def json_schema(schema) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}


@dataclasses.dataclass
class Case:
    name: str
    extra_body: dict  # what the request adds: response_format or structured_outputs
    named: str  # the 400's message must hold this
    param: str = "response_format"
    # Also right: a 413 whose message holds this. A body larger than any request that fits the model (its
    # context's prompt, the largest constraint, the rest) is refused unread, before its schema is looked at.
    unread: str | None = None

    def answered_right(self, status: int, param: str | None, message: str) -> bool:
        if status == 413 and self.unread is not None:
            return self.unread in message
        return status == 400 and self.named in message and param == self.param


def cases() -> list[Case]:
    return [
        Case("bad schema (a type that does not exist)", json_schema({"type": "object", "properties": {
            "a": {"type": "nope"}}}), "constraint.json_schema does not compile"),
        Case("unsupported keyword (uniqueItems)", json_schema({"type": "array", "uniqueItems": True}),
             "unsupported keywords: uniqueItems at #"),
        Case("unsupported keyword deep in the schema (not)", json_schema({"type": "object", "properties": {
            "id": {"type": "integer", "not": {"const": 0}}}}), "unsupported keywords: not at #/properties/id"),
        Case(f"oversized schema (~{2 * MAX_CONSTRAINT_BYTES // 1024} KB)", json_schema(
            _big_schema(2 * MAX_CONSTRAINT_BYTES)), f"over the limit of {MAX_CONSTRAINT_BYTES} bytes"),
        Case("oversized schema (~1 MB)", json_schema(_big_schema(1024 * 1024)),
             f"over the limit of {MAX_CONSTRAINT_BYTES} bytes", unread="refused unread"),
        Case("schema too complex to compile in time (2,000 optional properties, under the size cap)",
             json_schema(_optional_schema(2000)), "constraint.json_schema is too complex"),
        Case("regex that does not compile", {"structured_outputs": {"regex": "(a[0-9"}},
             "constraint.regex does not compile"),
        Case("grammar that does not parse", {"structured_outputs": {"grammar": "root ::= (\"a\""}},
             "constraint.grammar does not compile"),
        Case("json_schema without its schema", {"response_format": {"type": "json_schema",
                                                                    "json_schema": {"name": "answer"}}},
             "response_format.json_schema.schema is required"),
        Case("two constraints at once", {**json_schema({"type": "string"}), "structured_outputs": {"regex": "a+"}},
             "both ask for a constraint", param="structured_outputs"),
    ]


def probe(base_url: str, model: str, case: Case, chat: bool = False) -> dict:
    """One case through the openai client: its status, error param and message, and the seconds it took."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    started = time.perf_counter()
    try:
        if chat:  # the client's own response_format argument, not an extra body field
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
                                           response_format=case.extra_body["response_format"])
        else:
            client.completions.create(model=model, prompt="Hello", max_tokens=8, extra_body=case.extra_body)
        status, param, message = 200, None, ""
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        status, param, message = exc.status_code, body.get("param"), str(body.get("message", exc.message))
    seconds = time.perf_counter() - started
    return {"case": case.name, "endpoint": "chat.completions (response_format=)" if chat else
            f"completions (extra_body {', '.join(case.extra_body)})", "status": status, "param": param,
            "message": message, "seconds": round(seconds, 3),
            "ok": case.answered_right(status, param, message)}


def probe_all(base_url: str, model: str) -> list[dict]:
    rows = []
    for case in cases():
        rows.append(probe(base_url, model, case))
        if set(case.extra_body) == {"response_format"}:
            rows.append(probe(base_url, model, case, chat=True))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| case | sent as | status | param | message | seconds |", "|---|---|---|---|---|---|"]
    for row in rows:
        message = row["message"] if len(row["message"]) <= 160 else row["message"][:157] + "..."
        lines.append(f"| {row['case']} | {row['endpoint']} | {row['status']} | {row['param']} | "
                     f"{message.replace('|', '¦')} | {row['seconds']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="start a stack (n-gram draft) on this model directory")
    parser.add_argument("--base-url", help="the /v1 URL of a running gateway (with --served-model)")
    parser.add_argument("--served-model", help="the model name the running gateway serves")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.model:
            from devkit.stack import running_stack

            services = stack.enter_context(running_stack(args.model, method="ngram", timeout_s=600))
            base_url, model = f"http://127.0.0.1:{services['gateway'].http_port}/v1", args.model
        elif args.base_url and args.served_model:
            base_url, model = args.base_url, args.served_model
        else:
            parser.error("give --model, or --base-url and --served-model")
        rows = probe_all(base_url, model)
    print(table(rows))
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        from bench.core.machine import FLAGS_THAT_MATTER, cpu_model_and_flags

        cpu, flags = cpu_model_and_flags()
        machine = {"cpu": cpu, "cpu_flags": [f for f in FLAGS_THAT_MATTER if f in flags]}
        pathlib.Path(args.out).write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
