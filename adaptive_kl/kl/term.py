"""The KL term of one micro-batch: estimate → bias correction → transform → aggregate, and its statistics.

Pure functions of tensors and settings: the trainer calls `kl_term_and_estimates` with the log-probabilities its host
computed (and turns the estimates into per-sequence sums, and those into statistics, when it reads them);
`kl_term_and_sequence_sums` does both at once, and `benchmarks/kl_term.py` times it against a forward pass.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .aggregation import aggregate_like_host, length_normalized_mean
from .estimators import estimate_and_transform, importance_ratio, masked_log_ratio
from .metrics import kl_sequence_sums, statistics_of_sequences


class KLEstimates(NamedTuple):
    """The per-token KL of one micro-batch that its statistics are made of: the keyword arguments of
    `adaptive_kl.kl.metrics.kl_sequence_sums`."""

    raw_kl: torch.Tensor  # (B, T): k
    adapted_kl: torch.Tensor  # (B, T): f(k)
    mask: torch.Tensor  # (B, T)
    clip_threshold: float | None  # c where the clip transform is active, else None
    host_kl: torch.Tensor | None  # (B, T): the KL TRL's GRPO loss logs, where it is not k

    def sequence_sums(self) -> torch.Tensor:
        """The `(5, B)` per-sequence sums of their statistics (`kl_sequence_sums`). Estimates of a masked log-ratio
        are 0 outside the mask already, so the sums skip the mask's product."""
        return kl_sequence_sums(**self._asdict(), zero_outside_mask=True)


def kl_term_and_sequence_sums(*args, **kwargs) -> tuple[torch.Tensor | None, torch.Tensor]:
    """`kl_term_and_estimates` (same arguments), with the estimates turned into the per-sequence sums of their
    statistics (`adaptive_kl.kl.metrics.kl_sequence_sums`): the scalar term (`None` without `with_term`) and the
    `(5, B)` sums."""
    term, estimates = kl_term_and_estimates(*args, **kwargs)
    return term, estimates.sequence_sums()


