"""A tiny causal LM and tokenizer built offline, saved to a directory (TRL builds the reference from the path)."""

from __future__ import annotations

import string

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM


SPECIALS = ["<pad>", "<eos>", "<unk>"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer over digits, letters, punctuation and space."""
    chars = list(string.digits + string.ascii_letters + string.punctuation + " ")
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def build_model(tokenizer, hidden_size: int = 32, num_layers: int = 2, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def save_tiny_model(directory: str, dtype: torch.dtype = torch.float32) -> str:
    tokenizer = build_tokenizer()
    model = build_model(tokenizer).to(dtype)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def prompt_dataset(n: int = 16) -> Dataset:
    return Dataset.from_dict({"prompt": [f"{i}+{i % 7}=" for i in range(n)]})


def length_reward(completions, **kwargs):
    """Rewards short completions (varies across a group, so advantages are non-zero)."""
    return [1.0 / (1.0 + len(c)) for c in completions]


def constant_reward(completions, **kwargs):
    return [1.0 for _ in completions]


# Keyword arguments shared by every training config of the tests: CPU, tiny batches, no logging backends.
TRAIN_KWARGS = dict(
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=8,
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    use_cpu=True,
    learning_rate=1e-2,
    seed=0,
    data_seed=0,
    disable_tqdm=True,
)
