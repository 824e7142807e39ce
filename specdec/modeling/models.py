"""Load models and tokenizers from a local directory (or a hub id), and describe them."""

from __future__ import annotations

import hashlib
import json
import logging
import pathlib

import torch

from specdec.modeling.gqa_attention import use_sdpa_gqa
from specdec.v1 import common_pb2

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    """The model or tokenizer could not be loaded; the message says why and what to do."""


# Where AutoTokenizer would pick TokenizersBackend itself: a tokenizer.json saved as TokenizersBackend (transformers
# 5's name for a fast tokenizer; PreTrainedTokenizerFast is its old one), no custom code, and a model type that
# transformers does not map to a class of its own over the saved one (its MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS
# list; llama is not in it). tests/specdec/modeling/test_models.py checks that both paths give the same tokenizer.
DIRECT_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}
DIRECT_MODEL_TYPES = {"llama"}


def loads_directly(path: str) -> bool:
    """Whether load_tokenizer can skip AutoTokenizer for this directory (see DIRECT_TOKENIZER_CLASSES)."""
    root = pathlib.Path(path)
    try:
        tokenizer_config = json.loads((root / "tokenizer_config.json").read_text())
        model_type = json.loads((root / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return False
    return ((root / "tokenizer.json").is_file() and "auto_map" not in tokenizer_config
            and tokenizer_config.get("tokenizer_class") in DIRECT_TOKENIZER_CLASSES and model_type in DIRECT_MODEL_TYPES)


def load_tokenizer(path: str):
    """The model's tokenizer, as AutoTokenizer loads it. Where AutoTokenizer would choose TokenizersBackend, that
    class is loaded directly: the gateway and the n-gram and suffix drafts need nothing else from transformers,
    and AutoTokenizer's imports (configs, generation, torch.distributed) are most of such a service's start."""
    try:
        if loads_directly(path):
            from transformers.tokenization_utils_tokenizers import TokenizersBackend

            return TokenizersBackend.from_pretrained(path)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot load a tokenizer from {path!r}: {exc}. Pass --model a local model directory "
            "(run `make model` for the default SmolLM2-135M-Instruct)."
        ) from exc


def load_causal_lm(path: str, device: str = "cpu", dtype: str = "float32"):
    from transformers import AutoModelForCausalLM

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"--device {device} was asked for, but torch sees no CUDA device; use --device cpu")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot load a causal LM from {path!r}: {exc}. Pass --model a local model directory "
            "(run `make model` for the default SmolLM2-135M-Instruct)."
        ) from exc
    model = model.to(device).eval()
    use_sdpa_gqa(model)  # a verified block's attention without copies of the cache on CPU; bitwise the same
    return model


def load_config_only(path: str):
    """A weightless stand-in with the model's config and generation config (for describe())."""
    import types

    from transformers import AutoConfig, GenerationConfig

    try:
        generation_config = GenerationConfig.from_pretrained(path)
    except OSError:
        generation_config = None
    return types.SimpleNamespace(config=AutoConfig.from_pretrained(path), generation_config=generation_config,
                                 parameters=lambda: iter(()))


def eos_token_ids(tokenizer, model=None) -> list[int]:
    """Every id that ends a sequence: the tokenizer's and the generation config's."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    return sorted(ids)


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of what decides token ids: the vocabulary, merges and special tokens."""
    digest = hashlib.sha256()
    digest.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode())
    digest.update(json.dumps(sorted(map(str, tokenizer.all_special_tokens))).encode())
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is not None:
        model_state = json.loads(backend.to_str()).get("model", {})
        digest.update(json.dumps(model_state.get("merges", []), ensure_ascii=False).encode())
    return digest.hexdigest()[:16]


def max_context(model) -> int:
    return int(getattr(model.config, "max_position_embeddings", 0) or 2048)


def describe(name: str, tokenizer, model=None) -> common_pb2.ModelInfo:
    """The ModelInfo message for a tokenizer and (optionally) its model."""
    vocab_size = int(model.config.vocab_size) if model is not None else len(tokenizer)
    return common_pb2.ModelInfo(
        model=name,
        vocab_size=vocab_size,
        max_context=max_context(model) if model is not None else 0,
        eos_token_ids=eos_token_ids(tokenizer, model),
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        tokenizer_class=type(tokenizer).__name__,
        tokenizer_vocab_size=len(tokenizer),
        num_parameters=sum(p.numel() for p in model.parameters()) if model is not None else 0,
    )


