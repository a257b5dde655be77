"""The KL term of one micro-batch: estimate → bias correction → transform → aggregate, and its statistics.

A pure function of tensors and settings: the trainer calls `kl_term_and_sequence_sums` with the log-probabilities its
host computed, and keeps the per-sequence sums of its statistics (`adaptive_kl.kl.metrics`) until a log line or a
controller reads them; `benchmarks/kl_term.py` times it against a forward pass.
"""

from __future__ import annotations

import torch

from .aggregation import aggregate_like_host, length_normalized_mean
from .estimators import estimate_and_transform, importance_ratio, masked_log_ratio
from .metrics import kl_sequence_sums


def kl_term_and_sequence_sums(
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
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Agg(f(k)) for one micro-batch, and the per-sequence sums its statistics are made of.

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
            the reward): the sums alone, without the aggregation.

    Returns:
        `tuple[torch.Tensor | None, torch.Tensor]`: the scalar term (differentiable through `per_token_logps`; `None`
        without `with_term`) and the `(5, B)` per-sequence sums of k, f(k) and what else their statistics read
        (`adaptive_kl.kl.metrics.kl_sequence_sums`, detached).
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
    clipped_at = clip_threshold if transform == "clip" else None
    sums = kl_sequence_sums(kl, adapted, mask, clip_threshold=clipped_at, host_kl=host_kl)
    if not with_term:
        return None, sums
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
        )
    return term, sums
