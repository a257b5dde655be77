"""Runs of one variant over several seeds: grouping, and 95% intervals of a mean and of paired differences.

`adaptive-kl compare ... --seed 0,1,2` runs every variant once per seed; its runs are named `<variant>, seed=<s>`
and carry `seed` in their config. A variant's value of a summary metric is the mean over its seeds, written
`mean ± half-width` with the half-width of the two-sided 95% t-interval over seeds (t_{0.975, n−1} · s / √n). Two
variants are compared on the seeds they share: the mean of the per-seed differences, with its own t-interval.
"""

from __future__ import annotations

import math
import statistics

from .runner import VariantRun


SEED_FIELD = "seed"

# Two-sided 95% quantiles of Student's t, t_{0.975, df}, for df = 1 … 30; beyond, the df = 30 value (conservative).
T_975 = (
    12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
    2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
    2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272,
)  # fmt: skip


def t_975(degrees_of_freedom: int) -> float:
    """t_{0.975, df} for df >= 1 (the df = 30 value beyond 30: intervals slightly wider than exact)."""
    if degrees_of_freedom < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {degrees_of_freedom}")
    return T_975[min(degrees_of_freedom, len(T_975)) - 1]


def mean_interval(values) -> tuple[float, float, int]:
    """`(mean, half-width of the 95% t-interval, n)` of the finite `values`; the half-width is NaN below 2 values,
    and everything NaN without any."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, 0
    mean = statistics.fmean(finite)
    if len(finite) < 2:
        return mean, math.nan, 1
    return mean, t_975(len(finite) - 1) * statistics.stdev(finite) / math.sqrt(len(finite)), len(finite)


def group_name(run: VariantRun) -> str:
    """The run's variant without its seed: `"kl_scaling=sqrt, seed=1"` → `"kl_scaling=sqrt"` (`"default"` when the
    seed was the only varied field)."""
    parts = [part for part in run.name.split(", ") if not part.startswith(f"{SEED_FIELD}=")]
    return ", ".join(parts) or "default"


def seed_groups(runs: list[VariantRun]) -> dict[str, list[VariantRun]]:
    """Variant (without seed) → its runs, in the order the variants first appear."""
    groups: dict[str, list[VariantRun]] = {}
    for run in runs:
        groups.setdefault(group_name(run), []).append(run)
    return groups


def run_seed(run: VariantRun):
    """The seed the run was trained with (`None` when the comparison did not vary it)."""
    return run.config.get(SEED_FIELD)


def paired_differences(runs: list[VariantRun], baseline: list[VariantRun], value) -> list[float]:
    """`value(run) − value(baseline run)` for each seed both lists ran, in the order of `runs`."""
    by_seed = {run_seed(run): run for run in baseline}
    return [value(run) - value(by_seed[run_seed(run)]) for run in runs if run_seed(run) in by_seed]


def format_interval(mean: float, half_width: float, spec: str) -> str:
    """`"0.480 ± 0.035"`; the mean alone for a single value; `"n/a"` for none."""
    if math.isnan(mean):
        return "n/a"
    if math.isnan(half_width):
        return format(mean, spec)
    return f"{format(mean, spec)} ± {format(half_width, spec.lstrip('+'))}"
