"""Runs of one variant over several seeds: grouping, and 95% intervals of a mean and of paired differences.

`adaptive-kl compare ... --seed 0,1,2` runs every variant once per seed; its runs are named `<variant>, seed=<s>`
and carry `seed` in their config. A variant's value of a summary metric is the mean over its seeds, written
`mean ± half-width` with the half-width of the two-sided 95% t-interval over seeds (t_{0.975, n−1} · s / √n). Two
variants are compared on the seeds they share: the mean of the per-seed differences, with its own t-interval, its
two-sided t-test p-value (`t_test_p`), Holm's adjustment of several such p-values (`holm`) and the difference the same
design would detect at 80% power (`detectable_difference`). Two variants' spreads over seeds are compared by the
ratio of their standard deviations with its F interval (`sd_ratio_interval`). Student's t and the incomplete beta
function behind F are computed here (`t_cdf`, `t_quantile`, `regularized_beta`): the package does not depend on scipy.
"""

from __future__ import annotations

import math
import statistics

from .runner import VariantRun


SEED_FIELD = "seed"


def mean_interval(values) -> tuple[float, float, int]:
    """`(mean, half-width of the 95% t-interval, n)` of the finite `values`; the half-width is NaN below 2 values,
    and everything NaN without any."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, 0
    mean = statistics.fmean(finite)
    if len(finite) < 2:
        return mean, math.nan, 1
    return mean, t_quantile(0.975, len(finite) - 1) * statistics.stdev(finite) / math.sqrt(len(finite)), len(finite)


def t_cdf(t: float, degrees_of_freedom: int) -> float:
    """P(T ≤ t) for Student's t with an integer number of degrees of freedom ν ≥ 1, from the closed finite series of
    Abramowitz & Stegun 26.7.3 (ν odd) and 26.7.4 (ν even) for A(t|ν) = P(|T| ≤ |t|), in θ = atan(|t|/√ν):

        ν = 1:     A = 2θ/π
        ν odd:     A = (2/π)·(θ + sin θ·(cos θ + (2/3)·cos³θ + … + (2·4···(ν−3))/(1·3···(ν−2))·cos^(ν−2) θ))
        ν even:    A = sin θ·(1 + (1/2)·cos²θ + (1·3)/(2·4)·cos⁴θ + … + (1·3···(ν−3))/(2·4···(ν−2))·cos^(ν−2) θ)

    exact up to rounding (ν terms at most); ±inf give 1 and 0."""
    if degrees_of_freedom < 1 or int(degrees_of_freedom) != degrees_of_freedom:
        raise ValueError(f"degrees of freedom must be an integer >= 1, got {degrees_of_freedom}")
    if math.isnan(t):
        return math.nan
    nu = int(degrees_of_freedom)
    theta = math.atan(abs(t) / math.sqrt(nu))
    sine, cosine = math.sin(theta), math.cos(theta)
    if nu % 2:
        # Terms cos^(2k+1) θ with the coefficient (2·4···2k)/(1·3···(2k+1)), k = 0 … (ν−3)/2.
        total, term = 0.0, cosine
        for k in range((nu - 1) // 2):
            total += term
            term *= cosine * cosine * (2 * k + 2) / (2 * k + 3)
        inside = 2 / math.pi * (theta + sine * total)
    else:
        # Terms cos^(2k) θ with the coefficient (1·3···(2k−1))/(2·4···2k), k = 0 … (ν−2)/2.
        total, term = 0.0, 1.0
        for k in range(nu // 2):
            total += term
            term *= cosine * cosine * (2 * k + 1) / (2 * k + 2)
        inside = sine * total
    inside = min(1.0, inside)  # rounding can overshoot 1 by an ulp far in the tail
    return 0.5 + inside / 2 if t >= 0 else 0.5 - inside / 2


def t_quantile(probability: float, degrees_of_freedom: int) -> float:
    """t with P(T ≤ t) = `probability` (0 < probability < 1), by bisection on `t_cdf` (`crossing`)."""
    if not 0 < probability < 1:
        raise ValueError(f"probability must be in (0, 1), got {probability}")
    if probability == 0.5:
        return 0.0
    if probability < 0.5:  # the distribution is symmetric about 0
        return -t_quantile(1 - probability, degrees_of_freedom)
    return crossing(lambda t: t_cdf(t, degrees_of_freedom), probability, 0.0, 1.0)


def crossing(rising, level: float, low: float, high: float) -> float:
    """The x ≥ `low` where the nondecreasing `rising(x)` reaches `level` (`rising(low)` below it), by bisection to
    1e-12 (relative beyond 1): `high` is doubled until `rising(high)` reaches `level`, then the bracket halved 200
    times at most."""
    while rising(high) < level:
        low, high = high, 2 * high
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if rising(middle) < level else (low, middle)
        if high - low <= 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def t_test_p(values) -> float:
    """The two-sided p-value of the one-sample t-test of mean 0 on the finite `values` (n − 1 degrees of freedom): for
    paired differences, the paired t-test. NaN below 2 values; with no spread at all, 0 when the mean is not 0 (every
    seed moved by the same amount) and 1 when it is."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if len(finite) < 2:
        return math.nan
    mean, spread = statistics.fmean(finite), statistics.stdev(finite)
    if spread == 0:
        return 0.0 if mean != 0 else 1.0
    t = mean / (spread / math.sqrt(len(finite)))
    return 2 * (1 - t_cdf(abs(t), len(finite) - 1))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values, in their order: the i-th smallest of the m p-values becomes
    max over j ≤ i of min(1, (m − j + 1)·p_(j)), so that rejecting where the adjusted p < α keeps the family-wise error
    at α. A NaN p-value (a comparison with no test: fewer than 2 seeds) stays NaN and is not counted in m."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


