"""Tiny seeded models for tests: built at test time, fast, and exact in fp32.

``build_tiny_pair(dir)`` writes a target and a draft that share a byte-level BPE
tokenizer. The draft is the target with noise on its weights, so it agrees with
the target often but not always: the case that exercises both acceptance and
rejection. Nothing here is downloaded.
"""

from __future__ import annotations

import pathlib

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    '{"name": "Ada", "age": 36, "tags": ["math", "code"]}',
    "SELECT id, name FROM users WHERE age > 30 ORDER BY name;",
    "def add(a, b):\n    return a + b\n",
    "Speculative decoding drafts tokens and verifies them in one pass.",
    "Ünïcödé: naïve café, 東京, emoji 🙂 and more.",
    "for i in range(10): print(i * i)",
]


def build_tokenizer(out_dir: pathlib.Path, vocab_size: int = 320):
    """A byte-level BPE tokenizer (any text encodes; multi-byte characters span tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", bos_token="<|im_start|>", pad_token="<|endoftext|>"
    )
    fast.save_pretrained(out_dir)
    return fast


# The default tiny shape, and one vLLM's CPU attention accepts (head size >= 32) with room for 1,500-token contexts.
TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512)
VLLM_TINY_SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=2048)


def tiny_llama_config(vocab_size: int, eos_token_id: int, seed_layers: int = 2, init_range: float = 0.3,
                      shape: dict | None = None):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        num_hidden_layers=seed_layers,
        **(shape or TINY_SHAPE),
        eos_token_id=eos_token_id,
        bos_token_id=eos_token_id,
        pad_token_id=0,
        tie_word_embeddings=False,
        # A larger init spreads the logits, so argmax is rarely a near-tie.
        initializer_range=init_range,
    )


def build_tiny_model(out_dir: pathlib.Path, vocab_size: int, eos_token_id: int, seed: int, noise_from=None,
                     noise: float = 0.0, init_range: float = 0.3, shape: dict | None = None):
    """A seeded random LlamaForCausalLM saved to out_dir; optionally a noisy copy of another."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(vocab_size, eos_token_id, init_range=init_range, shape=shape)).float().eval()
    if noise_from is not None:
        model.load_state_dict(noise_from.state_dict())
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * noise * param.std().clamp(min=1e-3))
    model.generation_config.eos_token_id = eos_token_id
    model.save_pretrained(out_dir)
    return model


def build_tiny_pair(root: pathlib.Path, noise: float = 0.05, shape: dict | None = None
                    ) -> tuple[pathlib.Path, pathlib.Path]:
    """Write a tiny target and a tiny noisy draft that share one tokenizer. Returns their dirs."""
    target_dir, draft_dir = root / "tiny-target", root / "tiny-draft"
    tokenizer = build_tokenizer(target_dir)
    tokenizer.save_pretrained(draft_dir)
    vocab = len(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    target = build_tiny_model(target_dir, vocab, eos, seed=0, shape=shape)
    build_tiny_model(draft_dir, vocab, eos, seed=1, noise_from=target, noise=noise, shape=shape)
    return target_dir, draft_dir


def build_other_tokenizer_model(root: pathlib.Path) -> pathlib.Path:
    """A tiny model whose tokenizer differs from build_tiny_pair's (smaller vocabulary)."""
    out = root / "tiny-other"
    tokenizer = build_tokenizer(out, vocab_size=300)
    build_tiny_model(out, len(tokenizer), tokenizer.convert_tokens_to_ids("<|im_end|>"), seed=2)
    return out


def pooled_chi_square_p_value(observed, probs) -> float:
    """Pearson goodness of fit of token counts to probabilities over a large vocabulary.

    observed: [V] counts; probs: [V] the distribution they should follow (numpy or lists).
    Tokens expected fewer than 5 times are pooled into one bin, as the chi-square approximation needs.
    """
    import numpy as np
    from scipy import stats

    observed, expected = np.asarray(observed, dtype=float), np.asarray(probs, dtype=float) * np.sum(observed)
    small = expected < 5
    return float(stats.chisquare(np.append(observed[~small], observed[small].sum()),
                                 np.append(expected[~small], expected[small].sum())).pvalue)
