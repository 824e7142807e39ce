"""Grammar compiles in a child process, so that one past its deadline can be abandoned.

xgrammar's compile runs in C++ and cannot be interrupted: a schema of a few thousand optional properties takes a
minute, though it passes every size cap. Run on a thread, such a compile would hold the compile queue for as long
as it takes. Here it runs in a child process (`python -m specdec.decoding.grammar_worker`) that is killed at the
deadline and started afresh at the next compile; the constraint is then refused as too complex, naming the limit.

The child holds the tokenizer's xgrammar TokenizerInfo (sent once, serialized) and compiles each constraint it is
sent with `constraint_grammar`, the same conversion the engines use; the parent deserializes the compiled grammar
against its own TokenizerInfo. Frames on the pipes: an 8-byte big-endian length, then the payload. Parent to child:
the TokenizerInfo JSON, then one serialized Constraint per compile. Child to parent: b"ready" once, then per compile
b"ok" + the compiled grammar's JSON, or b"error" + a message for the user.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import struct
import subprocess
import sys
import time

from specdec.v1 import common_pb2

_LENGTH = struct.Struct(">Q")
# Importing xgrammar imports torch: the child's start-up takes seconds, and is not charged to a compile.
START_TIMEOUT_S = 120.0


class CompileTimeout(Exception):
    """The compile did not finish within its deadline; the child was killed."""


class CompileFailed(Exception):
    """The child refused the constraint (its message is for the user) or died while compiling it."""


class CompileWorker:
    """One child process that compiles constraints, one at a time; not thread safe (the compile thread owns it)."""

    def __init__(self, tokenizer_info, timeout_s: float):
        """tokenizer_info: xgrammar.TokenizerInfo of the tokenizer (the child gets it serialized)."""
        self.tokenizer_info = tokenizer_info
        self.timeout_s = timeout_s
        self._info_json = tokenizer_info.serialize_json().encode()
        self._child: subprocess.Popen | None = None

    def compile(self, constraint: common_pb2.Constraint):
        """The compiled grammar (xgrammar.CompiledGrammar). Raises CompileTimeout past timeout_s (and kills the
        child), CompileFailed when the constraint does not compile or the child dies."""
        import xgrammar

        child = self.start()
        deadline = time.monotonic() + self.timeout_s
        try:
            _write(child.stdin, constraint.SerializeToString())
            answer = _read(child.stdout, deadline)
        except (CompileTimeout, EOFError, OSError) as exc:
            self.close()
            if isinstance(exc, CompileTimeout):
                raise
            raise CompileFailed(f"the grammar compiler exited while compiling it ({type(exc).__name__})") from None
        if answer.startswith(b"error"):
            raise CompileFailed(answer[len(b"error"):].decode())
        return xgrammar.CompiledGrammar.deserialize_json(answer[len(b"ok"):].decode(), self.tokenizer_info)

    def start(self) -> subprocess.Popen:
        """The child, started if it is not running. Raises CompileFailed when it does not start."""
        if self._child is not None and self._child.poll() is None:
            return self._child
        child = subprocess.Popen([sys.executable, "-m", "specdec.decoding.grammar_worker"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE)
        try:
            _write(child.stdin, self._info_json)
            if _read(child.stdout, time.monotonic() + START_TIMEOUT_S) != b"ready":
                raise EOFError("no ready frame")
        except (CompileTimeout, EOFError, OSError) as exc:
            _kill(child)
            raise CompileFailed(f"the grammar compiler did not start ({type(exc).__name__})") from None
        self._child = child
        return child

    def close(self) -> None:
        if self._child is not None:
            _kill(self._child)
            self._child = None


def _kill(child: subprocess.Popen) -> None:
    child.kill()
    child.wait()
    for pipe in (child.stdin, child.stdout):
        pipe.close()


def _write(pipe, payload: bytes) -> None:
    pipe.write(_LENGTH.pack(len(payload)) + payload)
    pipe.flush()


def _read(pipe, deadline: float) -> bytes:
    """One frame from a pipe of the child's; CompileTimeout at the deadline, EOFError if the child closed it."""
    length = _LENGTH.unpack(_read_exactly(pipe.fileno(), _LENGTH.size, deadline))[0]
    return _read_exactly(pipe.fileno(), length, deadline)


def _read_exactly(fd: int, size: int, deadline: float) -> bytes:
    chunks = []
    while size:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise CompileTimeout
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _read_blocking(pipe) -> bytes | None:
    """The child's side: one frame from stdin, None at its end (the parent closed it or exited)."""
    head = pipe.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    return pipe.read(_LENGTH.unpack(head)[0])


def _die_with_parent() -> None:
    """Ctrl-C is the parent's to handle; the parent's death, however it comes, ends this child (Linux)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the closed stdin ends it after the compile in hand
        pass


def main() -> int:
    _die_with_parent()
    import xgrammar

    from specdec.decoding.grammar import GrammarError, constraint_grammar, xgrammar_message

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the parent's pipe
    info_json = _read_blocking(stdin)
    if info_json is None:
        return 0
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.deserialize_json(info_json.decode()), max_threads=1,
                                        cache_enabled=False)
    _write(stdout, b"ready")
    while (request := _read_blocking(stdin)) is not None:
        constraint = common_pb2.Constraint.FromString(request)
        try:
            compiled = compiler.compile_grammar(constraint_grammar(constraint))
        except GrammarError as exc:
            _write(stdout, b"error" + str(exc).encode())
            continue
        except (RuntimeError, ValueError) as exc:  # the compile's own errors
            kind = constraint.WhichOneof("kind")
            _write(stdout, b"error" + f"constraint.{kind} does not compile: {xgrammar_message(exc)}".encode())
            continue
        _write(stdout, b"ok" + compiled.serialize_json().encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
