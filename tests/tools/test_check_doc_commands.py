"""The README's and the docs' commands still parse and name what exists (tools/check_doc_commands.py)."""

import pathlib

from tools import check_doc_commands as checker

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_command_in_the_readme_and_docs_still_runs(capsys):
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs/results").glob("*.md"))]
    assert checker.main([str(f) for f in files] + ["--quiet"]) == 0, capsys.readouterr().out


def test_commands_are_found_whole_and_checked(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `python -m bench verify-cost --max-k 8` or:\n\n```bash\nM=.cache/models/x\n"
                    "python -m bench speedup --model $M \\\n  --nope\ncurl -d '{\n  \"a\": 1\n}' localhost:1\n"
                    "python -m bench suffix-cost --nope\nmake no-such-target\n```\n")
    found = checker.commands(page)
    assert [(command, mention) for _, command, mention in found] == [
        ("python -m bench verify-cost --max-k 8", True),
        ("python -m bench speedup --model .cache/models/x  --nope", False),
        ("curl -d '{ \"a\": 1 }' localhost:1", False),
        ("python -m bench suffix-cost --nope", False),
        ("make no-such-target", False)]
    checks = [checker.check(*f, live="") for f in found]
    assert [c.status for c in checks] == ["ok", "skipped", "skipped", "failed", "failed"]
    assert "model not fetched here: .cache/models/x" in checks[1].why
    assert "--nope" in checks[3].why
