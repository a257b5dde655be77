"""Zero-std groups: groups of completions of one prompt whose total rewards all agree.

GRPO's advantages are the rewards minus their group's mean, so such a group has zero advantages: it carries no policy
gradient, only the KL's (TRL issue #5588). TRL logs their share as `frac_reward_zero_std`; the saturation trigger of
`dynamic` reads it (`zero_std_group_fraction`) and the KL mask removes their KL (`zero_std_groups`). Both decide as TRL
does: the sample std of the group's scored rewards (TRL's `nanstd`: NaN with fewer than two, or when every deviation
is inf − inf), zero when `torch.isclose(std, 0)`, always per group.
"""

from __future__ import annotations

import torch


def nan_std(values: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """The sample standard deviation (n − 1) of the non-NaN entries of `values` over `dim` (all of them for `None`),
    in TRL's arithmetic (its `nanstd`), so that advantages normalized with it are stock's bit for bit: the mean of the
    squared deviations from the mean, times Bessel's correction n / (n − 1) taken from the integer counts in the
    default float dtype, then the square root.

    Args:
        values (`torch.Tensor`): any shape; NaN entries are left out.
        dim (`int`, *optional*): the dimension to reduce; `None`: all.
        keepdim (`bool`): keep `dim` with size 1 (not with `dim=None`, which gives a scalar).

    Returns:
        `torch.Tensor`: NaN where fewer than two entries are not NaN, or where every deviation is inf − inf.
    """
    if dim is None:
        return nan_std(values.reshape(-1), dim=0)
    count = (~values.isnan()).sum(dim=dim, keepdim=True)  # int64
    squares = (values - values.nanmean(dim=dim, keepdim=True)).square()  # inf − inf: NaN, as in TRL's nanstd
    variance = squares.nanmean(dim=dim, keepdim=True)
    # The correction first, on its own (int / int: the default float dtype), then one product: (v·n)/(n − 1) rounds
    # differently in the last bit for 41% of float32 vectors.
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    std = (variance * correction).sqrt()
    return std if keepdim else std.squeeze(dim)


def group_reward_std(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """The sample standard deviation of each group's non-NaN rewards (`nan_std`).

    Args:
        rewards (`torch.Tensor` of shape `(N,)`): total rewards of a generation batch over all processes, NaN where no
            reward function scored the completion; groups of `group_size` consecutive completions.
        group_size (`int`): completions per prompt (`num_generations`), dividing N.

    Returns:
        `torch.Tensor` of shape `(N / group_size,)`: NaN for a group with fewer than two scored rewards, or whose
        every deviation is inf − inf; 0 for every group when `group_size` is 1 (TRL's convention).
    """
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"group_size must be >= 1 and divide the {rewards.numel()} rewards, got {group_size}.")
    grouped = rewards.detach().reshape(-1, group_size)  # in the rewards' dtype, as TRL tests them
    if group_size == 1:
        return grouped.new_zeros(grouped.size(0))
    return nan_std(grouped, dim=1)


def zero_std_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which completions belong to a zero-std group (`kl_mask_zero_std_groups`).

    Args:
        rewards (`torch.Tensor` of shape `(N,)`), group_size (`int`): as for `group_reward_std`.

    Returns:
        `torch.Tensor` of shape `(N,)`, bool: True for every completion of a group whose std is close to 0; a group
        whose std is NaN (fewer than two scored) is not zero-std, as TRL counts it.
    """
    std = group_reward_std(rewards, group_size)
    return torch.isclose(std, torch.zeros_like(std)).repeat_interleave(group_size)


def zero_std_group_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """The fraction of zero-std groups (`dynamic_trigger="saturation"`'s statistic): TRL's `frac_reward_zero_std`
    under `multi_objective_aggregation="sum_then_normalize"` with `scale_rewards` "group" or "none".

    Args:
        rewards (`torch.Tensor` of shape `(N,)`), group_size (`int`): as for `group_reward_std`.

    Returns:
        `float` in [0, 1]; NaN when no group has two scored rewards (nothing measured, as the mean reward is NaN when
        none was scored), or for an empty batch.
    """
    std = group_reward_std(rewards, group_size)
    if not std.numel() or std.isnan().all():
        return float("nan")
    return torch.isclose(std, torch.zeros_like(std)).double().mean().item()
