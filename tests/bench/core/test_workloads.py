"""The repetitive workloads: they parse, keep their order, and repeat what production traffic repeats."""

import collections
import importlib.util
import json

import pytest

from bench.core.workloads import (DEFAULT_WORKLOADS, EXTRA_WORKLOADS, REPETITIVE_WORKLOADS, SCHEMA_WORKLOADS,
                                  WORKLOAD_DIR, chatml_conversation, load_workload, parse_workloads)
from specdec.decoding.chat_format import chatml


def _generator():
    spec = importlib.util.spec_from_file_location("make_repetitive", WORKLOAD_DIR / "make_repetitive.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lines(name):
    return [json.loads(line) for line in (WORKLOAD_DIR / f"{name}.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", REPETITIVE_WORKLOADS)
def test_repetitive_workloads_parse_in_file_order(name):
    prompts = load_workload(name)
    assert [p.id for p in prompts] == [line["id"] for line in _lines(name)]
    assert [p.position for p in prompts] == list(range(len(prompts)))
    assert len({p.id for p in prompts}) == len(prompts) >= 20
    for p in prompts:
        assert p.text.startswith("<|im_start|>") and p.text.endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert 48 <= p.max_tokens <= 96 and p.temperature == 0.0
        assert len(p.text) < 2400  # a few hundred tokens: prefill stays small on 2 cores


def test_extraction_has_20_plus_records_and_one_schema():
    generator = _generator()
    prompts = [line["prompt"] for line in _lines("extraction")]
    assert len(prompts) >= 20
    assert all(p.startswith(generator.EXTRACTION_INSTRUCTION) for p in prompts)  # schema and example: same text
    assert all(p.count(generator.EXTRACTION_SCHEMA) == 1 for p in prompts)
    records = [p[len(generator.EXTRACTION_INSTRUCTION):] for p in prompts]
    assert len(set(records)) == len(records)
    kinds = {line_id.split("_")[0] for line_id in (line["id"] for line in _lines("extraction"))}
    assert kinds == {"invoice", "person", "product", "order", "event"}


def test_agent_loop_is_one_system_prompt_and_growing_conversations():
    lines = _lines("agent_loop")
    assert len({line["system"] for line in lines}) == 1 and "find_customer(email)" in lines[0]["system"]
    tasks = collections.defaultdict(list)
    for line in lines:
        tasks[line["id"].rsplit("_", 1)[0]].append(line)
    assert len(tasks) >= 4
    for turns in tasks.values():
        assert len(turns) >= 3
        for earlier, later in zip(turns, turns[1:]):  # each request is the previous one plus a call and its result
            assert later["messages"][:len(earlier["messages"])] == earlier["messages"]
            call, result = later["messages"][len(earlier["messages"]):]
            assert call["role"] == "assistant" and set(json.loads(call["content"])) == {"tool", "arguments"}
            assert result["role"] == "user" and result["content"].startswith("Tool result: ")


def test_sql_shares_one_schema_over_20_plus_questions():
    generator = _generator()
    prompts = [line["prompt"] for line in _lines("sql")]
    assert len(prompts) >= 20 and len(set(prompts)) == len(prompts)
    assert all(p.startswith(generator.SQL_INSTRUCTION) and "CREATE TABLE order_items" in p for p in prompts)


def test_faq_repeats_questions_exactly_and_nearly():
    lines = _lines("faq")
    questions = [line["prompt"] for line in lines]
    assert len({line["system"] for line in lines}) == 1
    counts = collections.Counter(questions)
    assert sum(n - 1 for n in counts.values()) >= 6  # exact repeats
    lowered = collections.Counter(q.lower().rstrip("?") for q in questions)
    assert len(lowered) < len(counts)  # near-duplicates that differ only in case and punctuation
    assert sum("password" in q.lower() for q in questions) >= 5


def test_code_writes_and_refactors_code_given_in_the_prompt():
    """20+ distinct code requests in several languages; the refactors carry their code, so the output copies it."""
    prompts = load_workload("code")
    texts = [line["prompt"] for line in _lines("code")]
    assert len(prompts) >= 20 and len({p.id for p in prompts}) == len(set(texts)) == len(prompts)
    assert all(p.temperature == 0.0 and 48 <= p.max_tokens <= 160 for p in prompts)
    refactors = [t for t in texts if "```python\n" in t]
    assert len(refactors) >= 8 and all(t.count("def ") >= 1 for t in refactors)
    for kind in ("bash", "sqlite3", "JavaScript", "class"):
        assert any(kind in t for t in texts), kind


def test_shipped_files_are_what_the_generator_writes(tmp_path, monkeypatch):
    generator = _generator()
    monkeypatch.setattr(generator, "__file__", str(tmp_path / "make_repetitive.py"))
    generator.main()
    for name in [*REPETITIVE_WORKLOADS, "function_calling"]:
        assert (tmp_path / f"{name}.jsonl").read_text() == (WORKLOAD_DIR / f"{name}.jsonl").read_text()


@pytest.mark.parametrize("name", SCHEMA_WORKLOADS)
def test_schema_workloads_carry_a_schema_their_examples_validate_against(name):
    """Every line's schema is a JSON Schema that the prompt's own examples (the few-shot answers, the earlier tool
    calls) validate against, and it travels to the prompt as a strict constraint."""
    import jsonschema

    prompts = load_workload(name)
    assert len(prompts) >= 20
    for prompt, line in zip(prompts, _lines(name)):
        jsonschema.Draft202012Validator.check_schema(prompt.schema)
        assert prompt.constraint().strict and json.loads(prompt.constraint().json_schema) == line["schema"]
        answers = [m["content"] for m in line.get("messages", []) if m["role"] == "assistant"]
        answers += [line["prompt"].rsplit("JSON: ", 1)[1].split("\n")[0]] if "prompt" in line else []
        assert answers, line["id"]
        for answer in answers:
            jsonschema.validate(json.loads(answer), prompt.schema)


def test_function_calling_constrains_each_tools_arguments():
    """24 requests over 6 tools; an answer's arguments must follow its own tool's schema, not another's."""
    import jsonschema

    prompts = load_workload("function_calling")
    assert len(prompts) >= 20 and len({p.id for p in prompts}) == len(prompts)
    schema = prompts[0].schema
    tools = {branch["properties"]["name"]["const"] for branch in schema["anyOf"]}
    assert len(tools) == 6 and all(p.schema == schema for p in prompts)
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius", "days": 5}}, schema)
    for wrong in ({"name": "get_weather", "arguments": {"city": "Oslo", "unit": "kelvin", "days": 5}},
                  {"name": "get_weather", "arguments": {"recipient": "Anna", "channel": "sms", "body": "hi"}},
                  {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius", "days": 9}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)


def test_conversation_format(tmp_path):
    path = tmp_path / "mine.jsonl"
    lines = [{"id": "a", "prompt": "hi"},
             {"id": "b", "system": "S", "prompt": "hi"},
             {"id": "c", "system": "S", "messages": [{"role": "user", "content": "u"},
                                                     {"role": "assistant", "content": "x"},
                                                     {"role": "user", "content": "v"}]},
             {"id": "d", "prompt": "raw", "chat": False}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    a, b, c, d = load_workload(str(path))
    assert a.text == chatml("hi") and a.workload == "mine"
    assert b.text == "<|im_start|>system\nS<|im_end|>\n" + chatml("hi")
    assert c.text == chatml_conversation([{"role": "system", "content": "S"}, *lines[2]["messages"]])
    assert c.text.endswith("<|im_start|>user\nv<|im_end|>\n<|im_start|>assistant\n")
    assert d.text == "raw" and d.position == 3
    path.write_text(json.dumps({"id": "e", "prompt": "p", "messages": []}) + "\n")
    with pytest.raises(ValueError, match="exactly one of 'prompt' and 'messages'"):
        load_workload(str(path))


def test_workload_sets():
    assert parse_workloads("default") == DEFAULT_WORKLOADS
    assert DEFAULT_WORKLOADS[:4] == REPETITIVE_WORKLOADS and len(DEFAULT_WORKLOADS) == 9
    assert parse_workloads("faq, repetitive,chat") == ["faq", "extraction", "agent_loop", "sql", "chat"]
    assert parse_workloads("all") == DEFAULT_WORKLOADS + EXTRA_WORKLOADS and "code" not in DEFAULT_WORKLOADS
    with pytest.raises(ValueError, match="unknown workload"):
        parse_workloads("faq,nope")


def test_chat_questions_are_20_distinct_free_questions_kept_out_of_the_default_run():
    prompts = load_workload("chat_questions")
    chat = {p.text for p in load_workload("chat")}
    assert len({p.id for p in prompts}) == len(prompts) == 20 and "chat_questions" not in DEFAULT_WORKLOADS
    for p in prompts:
        assert p.text.startswith("<|im_start|>user\n") and p.text.endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert p.text not in chat and p.temperature == 0.0 and p.max_tokens == 64
