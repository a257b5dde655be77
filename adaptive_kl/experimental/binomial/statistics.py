"""`MicroBatchSums`: the sums a micro-batch of `BinomialKLTrainer` contributes, reduced over processes in one
collective: the step's normalizer N_correct and every `binomial_kl/*` metric."""

from __future__ import annotations

from typing import NamedTuple

import torch


class MicroBatchSums(NamedTuple):
    """Scalar tensors, summed over processes by the trainer (stacked in this order for one collective)."""

    step_correct: torch.Tensor  # correct sequences of the whole optimizer step: N_correct once reduced
    correct: torch.Tensor  # correct sequences of this micro-batch
    sequences: torch.Tensor  # sequences of this micro-batch
    active_tokens: torch.Tensor  # completion tokens that enter the loss (correct sequences; p > 0.5 for "half")
    tokens: torch.Tensor  # completion tokens
    p_chosen: torch.Tensor  # Σ over completion tokens of the sampled token's probability
    p_max: torch.Tensor  # Σ over completion tokens of the largest token probability
    objective: torch.Tensor  # Σ over correct sequences of (1/L_i) Σ_t A_it·ℓ_it (detached)

    def write_metrics(self, metrics: dict[str, list[float]], accumulation: int) -> None:
        """Appends the `binomial_kl/*` metrics of these (reduced) sums to TRL's `metrics`, which averages the values of
        an optimizer step's micro-batches: the objective is multiplied by the step's `accumulation` micro-batches, so
        that the average is the step's objective (its sum over them)."""
        num_correct = self.step_correct
        tokens = self.tokens.clamp(min=1.0)
        metrics["binomial_kl/loss"].append((self.objective / num_correct.clamp(min=1.0)).item() * accumulation)
        metrics["binomial_kl/num_correct"].append(num_correct.item())
        metrics["binomial_kl/correct_fraction"].append((self.correct / self.sequences.clamp(min=1.0)).item())
        metrics["binomial_kl/active_token_fraction"].append((self.active_tokens / tokens).item())
        metrics["binomial_kl/p_chosen"].append((self.p_chosen / tokens).item())
        metrics["binomial_kl/p_max"].append((self.p_max / tokens).item())
