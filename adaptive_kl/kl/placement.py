"""KL in the reward (`kl_placement="reward"`, and RLOO's): the sequence penalty and the advantages it enters (GRPO's
group advantages, RLOO's leave-one-out ones).

The detached penalty P_i = β_t · Σ_t m_it f(k_it) (or β_t · K̄_i with `length_normalized`) is subtracted from
completion i's total reward before the group normalization, the PPO/REINFORCE convention; the loss then carries no
KL term. With k1 the penalty is the sampled sequence's log-ratio log π(y)/π_ref(y), an unbiased estimate of the
sequence-level reverse KL, so the policy gradient of the penalized reward is the gradient of the KL-regularized
objective E[R] − β·KL(π‖π_ref).
"""

from __future__ import annotations

import torch

from .aggregation import sequence_means
from .estimators import estimate_and_transform, masked_log_ratio
from .groups import nan_std
from .metrics import kl_sequence_sums


KL_PLACEMENTS = ("loss", "reward")
SCALE_REWARDS = ("group", "batch", "none")
# Added to the standard deviation before dividing (as TRL does), so a group with equal rewards gets zero advantages.
STD_EPSILON = 1e-4


# KL in the reward, a per-sequence penalty β·Σ_t k1 subtracted from the reward: InstructGPT (Ouyang et al. 2022,
# arXiv:2203.02155, Eq. 2), as RLOO does (Ahmadian et al. 2024, arXiv:2402.14740; TRL's `RLOOTrainer`).
def sequence_kl_penalty(
    per_token_logps: torch.Tensor,
    ref_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float,
    estimator: str = "k1",
    transform: str | None = None,
    clip_threshold: float = 1.0,
    target: float = 0.1,
    length_normalized: bool = False,
    log_ratio_clip: float | None = None,
) -> torch.Tensor:
    """P_i = β · Σ_t m_it f(k_it), or β · Σ_t m_it f(k_it) / L_i when `length_normalized`; detached.

    Args:
        per_token_logps (`torch.Tensor` of shape `(B, T)`): log π at the sampled tokens, under the policy that sampled
            them.
        ref_per_token_logps (`torch.Tensor` of shape `(B, T)`): log π_ref.
        mask (`torch.Tensor` of shape `(B, T)`): completion mask (tool-output tokens excluded).
        beta (`float`): β_t.
        estimator, transform, clip_threshold, target: the per-token estimate k and transform f (see `adaptive_kl.kl`).
        length_normalized (`bool`): the per-sequence mean instead of the sum.
        log_ratio_clip (`float`, *optional*): clamp k3's log-ratio to ±this value first (`kl_log_ratio_clip`).

    Returns:
        `torch.Tensor` of shape `(B,)`: float32, or float64 for float64 log-probabilities.
    """
    with torch.no_grad():
        _, adapted = estimate_and_transform(
            masked_log_ratio(per_token_logps, ref_per_token_logps, mask), estimator=estimator, transform=transform,
            clip_threshold=clip_threshold, target=target, log_ratio_clip=log_ratio_clip,
        )  # fmt: skip
        mask = mask.to(adapted.dtype)
        per_sequence = sequence_means(adapted, mask) if length_normalized else (adapted * mask).sum(-1)
        return beta * per_sequence


