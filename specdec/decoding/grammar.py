"""Structured outputs: a Constraint (common.proto) compiled by xgrammar, and one sequence's grammar matcher.

`GrammarCompiler` turns a Constraint into a compiled grammar for one tokenizer, on a worker thread, with
a size cap, a deadline (the compile runs in a child process that is killed past it: grammar_worker.py) and a cache
keyed by a hash of the constraint. `SequenceGrammar` holds one sequence's matcher:
per round it walks the draft (cutting it at the first token the grammar forbids), masks the target's
logits row by row, and after the verdict rolls back to the accepted length and takes the next token, so
the matcher's position moves with the KV cache's.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import re
import threading

import torch

from specdec.decoding.grammar_worker import CompileFailed, CompileTimeout, CompileWorker
from specdec.runtime.config import option
from specdec.runtime.limits import constraint_problems
from specdec.v1 import common_pb2

# xgrammar's errors start with a time and its C++ source line ("[18:54:12] /project/cpp/x.cc:83: "): not for users.
XGRAMMAR_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")
CONTROL = re.compile("[\x00-\x1f]")
# Compiles waiting or running at most; past this a new constraint is refused as busy (retry later). Compiles
# run one at a time on their own thread, so they never take more than one core from the model.
MAX_PENDING_COMPILES = 4
# Compiled grammars kept, most recently used first.
CACHE_ENTRIES = 256


# JSON Schema keywords the grammar engine would ignore: a schema that uses one could yield output that does
# not validate, so it is refused by name instead.
UNENFORCED_KEYWORDS = frozenset({
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "uniqueItems",
    "contains", "minContains", "maxContains", "multipleOf", "unevaluatedProperties", "unevaluatedItems"})
# Keywords whose value is a map of names to subschemas, one subschema, or a list of them.
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "additionalItems", "propertyNames")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def unenforced_keywords(schema, path: str = "#") -> list[str]:
    """Where the schema uses a keyword the grammar does not enforce, as 'keyword at path' (walks subschemas
    only, so a property named "not" is no keyword)."""
    if not isinstance(schema, dict):
        return []
    found = [f"{key} at {path}" for key in schema if key in UNENFORCED_KEYWORDS]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                found += unenforced_keywords(sub, f"{path}/{key}/{name}")
    for key in _SUBSCHEMA_ONE:
        found += unenforced_keywords(schema.get(key), f"{path}/{key}")
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                found += unenforced_keywords(sub, f"{path}/{key}/{i}")
    return found


@dataclasses.dataclass(frozen=True)
class GrammarCompileConfig:
    """Structured outputs"""

    grammar_compile_timeout_s: float = option(
        10.0, "a constraint whose grammar takes more CPU time than this to compile is refused as too complex (the "
              "compile runs in a child process, killed at the deadline, so it holds no queue; six times this in wall "
              "time is the backstop); the size caps do not bound the compile time: a schema of 2,000 optional "
              "properties takes about a minute")

    def __post_init__(self):
        if self.grammar_compile_timeout_s <= 0:
            raise ValueError(f"--grammar-compile-timeout-s must be positive, got {self.grammar_compile_timeout_s}")


class GrammarError(ValueError):
    """The constraint is invalid (maps to INVALID_ARGUMENT / HTTP 400); the message names the problem."""


class GrammarBusy(RuntimeError):
    """Too many constraints are compiling (maps to RESOURCE_EXHAUSTED / HTTP 429): retry shortly."""


def constraint_set(constraint: common_pb2.Constraint | None) -> bool:
    return constraint is not None and constraint.WhichOneof("kind") is not None


def constraint_key(constraint: common_pb2.Constraint) -> str:
    """A stable hash of the constraint (the cache's key)."""
    return hashlib.sha256(constraint.SerializeToString(deterministic=True)).hexdigest()


def constraint_grammar(constraint: common_pb2.Constraint):
    """The constraint as an xgrammar Grammar (no tokenizer needed): the one grammar both engines and the draft
    enforce. JSON is compact (`", "` and `": "`, no free whitespace); json_schema holds objects to their named
    properties when constraint.strict. Raises GrammarError naming the problem."""
    import xgrammar

    kind = constraint.WhichOneof("kind")
    try:
        if kind == "json_schema":
            try:
                schema = json.loads(constraint.json_schema)
            except json.JSONDecodeError as exc:
                raise GrammarError(f"constraint.json_schema is not valid JSON: {exc}") from None
            if not isinstance(schema, (dict, bool)):
                raise GrammarError("constraint.json_schema must be a JSON object (a schema)")
            unenforced = unenforced_keywords(schema)
            if unenforced:
                raise GrammarError(f"constraint.json_schema uses unsupported keywords: {', '.join(unenforced[:5])}"
                                   " (structured outputs cannot enforce them); remove them from the schema")
            return xgrammar.Grammar.from_json_schema(constraint.json_schema, strict_mode=constraint.strict,
                                                     any_whitespace=False)
        if kind == "json_object":
            return xgrammar.Grammar.from_json_schema('{"type": "object"}', strict_mode=False, any_whitespace=False)
        if kind == "regex":
            return xgrammar.Grammar.from_regex(constraint.regex)
        if kind == "choice":
            values = list(constraint.choice.values)
            if not values:
                raise GrammarError("constraint.choice must hold at least one string")
            # Each choice as an EBNF string literal; JSON's escapes are the EBNF's.
            return xgrammar.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(v, ensure_ascii=False)
                                                                        for v in values))
        return xgrammar.Grammar.from_ebnf(constraint.grammar)
    except GrammarError:
        raise
    except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar's parse and schema errors
        raise does_not_compile(kind, exc) from None


