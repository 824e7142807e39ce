"""Compiling constraints: errors name the problem, the size cap, the cache; the matcher's walk and rollback."""

import asyncio
import json

import pytest

from specdec.decoding.grammar import GrammarCompiler, GrammarError, unenforced_keywords
from specdec.modeling.models import load_tokenizer
from specdec.runtime.limits import MAX_CONSTRAINT_BYTES
from specdec.v1 import common_pb2


@pytest.fixture(scope="module")
def compiler(tiny_pair):
    tokenizer = load_tokenizer(str(tiny_pair[0]))
    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.convert_tokens_to_ids("<|im_end|>")])


@pytest.mark.parametrize("constraint, named", [
    (common_pb2.Constraint(regex="a(b"), "constraint.regex does not compile: Regex parsing error"),
    (common_pb2.Constraint(json_schema="{not json"), "constraint.json_schema is not valid JSON"),
    (common_pb2.Constraint(json_schema='{"type": 3}'), "constraint.json_schema does not compile"),
    (common_pb2.Constraint(json_schema='{"type": "integer", "multipleOf": 3}'), "unsupported keywords: multipleOf at #"),
    (common_pb2.Constraint(grammar="root ::= ("), "constraint.grammar does not compile"),
    (common_pb2.Constraint(choice=common_pb2.Choices()), "at least one string"),
    (common_pb2.Constraint(), "set one of"),
    (common_pb2.Constraint(regex="a" * (MAX_CONSTRAINT_BYTES + 1)), "over the limit"),
])
def test_bad_constraints_are_refused_by_name(compiler, constraint, named):
    with pytest.raises(GrammarError, match=named.replace("(", r"\(")) as raised:
        compiler.compile_now(constraint)
    assert "/project/" not in str(raised.value)  # no C++ source paths for users


def test_unenforced_keywords_are_found_in_subschemas_only():
    schema = {"type": "object", "properties": {"not": {"type": "array", "uniqueItems": True}},
              "$defs": {"x": {"anyOf": [{"if": {}}]}}}
    assert unenforced_keywords(schema) == ["uniqueItems at #/properties/not", "if at #/$defs/x/anyOf/0"]


def test_compiled_grammars_are_cached_by_constraint(compiler):
    first = asyncio.run(compiler.compile(common_pb2.Constraint(regex="[a-z]+")))
    assert compiler.compile_now(common_pb2.Constraint(regex="[a-z]+")) is first
    assert compiler.compile_now(common_pb2.Constraint(regex="[a-z]*")) is not first


def test_recursive_ref_compiles(compiler):
    tree = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}}
    compiler.compile_now(common_pb2.Constraint(json_schema=json.dumps(tree)))


def test_walk_cuts_at_the_first_forbidden_token_and_commit_rolls_back(compiler, tiny_pair):
    tokenizer = load_tokenizer(str(tiny_pair[0]))
    grammar = compiler.matcher(compiler.compile_now(common_pb2.Constraint(regex="[0-9]+")))
    digits, letter = tokenizer.convert_tokens_to_ids(["1", "2"]), tokenizer.convert_tokens_to_ids("a")
    assert grammar.walk([*digits, letter, digits[0]]) == 2
    grammar.commit(num_accepted=1, next_token=digits[0])  # drops the second digit, takes the recovered one
    assert grammar.walk([letter]) == 0
    grammar.commit(num_accepted=0, next_token=digits[1])
    assert grammar.matcher.accept_token(digits[0])  # still inside the regex: three digits taken so far


def test_compiles_past_the_queue_bound_are_refused_as_busy(compiler, monkeypatch):
    import threading

    from specdec.decoding import grammar as grammar_module

    release = threading.Event()
    real = compiler.compile_now
    monkeypatch.setattr(compiler, "compile_now", lambda c: (release.wait(10), real(c))[1])

    async def storm():
        tasks = [asyncio.ensure_future(compiler.compile(common_pb2.Constraint(regex=f"x{i}")))
                 for i in range(grammar_module.MAX_PENDING_COMPILES + 2)]
        await asyncio.sleep(0.1)
        release.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(storm())
    busy = [r for r in results if isinstance(r, grammar_module.GrammarBusy)]
    assert len(busy) == 2 and all(not isinstance(r, Exception) for r in results if r not in busy)


def test_a_compile_past_its_deadline_is_refused_as_too_complex_and_the_next_compiles(tiny_pair):
    # Optional properties make xgrammar's compile slow (quadratic in their number), whatever the size caps say.
    tokenizer = load_tokenizer(str(tiny_pair[0]))
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.convert_tokens_to_ids("<|im_end|>")],
                               timeout_s=0.5)
    def compile_now(constraint):  # on the compile thread, as the services compile
        return compiler.submit(compiler.compile_now, constraint).result()

    try:
        compile_now(common_pb2.Constraint(regex="[a-z]+"))  # the child's start is not charged to a compile
        child = compiler._worker._child
        slow = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}
        with pytest.raises(GrammarError, match=r"constraint.json_schema is too complex: .* within 0.5 s of compile "
                                               r"time \(--grammar-compile-timeout-s\)"):
            compile_now(common_pb2.Constraint(json_schema=json.dumps(slow)))
        assert child.poll() is not None  # killed, not left compiling
        compiler.timeout_s = compiler._worker.timeout_s = 30.0  # a restart may take a while on a loaded machine
        compile_now(common_pb2.Constraint(regex="[0-9]+"))
    finally:
        compiler.close()


def test_a_compile_child_that_died_is_replaced(compiler):
    compiler.compile_now(common_pb2.Constraint(regex="[a-c]+"))
    compiler._worker._child.kill()
    compiler._worker._child.wait()
    grammar = compiler.matcher(compiler.compile_now(common_pb2.Constraint(regex="[d-f]+")))
    assert grammar.walk([]) == 0
