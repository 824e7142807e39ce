"""Regenerate the Python code for protos/ (``make proto``), or check it is fresh.

``python tools/gen_protos.py`` writes specdec/v1/*_pb2*.py; ``--check`` regenerates
into a temporary directory and exits 1 if the committed files differ.
"""

from __future__ import annotations

import argparse
import filecmp
import pathlib
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PACKAGE_DIR = pathlib.Path("specdec") / "v1"


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    protos = sorted((PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    args = ["protoc", f"-I{PROTO_ROOT}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", *[str(p) for p in protos]]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the message above")
    return sorted((out_dir / PACKAGE_DIR).glob("*_pb2*.py*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the generated code is stale")
    check = parser.parse_args().check
    if not check:
        for path in generate(ROOT):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(pathlib.Path(tmp))}
        committed = {p.name: p for p in (ROOT / PACKAGE_DIR).glob("*_pb2*.py*")}
        stale = sorted(n for n in fresh.keys() | committed.keys()
                       if n not in fresh or n not in committed
                       or not filecmp.cmp(fresh[n], committed[n], shallow=False))
    if stale:
        print(f"generated code is stale: {', '.join(stale)}; run `make proto` and commit", file=sys.stderr)
        return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