def total_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """The total reward TRL logs as `reward`: Σ_k w_k·r_k over the reward functions that scored the completion, NaN
    where none did.

    Args:
        rewards_per_func (`torch.Tensor` of shape `(N, K)`): rewards per completion and function, NaN where a function
            returned None.
        reward_weights (`torch.Tensor` of shape `(K,)`).

    Returns:
        `torch.Tensor` of shape `(N,)`.
    """
    rewards = (rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


# GRPO's group-relative advantages: DeepSeekMath (arXiv:2402.03300) §4.1.2, with TRL's `scale_rewards` variants.
def group_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group") -> torch.Tensor:
    """GRPO advantages of total rewards: minus the group mean, divided by the group's (or batch's) std + 1e-4.

    NaN rewards (completions no reward function scored) are left out of every mean and std and get advantage 0.
    With one completion per group the std is taken as 0 (the advantage is then 0).

    Args:
        rewards (`torch.Tensor` of shape `(N,)`): total rewards of the generation batch over all processes, groups of
            `num_generations` consecutive completions.
        num_generations (`int`): G.
        scale_rewards (`str`): `"group"`, `"batch"` or `"none"`.

    Returns:
        `torch.Tensor` of shape `(N,)`.
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}.")
    grouped = rewards.view(-1, num_generations)
    advantages = (grouped - grouped.nanmean(dim=1, keepdim=True)).view(-1)
    if scale_rewards != "none":
        if scale_rewards == "batch":
            std = nan_std(rewards) if rewards.numel() > 1 else rewards.new_zeros(())
        else:
            std = (
                nan_std(grouped, dim=1, keepdim=True) if num_generations > 1 else grouped.new_zeros(grouped.size(0), 1)
            )
            std = std.expand_as(grouped).reshape(-1)
        advantages = advantages / (std + STD_EPSILON)
    return torch.nan_to_num(advantages, nan=0.0)


# RLOO's leave-one-out advantages: Ahmadian et al. 2024 (arXiv:2402.14740) Eq. 4 (Kool et al. 2019's baseline), with
# TRL's `RLOOTrainer` handling of unscored completions and its optional normalization (`normalize_advantages`).
def leave_one_out_advantages(rewards: torch.Tensor, num_generations: int, normalize: bool = False) -> torch.Tensor:
    """RLOO advantages: each reward minus the mean of the other scored rewards of its group.

    A_i = r_i − (Σ_{j≠i} r_j) / (n − 1) over the n scored (non-NaN) completions of the group. NaN rewards are left out
    of every baseline and get advantage 0, as does a group with a single scored completion; with one completion per
    group every advantage is 0. `normalize` then standardizes the advantages over the scored ones of the whole batch:
    (A − mean) / (std + 1e-4).

    Args:
        rewards (`torch.Tensor` of shape `(N,)`): total rewards (minus any KL penalty) of the generation batch over all
            processes, groups of `num_generations` consecutive completions.
        num_generations (`int`): the group size.
        normalize (`bool`): standardize over the batch (TRL's `normalize_advantages`).

    Returns:
        `torch.Tensor` of shape `(N,)`.
    """
    if num_generations < 2:
        return torch.zeros_like(rewards)
    grouped = rewards.view(-1, num_generations)
    scored = (~grouped.isnan()).sum(dim=1, keepdim=True)
    others = grouped.nansum(dim=1, keepdim=True) - grouped  # NaN for an unscored completion: it stays NaN
    advantages = (grouped - others / (scored - 1)).view(-1)  # 0/0 = NaN for a lone scored completion
    if normalize:
        advantages = (advantages - advantages.nanmean()) / (nan_std(advantages) + STD_EPSILON)
    return torch.nan_to_num(advantages, nan=0.0)


def penalty_sequence_sums(
    per_token_logps: torch.Tensor,
    ref_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    estimator: str = "k1",
    transform: str | None = None,
    clip_threshold: float = 1.0,
    target: float = 0.1,
    log_ratio_clip: float | None = None,
) -> torch.Tensor:
    """The per-sequence sums (`adaptive_kl.kl.metrics.kl_sequence_sums`) of the `adaptive_kl/*` statistics of the
    tokens a penalty in the reward was computed from: for the metrics and the β controllers (RLOO logs its own `kl`).

    Args:
        per_token_logps, ref_per_token_logps, mask (`torch.Tensor` of shape `(B, T)`): as for `sequence_kl_penalty`.
        estimator, transform, clip_threshold, target, log_ratio_clip: the per-token estimate k and transform f.

    Returns:
        `torch.Tensor` of shape `(5, B)`.
    """
    with torch.no_grad():
        kl, adapted = estimate_and_transform(
            masked_log_ratio(per_token_logps, ref_per_token_logps, mask), estimator=estimator, transform=transform,
            clip_threshold=clip_threshold, target=target, log_ratio_clip=log_ratio_clip,
        )  # fmt: skip
        clipped_at = clip_threshold if transform == "clip" else None
        return kl_sequence_sums(kl, adapted, mask, clip_threshold=clipped_at)
