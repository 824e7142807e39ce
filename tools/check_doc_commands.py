"""Check that the commands the docs give still run: python tools/check_doc_commands.py README.md docs/results/*.md

Finds shell commands in fenced code blocks and in inline code (`python -m ...`, `make ...`, `curl ...`), then:
- `python -m bench STUDY ...`: parses the arguments with the study's own parser (flags, choices, model paths);
- any other `python -m MODULE ...`: checks that `python -m MODULE --help` runs;
- `make TARGET ...`: checks that `make -n TARGET` knows the target;
- `curl ...` (only with --live): runs it against a running stack and checks that it answers 2xx.
A command with a placeholder (DIR, FILE, <...>) or a model that is not fetched here is listed as skipped.
Exits 1 if any command fails.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
STARTS = ("python", ".venv/bin/python", "make ", "curl ")
PLACEHOLDER = re.compile(r"\b(DIR|FILE|PATH|HOST|PORT|SET|NAME|N|K|F|X|CURVE|SWEEP\.json|RESULTS\.json)\b|<[^>]+>|\.\.\.|\$")


@dataclasses.dataclass
class Check:
    source: str
    command: str
    mention: bool = False  # inline code naming a command (and maybe a flag), not a whole command line
    status: str = "skipped"  # ok | failed | skipped
    why: str = ""


def balanced(text: str) -> bool:
    try:
        shlex.split(text)
    except ValueError:
        return False
    return True


def commands(path: pathlib.Path) -> list[tuple[str, str, bool]]:
    """(where, command, mention) for every shell command in a markdown file; $VAR set earlier in it expanded."""
    found, fenced, pending, variables = [], False, "", {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if fenced:
            text = pending + line.strip().removeprefix("$ ")
            if text.endswith("\\") or (pending and not balanced(text)) or (text.startswith(STARTS) and not balanced(text)):
                pending = text.removesuffix("\\") + " "
                continue
            pending = ""
            assignment = re.fullmatch(r"([A-Z_][A-Z0-9_]*)=(\S+)", text)
            if assignment:
                variables[assignment.group(1)] = assignment.group(2)
            for name, value in variables.items():
                text = re.sub(r"\$\{?" + name + r"\b\}?", value, text)
            if text.startswith(STARTS):
                found.append((f"{path.name}:{number}", text, False))
        else:
            found += [(f"{path.name}:{number}", code, True) for code in re.findall(r"`([^`]+)`", line)
                      if code.startswith(STARTS)]
    return found


def strip_comment(command: str) -> str:
    return re.split(r"\s+#\s", command, maxsplit=1)[0].strip()


def options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of a parser and of its sub-commands."""
    known = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                known |= options(sub)
    return known


def check_bench(args: list[str], mention: bool) -> tuple[str, str]:
    from bench import STUDIES

    if args[:1] in ([], ["--help"], ["-h"]):
        return "ok", "lists the studies"
    if args[0].replace("_", "-") not in STUDIES:
        return "failed", f"no study {args[0]!r}"
    module = __import__(STUDIES[args[0].replace("_", "-")][0], fromlist=["build_parser"])
    if mention:  # `python -m bench STUDY --flag`: the study and the flags it names exist
        known = options(module.build_parser())
        unknown = [word for word in args[1:] if word.startswith("--") and word.split("=")[0] not in known]
        return ("failed", f"no option {', '.join(unknown)}") if unknown else ("ok", "names a study and its options")
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            module.build_parser().parse_args(args[1:])
    except SystemExit as exc:
        if exc.code:
            message = errors.getvalue().strip().splitlines()[-1] if errors.getvalue().strip() else f"exit {exc.code}"
            if ".cache/models/" in message and "is not a directory" in message:
                return "skipped", "model not fetched here: " + message.split("'")[1]
            return "failed", message
    return "ok", "parses"


@functools.cache
def module_help(module: str) -> tuple[str, str]:
    """Whether `python -m MODULE --help` runs (once per module)."""
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    if done.returncode == 0:
        return "ok", "--help runs"
    return "failed", (done.stderr.strip().splitlines() or ["?"])[-1]


def check(source: str, command: str, mention: bool, live: str) -> Check:
    result = Check(source, command, mention)
    command = strip_comment(command)
    if "|" in command or "&&" in command:
        command = re.split(r"\s*(\||&&)\s*", command)[0]
    if PLACEHOLDER.search(command):
        result.why = "placeholder"
        return result
    try:
        words = shlex.split(command)
    except ValueError as exc:
        result.status, result.why = "failed", f"cannot split: {exc}"
        return result
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the command
        words = words[1:]
    if words[0] == "make":
        done = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True)
        result.status = "ok" if done.returncode == 0 else "failed"
        result.why = "make -n" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]
    elif words[0] == "curl":
        if not live:
            result.why = "needs --live"
            return result
        done = subprocess.run([*words, "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "120"],
                              capture_output=True, text=True)
        code = done.stdout.strip()[-3:]
        result.status, result.why = ("ok" if code.startswith("2") else "failed"), f"HTTP {code}"
    elif len(words) > 2 and words[1] == "-m":
        if words[2] == "bench":
            result.status, result.why = check_bench(words[3:], mention)
        else:
            result.status, result.why = module_help(words[2])
    else:
        result.why = "not a module command"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=pathlib.Path)
    parser.add_argument("--live", default="", help="a running gateway's HTTP address: also run the curl commands")
    parser.add_argument("--quiet", action="store_true", help="print only failures and the summary")
    args = parser.parse_args(argv)
    checks = [check(*found, args.live) for path in args.files for found in commands(path)]
    for c in checks:
        if not args.quiet or c.status == "failed":
            print(f"{c.status:<8} {c.source:<28} {c.command[:110]}" + (f"\n{'':<38}{c.why}" if c.why else ""))
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "failed", "skipped")}
    print(f"commands: {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
