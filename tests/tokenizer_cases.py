"""Real tokenizers for the fast text tests: the tiny byte-level BPE and, once fetched, SmolLM2's.

Both are byte-level BPEs, so one character's UTF-8 bytes can span several tokens. Tests take a
tokenizer by name through `TOKENIZERS`; SmolLM2's is skipped (with the reason) until `make model`.
"""

from __future__ import annotations

import functools
import pathlib
import tempfile

import pytest

from specdec.modeling.fetch_model import default_model_dir

SMOLLM2_DIR = default_model_dir()
SMOLLM2_MISSING = f"SmolLM2 tokenizer not found at {SMOLLM2_DIR} (run `make model`)"

TOKENIZERS = [
    "tiny",
    pytest.param("smollm2", marks=pytest.mark.skipif(not (SMOLLM2_DIR / "tokenizer.json").is_file(),
                                                     reason=SMOLLM2_MISSING)),
]

# Text with characters of 2, 3 and 4 UTF-8 bytes, as a completion might carry them.
MIXED_TEXT = 'Ünïcödé: naïve café, 東京 and 北京, emoji 🙂🎉 then {"ok": true} done.'


@functools.cache
def load(name: str):
    """The tokenizer called `name`, built or loaded once per test process."""
    if name == "tiny":
        from devkit.testing import build_tokenizer

        with tempfile.TemporaryDirectory() as out:
            return build_tokenizer(pathlib.Path(out))
    if name == "smollm2":
        from specdec.modeling.models import load_tokenizer

        return load_tokenizer(str(SMOLLM2_DIR))
    raise ValueError(f"unknown test tokenizer {name!r}; use 'tiny' or 'smollm2'")


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def decode(tokenizer, ids: list[int]) -> str:
    """Decode as the services do (specdec.decoding.detokenizer)."""
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def splits_a_character(tokenizer, ids: list[int]) -> bool:
    """True when some token in `ids` carries only part of a character's bytes (so the test exercises that)."""
    return any("\ufffd" in decode(tokenizer, [token]) for token in ids)


def blocks(ids: list[int], sizes: list[int]) -> list[list[int]]:
    """Cut ids into consecutive blocks of the given sizes, cycling through them (like rounds of k tokens)."""
    out, start, i = [], 0, 0
    while start < len(ids):
        size = sizes[i % len(sizes)]
        out.append(ids[start : start + size])
        start, i = start + size, i + 1
    return out


def stop_inside_a_straddling_token(tokenizer) -> tuple[list[int], int, str]:
    """(ids, n, stop): token n-1 of ids completes text and also starts a multi-byte character (the tiny BPE's
    'c' + the first byte of 'ö'; SmolLM2's ' ' + the first byte of 'Ü'); the stop string ends with that text."""
    ids = encode(tokenizer, "🙂🎉 Ünïcödé 東京")
    for n in range(1, len(ids) + 1):
        text = decode(tokenizer, ids[:n])
        complete = text.rstrip("\ufffd")
        if complete != text and len(complete) > len(decode(tokenizer, ids[: n - 1]).rstrip("\ufffd")):
            return ids, n, complete[-2:]
    pytest.skip("no token of this tokenizer both ends a character and starts another in the sample text")