def detectable_difference(values) -> float:
    """The smallest true mean difference the same design detects with 80% power at two-sided α = 0.05, given the
    spread of the finite `values` (paired differences): (t_{0.975, n−1} + t_{0.80, n−1}) · s / √n. NaN below 2
    values."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if len(finite) < 2:
        return math.nan
    n = len(finite)
    return (t_quantile(0.975, n - 1) + t_quantile(0.80, n - 1)) * statistics.stdev(finite) / math.sqrt(n)


def binomial_interval(successes: int, trials: int) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided 95% interval of a proportion from `successes` of `trials`: the least p
    with P(X ≥ k | p) ≥ 0.025 and the largest with P(X ≤ k | p) ≥ 0.025 (0 and 1 at the ends), by bisection on the
    binomial distribution. `(nan, nan)` without trials."""
    if trials == 0:
        return math.nan, math.nan

    def at_most(k: int, p: float) -> float:  # P(X ≤ k) for X ~ Binomial(trials, p)
        return sum(math.comb(trials, i) * p**i * (1 - p) ** (trials - i) for i in range(k + 1))

    # P(X ≥ k) reaches 0.025 at the lower end, P(X > k) reaches 0.975 (P(X ≤ k) = 0.025) at the upper; both are 1 at
    # p = 1, so [0, 1] brackets each.
    lower = 0.0 if successes == 0 else crossing(lambda p: 1 - at_most(successes - 1, p), 0.025, 0.0, 1.0)
    upper = 1.0 if successes == trials else crossing(lambda p: 1 - at_most(successes, p), 0.975, 0.0, 1.0)
    return lower, upper


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and x in [0, 1]: x^a (1 − x)^b / (a B(a, b))
    over the continued fraction 1 + d_1/(1 + d_2/(1 + …)) of DLMF 8.17.22, with
    d_{2m} = m (b − m) x / ((a + 2m − 1)(a + 2m)) and d_{2m+1} = −(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1)),
    evaluated by the modified Lentz method; beyond x = (a + 1)/(a + b + 2), where the fraction converges slowly, as
    1 − I_{1−x}(b, a)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    if x > (a + 1) / (a + b + 2):
        return 1 - regularized_beta(1 - x, b, a)
    log_front = (
        a * math.log(x) + b * math.log1p(-x) - math.log(a) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    )
    tiny = 1e-300  # stands in for a zero numerator or denominator, as Lentz's method prescribes
    fraction, c, d = 1.0, 1.0, 0.0  # f_0 = C_0 = 1 (the fraction's leading 1), D_0 = 0
    for j in range(1, 400):
        m = j // 2
        if j % 2:
            term = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            term = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1 + term * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + term / c
        c = c if abs(c) > tiny else tiny
        fraction *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return math.exp(log_front) / fraction


def sd_ratio_interval(values, others) -> tuple[float, float, float]:
    """`(ratio, low, high)`: the ratio of the standard deviations of the finite `values` and `others` (two
    independent samples) and its 95% interval from the F distribution with n − 1 and m − 1 degrees of freedom:
    √(r² / F_{0.975}) to √(r² / F_{0.025}), r² the ratio of variances, F's quantiles by bisection on its CDF
    I_{d₁f/(d₁f + d₂)}(d₁/2, d₂/2). NaN where either has fewer than 2 values or `others` has no spread."""
    values, others = ([float(v) for v in vs if v is not None and math.isfinite(v)] for vs in (values, others))
    if len(values) < 2 or len(others) < 2 or statistics.stdev(others) == 0:
        return math.nan, math.nan, math.nan
    d1, d2 = len(values) - 1, len(others) - 1
    ratio = statistics.stdev(values) / statistics.stdev(others)

    def f_quantile(probability: float) -> float:
        return crossing(lambda f: regularized_beta(d1 * f / (d1 * f + d2), d1 / 2, d2 / 2), probability, 0.0, 1.0)

    return ratio, ratio / math.sqrt(f_quantile(0.975)), ratio / math.sqrt(f_quantile(0.025))


def format_p(p: float) -> str:
    """A p-value as a summary writes it: 4 decimals, `< 0.0001` below, `n/a` without a test."""
    if math.isnan(p):
        return "n/a"
    return "< 0.0001" if p < 0.0001 else f"{p:.4f}"


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
