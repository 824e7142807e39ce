"""The grammar compile child: `python -m specdec.decoding.grammar_compile_child`, started by
`grammar_worker.CompileWorker`; it compiles each constraint it is sent, as the engines do (`constraint_grammar`),
and says whether it compiled.

Frames on its pipes (grammar_worker.py): from the parent, the tokenizer's xgrammar TokenizerInfo JSON once, then one
serialized Constraint per compile; to the parent, b"ready" once, then per compile b"ok" or b"error" + a message for
the user.
"""

from __future__ import annotations

import ctypes
import signal
import sys

from specdec.decoding.grammar import GrammarError, constraint_grammar, does_not_compile
from specdec.decoding.grammar_worker import read_frame_blocking, write_frame
from specdec.v1 import common_pb2


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

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the parent's pipe
    info_json = read_frame_blocking(stdin)
    if info_json is None:
        return 0
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.deserialize_json(info_json.decode()), max_threads=1,
                                        cache_enabled=False)
    write_frame(stdout, b"ready")
    while (request := read_frame_blocking(stdin)) is not None:
        constraint = common_pb2.Constraint.FromString(request)
        try:
            compiler.compile_grammar(constraint_grammar(constraint))
        except GrammarError as exc:
            write_frame(stdout, b"error" + str(exc).encode())
            continue
        except (RuntimeError, ValueError) as exc:  # the compile's own errors
            write_frame(stdout, b"error" + str(does_not_compile(constraint.WhichOneof("kind"), exc)).encode())
            continue
        write_frame(stdout, b"ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
