"""A tiny causal LM and tokenizer built offline from a config, for tests and quickstarts (no hub access needed).

The model has random weights: it exercises the whole training path in seconds on a CPU, but learns nothing useful.
"""

from __future__ import annotations

import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM


SPECIALS = ["<pad>", "<eos>", "<unk>"]


def build_tokenizer(vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """A character-level tokenizer over digits, letters, punctuation and space.

    It is a byte-level BPE with no merges (space is the byte-level symbol "Ġ"), so every character is one token and
    `AutoTokenizer` reloads it faithfully even where it picks Qwen2's tokenizer class for a Qwen2 config. With
    `vocab_size`, the vocabulary is padded with placeholder tokens to that size, so that a model of a real model's
    shape (e.g. Qwen2.5's 151,936 tokens) can generate and decode any id.
    """
    chars = list(string.digits + string.ascii_letters + string.punctuation) + ["\u0120"]  # "Ġ": byte-level space
    tokens = SPECIALS + chars
    tokens += [f"<t{i}>" for i in range(len(tokens), vocab_size or 0)]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


# Qwen2 shapes: the tiny one for tests and CPU runs, the embedded reference policy's (see
# scripts/build_reference_policy.py), a 30M-parameter one with a 32k vocabulary for CPU benchmarks, and
# Qwen2.5-0.5B's for GPU speed and memory measurements.
MODEL_SHAPES = {
    "tiny": dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
    "reference-policy": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    ),
    "small-30m": dict(
        hidden_size=384,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=32000,
    ),
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
}


def build_model(tokenizer, shape: str = "tiny", seed: int = 0) -> Qwen2ForCausalLM:
    """A Qwen2 causal LM of one of `MODEL_SHAPES` with random (seeded) weights."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        **{"vocab_size": len(tokenizer), "max_position_embeddings": 2048, **MODEL_SHAPES[shape]},
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def save_random_model(directory: str, shape: str = "tiny", dtype: torch.dtype = torch.float32) -> str:
    """Saves a random model of `shape` (the tiny one by default) and its tokenizer to `directory` (TRL builds the
    reference from the path)."""
    tokenizer = build_tokenizer(MODEL_SHAPES[shape].get("vocab_size"))
    build_model(tokenizer, shape).to(dtype).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
