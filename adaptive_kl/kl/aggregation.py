"""Aggregation of a per-token KL term into a scalar loss, mirroring the host trainer's ``loss_type``.

The adapted KL term is added to the host's policy loss *after* the host has aggregated it, so it must be aggregated
with the same normalizers the host would have applied had the term been inside its per-token loss. Every host
aggregation is linear in the per-token loss, so ``Agg(policy + β·k) = Agg(policy) + β·Agg(k)``: this is what makes
method "none" reproduce stock TRL to float precision.
"""

from __future__ import annotations

import torch


# TRL's `loss_type`s (https://huggingface.co/docs/trl/grpo_trainer#loss-types): grpo (DeepSeekMath,
# arXiv:2402.03300), dr_grpo (arXiv:2503.20783), dapo (arXiv:2503.14476), cispo (MiniMax-M1, arXiv:2506.13585), sapo
# (arXiv:2511.20347), luspo (arXiv:2602.05261), vespo (arXiv:2602.10693); bnpo has no paper. The KL term is aggregated
# as TRL aggregates its per-token loss for each (trl 1.15/1.16 `GRPOTrainer._compute_loss`).
SEQUENCE_MEAN_LOSS_TYPES = ("grpo", "sapo")
TOKEN_SUM_LOSS_TYPES = ("dapo", "cispo", "vespo")
LOSS_TYPES = (*SEQUENCE_MEAN_LOSS_TYPES, "bnpo", "dr_grpo", *TOKEN_SUM_LOSS_TYPES, "luspo")


def token_counts(mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ m (over `dim`, or all), in at least float32: a bfloat16/float16 sum rounds counts above 256/2048."""
    dtype = torch.float64 if mask.dtype == torch.float64 else torch.float32
    return mask.sum(dtype=dtype) if dim is None else mask.sum(dim, dtype=dtype)


def token_sum_normalizer(
    num_items: torch.Tensor | float,
    num_processes: int,
    accumulation_steps: float = 1.0,
    steps_per_generation: int | None = None,
) -> torch.Tensor | float:
    """What the token-sum loss types (dapo, cispo, vespo) divide Σ m·x by: max(N, 1) / P · G / S.

    Args:
        num_items (`torch.Tensor` or number): N, the completion tokens of the whole generation batch (all processes).
        num_processes (`int`): P.
        accumulation_steps (`float`): G, the current gradient-accumulation steps.
        steps_per_generation (`int`, *optional*): S. The generation batch spans S micro-batches, so G / S rescales N to
            one accumulation window; `None` in evaluation, where the batch is neither split nor accumulated.
    """
    items = num_items.clamp(min=1.0) if torch.is_tensor(num_items) else max(float(num_items), 1.0)
    normalizer = items / num_processes
    if not steps_per_generation:  # evaluation
        return normalizer
    return normalizer * accumulation_steps / steps_per_generation


def sequence_means(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ_t m_it·x_it / max(L_i, 1), shape `(B,)`. Fully masked rows contribute 0."""
    return (values * mask).sum(-1) / token_counts(mask, -1).clamp(min=1.0)


def aggregate_like_host(
    values: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    *,
    accumulation_steps: float = 1.0,
    max_completion_length: int | None = None,
    token_normalizer: torch.Tensor | float | None = None,
    sample_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregates a per-token term exactly as the host aggregates its per-token loss for ``loss_type``.

    Args:
        values (`torch.Tensor` of shape `(B, T)`): per-token term (e.g. the adapted KL f(k)).
        mask (`torch.Tensor` of shape `(B, T)`): completion mask m (1 for tokens that count).
        loss_type (`str`): the host's `loss_type`.
        accumulation_steps (`float`): the gradient-accumulation normalizer (the current number of accumulation
            steps in training, 1 in evaluation). Not used by the token-sum types, whose normalizer includes it.
        max_completion_length (`int`): the `dr_grpo` constant.
        token_normalizer (`torch.Tensor` or `float`): for `dapo`/`cispo`/`vespo`, the token count the host divides
            the token sum by (global tokens of the generation batch rescaled to one accumulation window); with
            `sample_weight`, what the weighted sum is divided by.
        sample_weight (`torch.Tensor` of shape `(B,)`, *optional*): Unsloth's per-completion weights (its zero-variance
            exclusion and prompt-level aggregation), which replace the loss-type normalizer.

    Returns:
        `torch.Tensor`: scalar.

    | loss_type | aggregate |
    |---|---|
    | grpo, sapo | mean_i(Σ_t m·x / L_i) / accumulation_steps |
    | bnpo | Σ m·x / Σ m / accumulation_steps |
    | dr_grpo | Σ m·x / (B · max_completion_length) / accumulation_steps |
    | dapo, cispo, vespo | Σ m·x / token_normalizer |
    | luspo | mean_i(Σ_t m·x) / accumulation_steps |
    | any, with `sample_weight` w | Σ m·x·w_i / token_normalizer |
    """
    if sample_weight is None and loss_type in SEQUENCE_MEAN_LOSS_TYPES:  # `sequence_means` forms m·x itself
        return sequence_means(values, mask).mean() / accumulation_steps
    masked = values * mask  # (B, T): m·x, 0 outside the mask
    if sample_weight is not None:
        return (masked * sample_weight.to(values.dtype).unsqueeze(-1)).sum() / token_normalizer
    if loss_type in TOKEN_SUM_LOSS_TYPES:
        if token_normalizer is None:
            raise ValueError(f"loss_type={loss_type!r} needs token_normalizer.")
        return masked.sum() / token_normalizer
    if loss_type == "bnpo":
        term = masked.sum() / token_counts(mask).clamp(min=1.0)
    elif loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' needs max_completion_length.")
        term = masked.sum() / (values.size(0) * max_completion_length)
    elif loss_type == "luspo":
        term = masked.sum(-1).mean()
    else:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}.")
    return term / accumulation_steps


# The seed "Adaptive KL Divergence for GRPO Training" (no published source): every sequence weighs the same, whatever
# its length.
def length_normalized_mean(
    values: torch.Tensor, mask: torch.Tensor, *, accumulation_steps: float = 1.0
) -> torch.Tensor:
    """The `length_normalized` aggregate: mean_i K̄_i with K̄_i = Σ_t m·x / L_i, whatever the loss type.

    Every sequence carries the same weight, so long completions do not carry more KL than short ones under
    token-sum loss types.

    Args:
        values (`torch.Tensor` of shape `(B, T)`): per-token term.
        mask (`torch.Tensor` of shape `(B, T)`): completion mask.
        accumulation_steps (`float`): the gradient-accumulation normalizer.

    Returns:
        `torch.Tensor`: scalar.
    """
    return sequence_means(values, mask).mean() / accumulation_steps
