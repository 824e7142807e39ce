"""Grammar compiles in a child process, so that one past its deadline can be abandoned.

xgrammar's compile runs in C++ and cannot be interrupted: a schema of a few thousand optional properties takes a
minute, though it passes every size cap. Run on a thread, such a compile would hold the compile queue for as long
as it takes. Here it runs in a child process (`python -m specdec.decoding.grammar_compile_child`) that is killed at
the deadline and started afresh; the constraint is then refused as too complex, naming the limit. The deadline is
the child's CPU time on the compile, so a busy machine does not turn a simple schema into a "too complex" one;
WALL_FACTOR times it in wall time is the backstop where the child's CPU time cannot be read (not Linux) or the
machine starves it.

The child holds the tokenizer's xgrammar TokenizerInfo (sent once, serialized) and compiles each constraint it is
sent with `constraint_grammar`, the same conversion the engines use, and answers only whether it compiled: the
compiled grammar itself is too large to pass back (a schema of 1,500 required properties serializes to 532 MB of
JSON, 25 s of CPU to write and 9 s to read, against 0.2 s to compile). The service then compiles the constraint
itself, known to finish: the same compile, on the same machine, just did. Frames on the pipes: an 8-byte big-endian
length, then the payload. Parent to child: the TokenizerInfo JSON, then one serialized Constraint per compile.
Child to parent: b"ready" once, then per compile b"ok", or b"error" + a message for the user.
"""

from __future__ import annotations

import os
import select
import struct
import subprocess
import sys
import time

from specdec.v1 import common_pb2

_LENGTH = struct.Struct(">Q")
# Importing xgrammar imports torch: the child's start-up takes seconds, and is not charged to a compile.
START_TIMEOUT_S = 120.0
WALL_FACTOR = 6.0  # the wall-clock backstop: this many times the CPU-time deadline
POLL_S = 0.05  # how often the child's CPU time is read while it compiles
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


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

    def check(self, constraint: common_pb2.Constraint) -> None:
        """Compile the constraint in the child. Raises CompileTimeout past timeout_s (and kills the child),
        CompileFailed when the constraint does not compile or the child dies."""
        child = self.start()
        deadline = time.monotonic() + WALL_FACTOR * self.timeout_s
        cpu_deadline = (_cpu_seconds(child.pid) or 0.0) + self.timeout_s
        try:
            write_frame(child.stdin, constraint.SerializeToString())
            answer = _read(child.stdout, deadline, lambda: (_cpu_seconds(child.pid) or 0.0) > cpu_deadline)
        except (CompileTimeout, EOFError, OSError) as exc:
            self.close()
            if isinstance(exc, CompileTimeout):
                raise
            raise CompileFailed(f"the grammar compiler exited while compiling it ({type(exc).__name__})") from None
        if answer.startswith(b"error"):
            raise CompileFailed(answer[len(b"error"):].decode())

    def start(self) -> subprocess.Popen:
        """The child, started if it is not running. Raises CompileFailed when it does not start."""
        if self._child is not None and self._child.poll() is None:
            return self._child
        child = subprocess.Popen([sys.executable, "-m", "specdec.decoding.grammar_compile_child"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            write_frame(child.stdin, self._info_json)
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


def write_frame(pipe, payload: bytes) -> None:
    """One frame: its length, then its payload (both sides)."""
    pipe.write(_LENGTH.pack(len(payload)) + payload)
    pipe.flush()


def _read(pipe, deadline: float, over_budget=lambda: False) -> bytes:
    """One frame from a pipe of the child's; CompileTimeout at the (wall) deadline or once over_budget() (the child's
    CPU time), EOFError if the child closed it."""
    length = _LENGTH.unpack(_read_exactly(pipe.fileno(), _LENGTH.size, deadline, over_budget))[0]
    return _read_exactly(pipe.fileno(), length, deadline, over_budget)


def _read_exactly(fd: int, size: int, deadline: float, over_budget=lambda: False) -> bytes:
    chunks = []
    while size:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or over_budget():
            raise CompileTimeout
        if not select.select([fd], [], [], min(remaining, POLL_S))[0]:
            continue
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _cpu_seconds(pid: int) -> float | None:
    """A process's CPU time so far (user + system), from /proc; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime: the stat's 14th and 15th fields
    except (OSError, IndexError, ValueError):
        return None


def read_frame_blocking(pipe) -> bytes | None:
    """The child's side: one frame from stdin, None at its end (the parent closed it or exited)."""
    head = pipe.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    return pipe.read(_LENGTH.unpack(head)[0])
