"""Per-token KL math: estimators and transforms.

Notation (see ``docs/design.md``): for a sampled token, ``r = log π_θ(y) − log π_ref(y)`` is the log-ratio,
``k = est(r)`` is a per-token KL estimate, and ``f(k)`` is the adapted (transformed) estimate that enters the loss.

Every function is pure torch, shape-preserving and differentiable where the formula is.
"""

from __future__ import annotations

import torch

from .aggregation import sequence_means


ESTIMATORS = ("k1", "k2", "k3", "k1+", "k3+")
# Straight-through estimators: the value of k1 or k3, the gradient of k2 (verl's "k1+"/"k3+", introduced in
# https://github.com/volcengine/verl/pull/2953, verl@b8dc5377c6484f5873102e02f6a63829528ab8c9
# verl/trainer/ppo/core_algos.py `kl_penalty`). Why k2's gradient: as a loss it is the on-policy reverse-KL gradient,
# the gradient of k1 in the reward (Liu et al. 2025, "Rethinking KL Regularization in RLHF", arXiv:2510.01555).
STRAIGHT_THROUGH_ESTIMATORS = ("k1+", "k3+")

# The estimators that exponentiate the log-ratio (k3, k3+), and so overflow where it is far below 0: exp(−r) is inf in
# float32 below r ≈ −88.7. TRL's GRPO loss computes k3 and the importance ratio exp(log π − log π_old) from the raw
# log-ratio, so this package does too by default (`log_ratio_clip=None`): a policy far from its reference trains as
# stock TRL does. `kl_log_ratio_clip` (a config field) opts in to clamping that log-ratio to ±c first; Unsloth's loss
# clamps both to ±20 (`trainers.unsloth`), which its backend passes. k1 and k2 need no clamp (r and r²/2 of a finite
# log-ratio are finite) and never get one.
EXPONENTIAL_ESTIMATORS = ("k3", "k3+")


def clamp_log_ratio(log_ratio: torch.Tensor, bound: float | None) -> torch.Tensor:
    """Clamps ``r`` to ``[-bound, bound]`` (no clamp for `None`), upcasting half precision to float32. Outside the
    range the clamped value is constant: a clamped token carries no gradient.

    Args:
        log_ratio (`torch.Tensor` of shape `(B, T)`): a log-ratio at the sampled tokens.
        bound (`float` or `None`): c > 0, or `None`.

    Returns:
        `torch.Tensor` of shape `(B, T)` (float32 when the input was float16/bfloat16).
    """
    if log_ratio.dtype in (torch.float16, torch.bfloat16):  # their estimates would round too coarsely
        log_ratio = log_ratio.float()
    return log_ratio if bound is None else log_ratio.clamp(-bound, bound)