def does_not_compile(kind: str, exc: Exception) -> GrammarError:
    """The user's error for an xgrammar error on constraint.<kind>: its first line, without its log prefix."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return GrammarError(f"constraint.{kind} does not compile: {XGRAMMAR_LOG_PREFIX.sub('', message)}")


class GrammarCompiler:
    """Compiles constraints for one tokenizer; thread safe; caches by constraint hash."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int],
                 timeout_s: float = GrammarCompileConfig.grammar_compile_timeout_s):
        """vocab_size: the model's (its logits' width, which may exceed the tokenizer's); timeout_s: a compile's
        deadline (GrammarCompileConfig)."""
        import xgrammar

        self._xgr = xgrammar
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.timeout_s = timeout_s
        self._worker: CompileWorker | None = None  # its child process (on the compile thread, which owns it)
        self._compiler = None  # xgrammar's, in this process: compiles what the child has shown to compile in time
        self._tokenizer = tokenizer
        self._control_tokens: frozenset[int] | None = None  # built at the first JSON constraint
        self._cache: collections.OrderedDict[str, object] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
        self._pending = 0
        # the child starts now, in the background (importing xgrammar takes seconds): the first constraint should
        # not wait for it, and a draft that does not wait for its grammar would draft the first requests without it
        self._thread.submit(self._started_worker)

    async def compile(self, constraint: common_pb2.Constraint):
        """The compiled grammar: from the cache at once, else compiled on the compile thread (the event loop
        keeps serving). Raises GrammarError for a bad constraint, GrammarBusy when the compile queue is full."""
        with self._lock:
            cached = self._cache.get(constraint_key(constraint)) if constraint.WhichOneof("kind") else None
        if cached is not None:
            return cached
        return await asyncio.wrap_future(self.submit(self.compile_now, constraint))

    def submit(self, fn, *args) -> concurrent.futures.Future:
        """fn(*args) on the compile thread, for compile_now or work built on it (the draft's matcher); from any
        thread. Raises GrammarBusy when MAX_PENDING_COMPILES are waiting or running already."""
        with self._lock:
            if self._pending >= MAX_PENDING_COMPILES:
                raise GrammarBusy(f"{self._pending} constraints are compiling already; retry shortly")
            self._pending += 1
        future = self._thread.submit(fn, *args)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future) -> None:
        with self._lock:
            self._pending -= 1

    def compile_now(self, constraint: common_pb2.Constraint):
        kind = constraint.WhichOneof("kind")
        if kind is None:
            raise GrammarError("constraint: set one of json_schema, json_object, regex, choice, grammar")
        problems = constraint_problems(constraint)
        if problems:
            raise GrammarError(problems[0])
        key = constraint_key(constraint)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        compiled = self._compile(kind, constraint)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, kind: str, constraint: common_pb2.Constraint):
        try:
            self._started_worker().check(constraint)  # under the deadline, in the child
        except CompileTimeout:  # the child was killed: its successor starts now, not at the next compile
            self._thread.submit(self._started_worker)
            raise GrammarError(
                f"constraint.{kind} is too complex: its grammar did not compile within {self.timeout_s:g} s of "
                "compile time (--grammar-compile-timeout-s); simplify it (fewer optional properties or alternatives, "
                "shallower nesting)") from None
        except CompileFailed as exc:
            raise GrammarError(str(exc) if str(exc).startswith("constraint.")
                               else f"constraint.{kind}: {exc}") from None
        # known to finish: it just compiled in the child (whose compiled grammar is too large to pass back)
        if self._compiler is None:
            self._compiler = self._xgr.GrammarCompiler(self._worker.tokenizer_info, max_threads=1)
        return self._compiler.compile_grammar(constraint_grammar(constraint))

    def _started_worker(self) -> CompileWorker:
        """On the compile thread: the worker, its child started (a failed start is retried at the next compile)."""
        if self._worker is None:  # once: it reads the whole vocabulary
            info = self._xgr.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=self.vocab_size,
                                                            stop_token_ids=self.stop_token_ids)
            self._worker = CompileWorker(info, self.timeout_s)
        self._worker.start()
        return self._worker

    def close(self) -> None:
        """Stop the compile child (a later compile starts a new one)."""
        if self._worker is not None:
            self._worker.close()

    def matcher(self, compiled, constraint: common_pb2.Constraint | None = None) -> SequenceGrammar:
        """A fresh matcher for one sequence. A JSON constraint also bans tokens holding a raw control character:
        xgrammar's JSON strings admit them, but JSON does not (they must be escaped), and compact JSON needs no
        raw newline or tab anywhere."""
        banned = frozenset()
        if constraint is not None and constraint.WhichOneof("kind") in ("json_schema", "json_object"):
            banned = self.control_tokens()
        return SequenceGrammar(self._xgr, compiled, self.vocab_size, self.stop_token_ids, banned)

    def control_tokens(self) -> frozenset[int]:
        """Ids of the tokens whose text holds a control character (U+0000..U+001F)."""
        if self._control_tokens is None:
            texts = self._tokenizer.batch_decode([[i] for i in range(len(self._tokenizer))])
            self._control_tokens = frozenset(i for i, text in enumerate(texts) if CONTROL.search(text)
                                             and i not in self.stop_token_ids)
        return self._control_tokens


