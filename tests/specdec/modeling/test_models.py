"""specdec/modeling/models.py: the tokenizer loaded directly is the one AutoTokenizer loads."""

from __future__ import annotations

import json
import shutil

import pytest

from specdec.modeling import models
from tests.tokenizer_cases import MIXED_TEXT, SMOLLM2_DIR, SMOLLM2_MISSING

TEXTS = [MIXED_TEXT, "", " leading space", "<|im_start|>user\nhi<|im_end|>\n", "a\n\n\tb  c", "x" * 300]


def same_tokenizer(a, b) -> None:
    assert type(a) is type(b)
    assert models.tokenizer_fingerprint(a) == models.tokenizer_fingerprint(b)
    assert a.get_vocab() == b.get_vocab() and len(a) == len(b)
    assert a.all_special_tokens == b.all_special_tokens
    assert (a.eos_token_id, a.bos_token_id, a.pad_token_id) == (b.eos_token_id, b.bos_token_id, b.pad_token_id)
    for text in TEXTS:
        for special in (False, True):
            ids = a.encode(text, add_special_tokens=special)
            assert ids == b.encode(text, add_special_tokens=special), (text, special)
            assert a.decode(ids, skip_special_tokens=True) == b.decode(ids, skip_special_tokens=True)
    assert a.chat_template == b.chat_template
    if a.chat_template:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": MIXED_TEXT}]
        assert (a.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                == b.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def test_the_tiny_models_tokenizer_loads_directly_and_equals_autotokenizers(tiny_pair):
    from transformers import AutoTokenizer

    for path in map(str, tiny_pair):
        assert models.loads_directly(path)
        same_tokenizer(models.load_tokenizer(path), AutoTokenizer.from_pretrained(path))


@pytest.mark.skipif(not (SMOLLM2_DIR / "tokenizer.json").is_file(), reason=SMOLLM2_MISSING)
def test_smollm2s_tokenizer_loads_directly_and_equals_autotokenizers():
    from transformers import AutoTokenizer

    assert models.loads_directly(str(SMOLLM2_DIR))
    same_tokenizer(models.load_tokenizer(str(SMOLLM2_DIR)), AutoTokenizer.from_pretrained(str(SMOLLM2_DIR)))


@pytest.mark.parametrize("change", [
    {"tokenizer_config.json": {"tokenizer_class": "Qwen2Tokenizer"}},  # a class of its own
    {"config.json": {"model_type": "qwen2"}},  # transformers may override the saved class for this type
    {"tokenizer_config.json": {"auto_map": {"AutoTokenizer": ["x.Tok", None]}}},  # custom code
])
def test_anything_else_goes_through_autotokenizer(tiny_pair, tmp_path, change):
    path = tmp_path / "model"
    shutil.copytree(tiny_pair[0], path)
    for name, fields in change.items():
        data = json.loads((path / name).read_text())
        (path / name).write_text(json.dumps({**data, **fields}))
    assert not models.loads_directly(str(path))


def test_a_missing_directory_is_one_actionable_error(tmp_path):
    assert not models.loads_directly(str(tmp_path / "missing"))
    with pytest.raises(models.ModelLoadError, match="make model"):
        models.load_tokenizer(str(tmp_path / "missing"))


def test_the_model_fingerprint_names_the_weights_and_config_not_the_path(tiny_pair, tmp_path):
    target, draft = tiny_pair  # one tokenizer, other weights
    fingerprint = models.model_fingerprint(str(target))
    assert len(fingerprint) == 16
    assert models.model_fingerprint(str(draft)) != fingerprint
    copy = shutil.copytree(target, tmp_path / "elsewhere")  # the same model at another path: the same identity
    config = json.loads((copy / "config.json").read_text())
    config["_name_or_path"], config["transformers_version"] = "/somewhere/else", "0.0.0"
    (copy / "config.json").write_text(json.dumps(config))
    assert models.model_fingerprint(str(copy)) == fingerprint
    config["num_hidden_layers"] += 1  # another architecture over the same files is another model
    (copy / "config.json").write_text(json.dumps(config))
    assert models.model_fingerprint(str(copy)) != fingerprint
    assert models.model_fingerprint(str(tmp_path / "missing")) == ""


def test_a_model_mismatch_names_both_models_and_fingerprints():
    pinned = models.common_pb2.ModelInfo(model="/models/a", model_fingerprint="aaaa")
    assert models.model_mismatch(pinned, pinned) is None
    assert models.model_mismatch(models.common_pb2.ModelInfo(model="/models/a"), pinned) is None  # nothing pinned
    problem = models.model_mismatch(pinned, models.common_pb2.ModelInfo(model="/models/b", model_fingerprint="bbbb"))
    assert all(part in problem for part in ("/models/a", "aaaa", "/models/b", "bbbb"))