def kl_term_and_estimates(
    per_token_logps: torch.Tensor,
    ref_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    estimator: str = "k3",
    transform: str | None = None,
    clip_threshold: float = 1.0,
    target: float = 0.1,
    length_normalized: bool = False,
    loss_type: str = "grpo",
    accumulation_steps: float = 1.0,
    max_completion_length: int | None = None,
    token_normalizer: torch.Tensor | float | None = None,
    sample_weight: torch.Tensor | None = None,
    use_bias_correction: bool = False,
    old_per_token_logps: torch.Tensor | None = None,
    importance_sampling_level: str = "token",
    kl_bound: float | None = None,
    log_ratio_clip: float | None = None,
    importance_log_ratio_clip: float | None = None,
    sequence_mask: torch.Tensor | None = None,
    with_term: bool = True,
) -> tuple[torch.Tensor | None, KLEstimates]:
    """Agg(f(k)) for one micro-batch, and the per-token estimates its statistics are made of.

    Args:
        per_token_logps (`torch.Tensor` of shape `(B, T)`): log π_θ at the sampled tokens, carrying gradient.
        ref_per_token_logps (`torch.Tensor` of shape `(B, T)`): log π_ref.
        mask (`torch.Tensor` of shape `(B, T)`): completion mask, in the dtype of `per_token_logps`.
        estimator, transform, clip_threshold, target: the per-token estimate k and transform f (see `adaptive_kl.kl`).
        length_normalized (`bool`): mean of per-sequence means whatever the loss type, instead of the host's
            aggregation.
        loss_type, accumulation_steps, max_completion_length, token_normalizer, sample_weight: the host's aggregation
            (see `adaptive_kl.kl.aggregation.aggregate_like_host`).
        use_bias_correction (`bool`): multiply k by the importance ratio π_θ/π_old (TRL's `use_bias_correction_kl`).
        old_per_token_logps (`torch.Tensor` of shape `(B, T)`, *optional*): log π_old; `None` means on-policy (the
            detached current log-probabilities).
        importance_sampling_level (`str`): `"token"` or `"sequence"` ratio for the bias correction.
        kl_bound (`float`, *optional*): bound |k| ≤ kl_bound on the (bias-corrected) estimate, as Unsloth's loss has.
        log_ratio_clip (`float`, *optional*): clamp the log-ratio of k3/k3+ to ±this value before it is exponentiated
            (`kl_log_ratio_clip`; Unsloth's loss: ±20); `None`, TRL's arithmetic: no clamp.
        importance_log_ratio_clip (`float`, *optional*): the same for the log-ratio of the bias correction's
            importance ratio (`kl_log_ratio_clip`; Unsloth's loss: ±20 only for vLLM's rollout log-probabilities).
        sequence_mask (`torch.Tensor` of shape `(B,)`, *optional*): bool, False for the sequences whose f(k) is left
            out of the term (`kl_mask_zero_std_groups`). Their f(k) is set to 0 before the aggregation, whose
            normalizers still count every token of `mask` (the host's policy loss keeps them): the term is exactly the
            unmasked one with those rows zeroed, not a mean over the kept rows, which would raise the effective β of
            the kept ones by however many rows a batch masks. The statistics still cover every sequence.
        with_term (`bool`): `False` where the KL is only measured (the host's own term is in the loss, or the KL is in
            the reward): the estimates alone, without the aggregation.

    Returns:
        `tuple[torch.Tensor | None, KLEstimates]`: the scalar term (differentiable through `per_token_logps`; `None`
        without `with_term`) and k, f(k) (carrying gradient where the term does) and what else their statistics read.
    """
    log_ratio = masked_log_ratio(per_token_logps, ref_per_token_logps, mask)
    ratio = None
    if use_bias_correction:
        old = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
        ratio = importance_ratio(per_token_logps, old, mask, importance_sampling_level, importance_log_ratio_clip)
    kl, adapted = estimate_and_transform(
        log_ratio, estimator=estimator, transform=transform, clip_threshold=clip_threshold, target=target,
        log_ratio_clip=log_ratio_clip, weight=ratio, bound=kl_bound,
    )  # fmt: skip
    host_kl = None  # what the host logs as `kl`: k3 of the same log-ratio, weighted and bounded alike
    if estimator != "k3":
        host_kl, _ = estimate_and_transform(
            log_ratio.detach(), estimator="k3", log_ratio_clip=log_ratio_clip,
            weight=None if ratio is None else ratio.detach(), bound=kl_bound,
        )  # fmt: skip
    estimates = KLEstimates(kl, adapted, mask, clip_threshold if transform == "clip" else None, host_kl)
    if not with_term:
        return None, estimates
    kept = adapted
    if sequence_mask is not None:  # `where`, not a product: exactly 0, even for a non-finite f(k)
        kept = torch.where(sequence_mask.to(torch.bool).unsqueeze(-1), adapted, adapted.new_zeros(()))
    if length_normalized:
        term = length_normalized_mean(kept, mask, accumulation_steps=accumulation_steps)
    else:
        term = aggregate_like_host(
            kept,
            mask,
            loss_type,
            accumulation_steps=accumulation_steps,
            max_completion_length=max_completion_length,
            token_normalizer=token_normalizer,
            sample_weight=sample_weight,
            zero_outside_mask=True,  # every estimate and transform maps the masked log-ratio's 0 to 0
        )
    return term, estimates


def adapted_kl_term(*args, **kwargs) -> tuple[torch.Tensor | None, torch.Tensor]:
    """`kl_term_and_sequence_sums` (same arguments), with the sums turned into the batch's statistics: the scalar term
    (`None` without `with_term`) and the statistics vector of `adaptive_kl.kl.metrics.kl_statistics`, of shape
    `(len(STAT_NAMES),)`, for this process only (the caller reduces it)."""
    term, sums = kl_term_and_sequence_sums(*args, **kwargs)
    return term, statistics_of_sequences(sums)


def measured_sequence_sums(
    per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor, mask: torch.Tensor, **options
) -> torch.Tensor:
    """The `(5, B)` per-sequence sums of `kl_term_and_sequence_sums` (same arguments) without its term: the KL measured
    beside a loss that holds its own KL term, or in the reward. Row-wise, so that batches concatenated along the
    sequences give their sums concatenated (what a trainer uses to measure many micro-batches in one call). `mask` may
    be of any dtype (a completion mask as the host keeps it)."""
    mask = mask.to(per_token_logps.dtype)
    if options.get("old_per_token_logps") is None:  # on-policy: the bias correction's ratio is exactly 1
        options["use_bias_correction"] = False
    return kl_term_and_sequence_sums(per_token_logps, ref_per_token_logps, mask, **options, with_term=False)[1]