# What config.json records about where and by what it was written, not which model it is.
CONFIG_KEYS_NOT_IDENTITY = ("_name_or_path", "transformers_version")
WEIGHT_SUFFIXES = ((".safetensors",), (".bin", ".pt", ".pth"))  # the first kind present is what loads
HASH_CHUNK_BYTES = 1 << 20


def local_model_dir(path: str) -> pathlib.Path | None:
    """The directory holding the model's files: `path` itself, or a hub id's cached snapshot (no download)."""
    if pathlib.Path(path).is_dir():
        return pathlib.Path(path)
    try:
        from huggingface_hub import snapshot_download

        return pathlib.Path(snapshot_download(path, local_files_only=True))
    except Exception:  # noqa: BLE001 (not a hub id, or not cached: the caller says it cannot tell)
        return None


def model_fingerprint(path: str) -> str:
    """Which model `path` holds: a hash of its config (less CONFIG_KEYS_NOT_IDENTITY) and of the bytes of its
    weight files, each read once. It does not depend on the path or on the dtype or device the model runs in,
    so replicas of one model agree, and a model with other weights but the same tokenizer differs.
    "" when the files cannot be found (then nothing is compared)."""
    root = local_model_dir(path)
    if root is None:
        log.warning("cannot find the files of %r to fingerprint the model; a swapped model will not be noticed", path)
        return ""
    digest = hashlib.sha256()
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    for key in CONFIG_KEYS_NOT_IDENTITY:
        config.pop(key, None)
    digest.update(json.dumps(config, sort_keys=True).encode())
    files: list[pathlib.Path] = []
    for suffixes in WEIGHT_SUFFIXES:
        files = sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(suffixes))
        if files:
            break
    for file in files:
        digest.update(f"\0{file.name}\0{file.stat().st_size}\0".encode())
        with file.open("rb") as f:
            while chunk := f.read(HASH_CHUNK_BYTES):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def model_mismatch(pinned: common_pb2.ModelInfo, now: common_pb2.ModelInfo) -> str | None:
    """None when `now` is the model `pinned` describes (or `pinned` has no fingerprint), else both, in words."""
    if not pinned.model_fingerprint or now.model_fingerprint == pinned.model_fingerprint:
        return None
    return (f"it serves the model {now.model} (fingerprint {now.model_fingerprint or 'not reported'}), not the model "
            f"{pinned.model} (fingerprint {pinned.model_fingerprint}) this gateway started with, and another model "
            "gives other output under the same name")


def longest_token(tokenizer) -> tuple[int, int]:
    """The most text one token stands for: (characters, UTF-8 bytes), over the whole vocabulary.

    A prompt of n tokens has at most n times this much text, which lets a front door refuse a prompt that
    cannot fit before it pays for tokenizing it."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return max(map(len, texts), default=1), max((len(t.encode("utf-8", "replace")) for t in texts), default=1)


DRAFT_ADVICE = "Speculative decoding needs one tokenizer: pick a draft from the target's model family."


def tokenizer_mismatch(target: common_pb2.ModelInfo, draft: common_pb2.ModelInfo, role: str = "the draft",
                       target_role: str = "the target", advice: str = DRAFT_ADVICE) -> str | None:
    """None when `role` (the draft, by default) may pair with the target, else what differs, in words."""
    if target.tokenizer_fingerprint == draft.tokenizer_fingerprint:
        return None
    differences = [f"fingerprint {draft.tokenizer_fingerprint} != {target.tokenizer_fingerprint}"]
    if target.tokenizer_vocab_size != draft.tokenizer_vocab_size:
        differences.append(f"vocabulary size {draft.tokenizer_vocab_size} != {target.tokenizer_vocab_size}")
    if target.tokenizer_class != draft.tokenizer_class:
        differences.append(f"class {draft.tokenizer_class} != {target.tokenizer_class}")
    if list(target.eos_token_ids) != list(draft.eos_token_ids):
        differences.append(f"EOS ids {list(draft.eos_token_ids)} != {list(target.eos_token_ids)}")
    return (
        f"{role} ({draft.model}) does not share {target_role}'s tokenizer ({target.model}): "
        + "; ".join(differences)
        + ". " + advice
    )


def set_up_torch(threads: int) -> None:
    """Inference only; `threads` CPU threads (0 keeps torch's default)."""
    import torch

    torch.set_grad_enabled(False)
    if threads:
        torch.set_num_threads(threads)
