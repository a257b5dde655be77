"""Validation accuracy by greedy decoding: the number the demo reports at step 0 and at regular intervals."""

from __future__ import annotations

import torch

from .answers import answers_match, extract_answer, has_answer_format


@torch.no_grad()
def generate_greedy(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 64) -> list[str]:
    """Greedy completions of `prompts` (left-padded batches), decoded without special tokens."""
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    completions = []
    try:
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True).to(device)
            output = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            completions += tokenizer.batch_decode(output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    return completions


def evaluate_accuracy(
    model, tokenizer, prompts: list[str], answers: list, max_new_tokens: int = 32, batch_size: int = 64
) -> dict[str, float]:
    """Greedy-decoding accuracy and format rate of `model` on (`prompts`, `answers`).

    Returns:
        `{"accuracy": fraction with the right final answer, "format": fraction with an answer marker,
        "completion_length": mean completion length in characters}`.
    """
    completions = generate_greedy(model, tokenizer, prompts, max_new_tokens, batch_size)
    n = max(len(completions), 1)
    return {
        "accuracy": sum(answers_match(extract_answer(c), a) for c, a in zip(completions, answers, strict=True)) / n,
        "format": sum(has_answer_format(c) for c in completions) / n,
        "completion_length": sum(len(c) for c in completions) / n,
    }
