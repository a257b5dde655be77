"""The `adaptive_kl/*` metrics, computed from additive sufficient statistics.

Every metric is a ratio of sums, so statistics can be summed over micro-batches, accumulation steps and processes
(one all-reduce) before the ratio is taken: means are token-weighted and global, and the length/KL correlation is
the Pearson correlation over every sequence of the window, not an average of per-batch correlations.
"""

from __future__ import annotations

import math

import torch


# Order of the entries of the statistics vector.
STAT_NAMES = (
    "tokens",  # Σ m
    "raw_kl",  # Σ m·k
    "adapted_kl",  # Σ m·f(k)
    "clipped",  # Σ m·[k > c]
    "host_kl",  # Σ m·(the per-token KL TRL's GRPO loss logs as `kl`: k3, bias-corrected like the loss)
    "sequences",  # number of sequences in the batch
    "seq_kl",  # Σ_i Σ_t m·k
    "corr_n",  # sequences with L_i > 0 (those that enter the correlation)
    "corr_x",  # Σ L_i
    "corr_y",  # Σ K̄_i (per-sequence mean raw KL)
    "corr_xx",
    "corr_yy",
    "corr_xy",
)
STAT_INDEX = {name: i for i, name in enumerate(STAT_NAMES)}

METRIC_NAMES = (
    "adaptive_kl/raw_kl",
    "adaptive_kl/adapted_kl",
    "adaptive_kl/current_beta",
    "adaptive_kl/beta_scale",
    "adaptive_kl/clip_fraction",
    "adaptive_kl/seq_kl",
    "adaptive_kl/kl_length_corr",
)


def kl_sequence_sums(
    raw_kl: torch.Tensor,
    adapted_kl: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_threshold: float | None = None,
    host_kl: torch.Tensor | None = None,
) -> torch.Tensor:
    """The per-sequence sums of one batch that every statistic is made of (float64, detached): what a trainer keeps of
    each micro-batch, to be turned into statistics (`statistics_of_sequences`) only when they are read.

    Args:
        raw_kl (`torch.Tensor` of shape `(B, T)`): k, the per-token estimate before the transform.
        adapted_kl (`torch.Tensor` of shape `(B, T)`): f(k).
        mask (`torch.Tensor` of shape `(B, T)`): completion mask, 0 or 1.
        clip_threshold (`float`, *optional*): c when the clip transform is active (tokens with k > c are counted).
        host_kl (`torch.Tensor` of shape `(B, T)`, *optional*): the per-token KL TRL's GRPO loss logs as `kl` (k3, and
            bias-corrected like its loss), when it differs from `raw_kl`; `None`: `raw_kl` (a host that logs its own
            KL, as RLOO does, reads nothing from this entry).

    Returns:
        `torch.Tensor` of shape `(5, B)`: per sequence, Σ_t m, Σ_t m·k, Σ_t m·f(k), Σ_t m·[k > c] and Σ_t m·k_host
        (the first five of `STAT_NAMES`).
    """
    dtype = torch.float32 if raw_kl.device.type == "mps" else torch.float64
    # Every per-token quantity masked by one product in its own dtype (exact: the mask is 0 or 1; the mask row
    # becomes m² = m), then summed per sequence, accumulated in float64 without a float64 copy.
    with torch.no_grad():
        clipped = raw_kl > clip_threshold if clip_threshold is not None else torch.zeros_like(mask)
        host = raw_kl if host_kl is None else host_kl
        per_token = torch.stack([mask, raw_kl, adapted_kl, clipped, host])  # (5, B, T)
        return (per_token * mask).sum(-1, dtype=dtype)  # (5, B)


def statistics_of_sequences(sums: torch.Tensor) -> torch.Tensor:
    """The statistics, in the order of `STAT_NAMES`, of the sequences whose `kl_sequence_sums` are `sums` (`(5, N)`:
    one batch's, or several batches' concatenated along the sequences). Additive: the statistics of several batches are
    the sum of theirs (up to float64 rounding), so they can be summed over processes."""
    lengths, sequence_kl = sums[0], sums[1]
    # L_i and K̄_i where L_i > 0; where L_i = 0 both are 0 already (every term of the sums was masked)
    x, y = lengths, sequence_kl / lengths.clamp(min=1.0)
    # Every statistic is a sum over the sequences, in the order of `STAT_NAMES`: the sums' five totals, the number of
    # sequences (a sum of ones: exact), Σ_i Σ_t m·k again (seq_kl), then the moments (Σ L_i is the tokens again). One
    # reduction: on a CPU each tensor operation costs microseconds, those right after a backward tens.
    moments = torch.stack([torch.ones_like(x), sequence_kl, (lengths > 0).to(sums.dtype), x, y, x * x, y * y, x * y])
    return torch.cat([sums, moments]).sum(-1)


def pearson_from_moments(n: float, sx: float, sy: float, sxx: float, syy: float, sxy: float) -> float:
    """Pearson correlation from sums; 0 when there are fewer than two points or either variable has no spread.

    NaN when a sum is not finite (a NaN or inf KL has no correlation; Python's min/max would turn NaN into ±1).
    """
    if not all(math.isfinite(v) for v in (n, sx, sy, sxx, syy, sxy)):
        return float("nan")
    if n < 2:
        return 0.0
    mean_x, mean_y = sx / n, sy / n
    var_x = sxx / n - mean_x * mean_x  # not ** 2: that raises OverflowError instead of giving inf
    var_y = syy / n - mean_y * mean_y
    # Relative tolerance: a variance at rounding-error level of the second moment is no spread.
    if var_x <= 1e-12 * max(sxx / n, 1e-300) or var_y <= 1e-12 * max(syy / n, 1e-300):
        return 0.0
    cov = sxy / n - mean_x * mean_y
    # One square root per variance: their product underflows or overflows for data at extreme scales.
    return max(-1.0, min(1.0, cov / math.sqrt(var_x) / math.sqrt(var_y)))


def kl_metrics(stats: torch.Tensor, *, beta: float, beta_scale: float) -> dict[str, float]:
    """Turns summed statistics into the `adaptive_kl/*` metrics."""
    s = dict(zip(STAT_NAMES, stats.tolist()))
    tokens = max(s["tokens"], 1.0)
    return {
        "adaptive_kl/raw_kl": s["raw_kl"] / tokens,
        "adaptive_kl/adapted_kl": s["adapted_kl"] / tokens,
        "adaptive_kl/current_beta": beta,
        "adaptive_kl/beta_scale": beta_scale,
        "adaptive_kl/clip_fraction": s["clipped"] / tokens,
        "adaptive_kl/seq_kl": s["seq_kl"] / max(s["sequences"], 1.0),
        "adaptive_kl/kl_length_corr": pearson_from_moments(
            s["corr_n"], s["corr_x"], s["corr_y"], s["corr_xx"], s["corr_yy"], s["corr_xy"]
        ),
    }
