"""Validation accuracy by greedy decoding: the number the demo reports at step 0 and at regular intervals."""

from __future__ import annotations

from ..trainers.generation import generate
from .answers import answers_match, extract_answer, final_number, has_answer_format


def evaluate_accuracy(
    model, tokenizer, prompts: list, answers: list, max_new_tokens: int = 32, batch_size: int = 64
) -> dict[str, float]:
    """Greedy-decoding accuracy and format rate of `model` on (`prompts`, `answers`); prompts are plain text or
    conversations (rendered with the tokenizer's chat template).

    Returns:
        `{"accuracy": fraction with the right final answer given through a marker (what the reward pays),
        "answer_accuracy": fraction whose final number is right, marker or not (`final_number`), "format": fraction
        with an answer marker, "completion_length": mean completion length in characters}`.
    """
    return score_completions(generate(model, tokenizer, prompts, max_new_tokens, batch_size=batch_size), answers)


def score_completions(completions: list[str], answers: list) -> dict[str, float]:
    """The scores of `evaluate_accuracy` for completions already generated."""
    n = max(len(completions), 1)
    pairs = list(zip(completions, answers, strict=True))
    return {
        "accuracy": sum(answers_match(extract_answer(c), a) for c, a in pairs) / n,
        "answer_accuracy": sum(answers_match(final_number(c), a) for c, a in pairs) / n,
        "format": sum(has_answer_format(c) for c in completions) / n,
        "completion_length": sum(len(c) for c in completions) / n,
    }
