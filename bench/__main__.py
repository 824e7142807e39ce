"""python -m bench STUDY [options]: run one study; `python -m bench --help` lists them."""

from __future__ import annotations

import importlib
import sys

from bench import STUDIES


def usage() -> str:
    width = max(map(len, STUDIES))
    lines = ["usage: python -m bench STUDY [options]   (python -m bench STUDY --help for a study's options)", "",
             "studies:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in STUDIES.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0
    name = argv[0].replace("_", "-")
    if name not in STUDIES:
        print(f"python -m bench: no study {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(STUDIES[name][0])
    sys.argv[0] = f"python -m bench {name}"
    return module.main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