def masked_log_ratio(
    per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """r = log π − log π_ref at the tokens `mask` counts, 0 at the others: whatever a padding token's log-probabilities
    are (−inf included), they reach no estimate, value or gradient.

    Args:
        per_token_logps, ref_per_token_logps (`torch.Tensor` of shape `(B, T)`): log π and log π_ref.
        mask (`torch.Tensor` of shape `(B, T)`): completion mask (bool or 0/1).

    Returns:
        `torch.Tensor` of shape `(B, T)`.
    """
    return torch.where(mask > 0, per_token_logps - ref_per_token_logps, 0.0)


def kl_estimate(log_ratio: torch.Tensor, estimator: str = "k3", log_ratio_clip: float | None = None) -> torch.Tensor:
    """Per-token KL estimate ``k = est(r)``.

    | estimator | k | as a loss |
    |---|---|---|
    | `"k1"` | r | unbiased for KL(π_θ‖π_ref), but zero expected gradient (it belongs in the reward) |
    | `"k2"` | r²/2 | its gradient is the on-policy reverse-KL gradient |
    | `"k3"` | exp(−r) + r − 1 ≥ 0 | TRL's default, and GRPO's (DeepSeekMath, arXiv:2402.03300, Eq. 4) |
    | `"k1+"`, `"k3+"` | the value of k1 / k3 | straight-through: the gradient of k2 |

    Args:
        log_ratio (`torch.Tensor` of shape `(B, T)`): `log π_θ − log π_ref` at the sampled tokens.
        estimator (`str`): one of `ESTIMATORS`.
        log_ratio_clip (`float`, *optional*): for k3 and k3+ (`EXPONENTIAL_ESTIMATORS`), clamp ``r`` to ±this value
            first (`clamp_log_ratio`, which also upcasts half precision); `None` (TRL's arithmetic): no clamp.

    Returns:
        `torch.Tensor` of shape `(B, T)`.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {ESTIMATORS}, got {estimator!r}.")
    r = clamp_log_ratio(log_ratio, log_ratio_clip if estimator in EXPONENTIAL_ESTIMATORS else None)
    # k1, k2, k3: J. Schulman, "Approximating KL Divergence" (2020), http://joschu.net/blog/kl-approx.html (there with
    # samples from q = π_θ, p = π_ref and ratio p/q = exp(−r)).
    if estimator == "k1":
        return r
    k2 = 0.5 * r.square() if estimator in ("k2", *STRAIGHT_THROUGH_ESTIMATORS) else None  # k3 at the defaults: none
    if estimator == "k2":
        return k2
    # k3 as expm1(−r) + r: accurate near r = 0, and never below zero (exp(−r) − 1 + r is, by half an ulp, for small
    # negative r)
    value = r if estimator == "k1+" else torch.expm1(-r) + r
    if estimator == "k3":
        return value
    # Straight-through, sg(value) + k2 − sg(k2): the forward value is `value` to the last bit (k2 − sg(k2) is exactly
    # zero) and the gradient is k2's, r·∇r, whatever the value reports
    return value.detach() + (k2 - k2.detach())


# The transforms `clip` and `sigmoid` are the seed "Adaptive KL Divergence for GRPO Training"'s (no published source).
def transform_kl(
    kl: torch.Tensor, transform: str | None, *, clip_threshold: float = 1.0, target: float = 0.1
) -> torch.Tensor:
    """Applies the per-token transform of ``kl_adaptation_method``: `None`, the identity; `"clip"`, f(k) = min(k, c),
    constant (zero gradient) above the threshold c; `"sigmoid"`, f(k) = σ(k − τ)·k, a smooth gate that damps KL below
    the target τ, differentiable through both factors.

    Args:
        kl (`torch.Tensor` of shape `(B, T)`): per-token KL estimate k.
        transform (`str` or `None`): `"clip"`, `"sigmoid"` or `None` (identity).
        clip_threshold (`float`): c for `"clip"`.
        target (`float`): τ for `"sigmoid"`.

    Returns:
        `torch.Tensor` of shape `(B, T)`: f(k).
    """
    if transform is None:
        return kl
    if transform == "clip":
        return kl.clamp(max=clip_threshold)
    if transform == "sigmoid":
        return torch.sigmoid(kl - target) * kl
    raise ValueError(f"Unknown KL transform {transform!r}; expected 'clip', 'sigmoid' or None.")


def estimate_and_transform(
    log_ratio: torch.Tensor,
    *,
    estimator: str = "k3",
    transform: str | None = None,
    clip_threshold: float = 1.0,
    target: float = 0.1,
    log_ratio_clip: float | None = None,
    weight: torch.Tensor | None = None,
    bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(k, f(k))`: the per-token estimate of `log_ratio` (`kl_estimate`), times `weight` when given (the bias
    correction's importance ratio), bounded to ±`bound` when given (Unsloth's loss bounds its KL), and its transform
    (`transform_kl`). Every KL of the package, in the loss and in the reward, is estimated and transformed here.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`, each of shape `(B, T)`.
    """
    kl = kl_estimate(log_ratio, estimator, log_ratio_clip)
    if weight is not None:
        kl = kl * weight
    if bound is not None:
        kl = kl.clamp(-bound, bound)
    return kl, transform_kl(kl, transform, clip_threshold=clip_threshold, target=target)


def importance_ratio(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    level: str = "token",
    log_ratio_clip: float | None = None,
) -> torch.Tensor:
    """The importance ratio π_θ/π_old that `use_bias_correction_kl` multiplies the estimate by (differentiable), as
    TRL's loss computes it (`coef_1`).

    Args:
        per_token_logps (`torch.Tensor` of shape `(B, T)`): log π_θ, carrying gradient.
        old_per_token_logps (`torch.Tensor` of shape `(B, T)`): log π_old (detached).
        mask (`torch.Tensor` of shape `(B, T)`): completion mask.
        level (`str`): `"token"` (one ratio per token) or `"sequence"` (exp of the masked mean log-ratio).
        log_ratio_clip (`float`, *optional*): clamp the log-ratio to ±this value before the exponential; `None`
            (TRL's arithmetic): no clamp.

    Returns:
        `torch.Tensor` of shape `(B, T)` for `"token"`, `(B, 1)` for `"sequence"`.
    """
    log_ratio = per_token_logps - old_per_token_logps
    if level == "token":
        return torch.exp(clamp_log_ratio(log_ratio, log_ratio_clip))
    if level == "sequence":
        return torch.exp(clamp_log_ratio(sequence_means(log_ratio, mask), log_ratio_clip).unsqueeze(-1))
    raise ValueError(f"importance_sampling_level must be 'token' or 'sequence', got {level!r}.")