class SequenceGrammar:
    """One sequence's grammar position. Invariant: the matcher has accepted exactly the completion so far."""

    def __init__(self, xgrammar_module, compiled, vocab_size: int, stop_token_ids: list[int],
                 banned: frozenset[int] = frozenset()):
        """banned: token ids forbidden on top of the grammar."""
        self._xgr = xgrammar_module
        self.banned = banned
        self._banned_ids = torch.tensor(sorted(banned), dtype=torch.long)  # [num_banned]
        self.vocab_size = vocab_size
        self.stop_token_ids = set(stop_token_ids)
        self.matcher = xgrammar_module.GrammarMatcher(compiled)
        self._walked = 0
        self._bitmask = None

    def walk(self, draft_token_ids: list[int]) -> int:
        """Advance over the draft as far as the grammar allows, filling one mask row per position.

        Returns n, the allowed draft length: rows 0..n of the mask are filled (row i: what may follow
        the completion plus draft[:i]). A stop token in the draft ends the walk before it (the target
        emits it itself from that row). The caller cuts the block to n, scores it, masks, decides, then
        calls `commit`.
        """
        k = len(draft_token_ids)
        self._bitmask = self._xgr.allocate_token_bitmask(k + 1, self.vocab_size)  # [k + 1, ceil(V / 32)] int32
        n = 0
        while True:
            self.matcher.fill_next_token_bitmask(self._bitmask, n)
            if n == k:
                break
            token = draft_token_ids[n]
            if token in self.stop_token_ids or token in self.banned or not (0 <= token < self.vocab_size) \
                    or not self.matcher.accept_token(token):
                break
            n += 1
        self._walked = n
        return n

    @torch.inference_mode()  # the engine's logits are inference tensors: updated in place only in this mode
    def mask(self, logits: torch.Tensor) -> None:
        """logits: [n + 1, V] float32 on CPU, one row per walked position: forbidden tokens become -inf."""
        rows = logits.shape[0]
        self._xgr.apply_token_bitmask_inplace(logits, self._bitmask[:rows].to(logits.device),
                                              vocab_size=self.vocab_size)
        if len(self._banned_ids):
            logits[:, self._banned_ids.to(logits.device)] = float("-inf")

    def commit(self, num_accepted: int, next_token: int) -> None:
        """Roll back the drafts the verdict rejected, then take the round's last token (recovered or bonus)."""
        if self._walked > num_accepted:
            self.matcher.rollback(self._walked - num_accepted)
        if not self.matcher.is_terminated():
            self.matcher.accept_token(next_token)
        self._walked = 0
