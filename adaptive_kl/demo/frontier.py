"""Methods read against constant β's frontier: does a method earn more reward than a constant β at the same drift?

A frontier study (`scripts/run_real_studies.py`, its `frontier` entry) runs constant β at several values (the *line*)
and each method on the same seeds. On seed s, constant β's frontier F_s is the piecewise-linear interpolation of the
gain y (a `report.summarize` key: the reward of the last quarter of steps) against the drift x (the held-out KL to
the start at the last step) through that seed's line points taken in order of x, held flat beyond the first and last
points (`interpolate`). With `Frontier.start_steps`, the start's point is on every line too: drift 0, and for each
metric its value at the start (`START_VALUES`: the reward of the first steps, the step-0 evaluation, 0 for a change),
so that a method that drifted less than every constant β is read against a line that falls towards the start rather
than one held flat. A method's primary reading on seed s is D = y − F_s(x): how much more it earned than constant
β did at its drift, paired by seed because a seed fixes what every arm shares (the prompts' order, the sampling
stream, the LoRA's start). Beside it, the mirror x − G_s(y): how much further it drifted than constant β needed for
its reward (`reach`); D against the most reward constant β earned at that drift or less (`best_at_most`), a reading
added after the runs began, for lines that dip; and each secondary metric minus the line's interpolation of that
metric at the method's x.

Over the seeds (a seed counts only where the method and every line point have a finished run): mean ± the 95% t
half-width, the two-sided one-sample t-test of D, Holm-adjusted across the methods (`seeds.holm`), and the smallest
D the design detects with 80% power. `frontier_sections` writes the summary's sections, `write_frontiers_plot` the
picture of it.
"""

from __future__ import annotations

import math
import os
import statistics
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass

from .report import (
    finite_mean,
    interval_cell,
    late_mean,
    markdown_table,
    metric_column,
    summarize,
    write_report,
)
from .runner import VariantRun
from .seeds import (
    binomial_interval,
    detectable_difference,
    format_interval,
    format_p,
    holm,
    mean_interval,
    run_seed,
    sd_ratio_interval,
    seed_groups,
    t_test_p,
)


@dataclass(frozen=True)
class Frontier:
    """What a frontier study states before its runs: `line`, constant β's variants as `compare --variant` names them
    (`"beta=0.02, loss_type=grpo"`), in order of β; `x` the drift and `y` the gain, keys of `report.summarize`;
    `secondary`, the keys read at matched drift; and `y_range`, the values the gain can take (a reward of 0 or 1 per
    completion: `(0.0, 1.0)`), where the picture's bars stop. Every other variant of the study is a method.

    `start_steps` (0: none) puts the start's point on every seed's line (`start_point`): for the reward, the mean of
    the first `start_steps` steps of the seed's constant-β runs. `start_added_after_runs` says the study stated its
    endpoint without it: its summary then gives the stated D and, beside it, the D with the start as a correction.
    `learned`, `(logged metric, threshold)`: a run learned the task when the last quarter's mean of the metric reaches
    the threshold; the summary counts the seeds that did per arm."""

    line: tuple[str, ...]
    x: str = "final_kl_to_start"
    y: str = "late_reward"
    secondary: tuple[str, ...] = ()
    y_range: tuple[float, float] = (-math.inf, math.inf)
    start_steps: int = 0
    start_added_after_runs: bool = False
    learned: tuple[str, float] | None = None


# Family-wise error rate of the primary endpoint across the methods (Holm).
ALPHA = 0.05
# Each metric of a frontier at the start of every run, the start's point of the line (`start_point`): None for 0 (the
# start's KL to itself; no change yet), "reward" for the mean reward of the first `start_steps` steps, else the key of
# the run's first evaluation (step 0).
START_VALUES = {
    "final_kl_to_start": None,
    "late_reward": "reward",
    "delta_retention": None,
    "length_drift": None,
    "final_accuracy": "val_accuracy",
    "final_answer_accuracy": "val_answer_accuracy",
    "final_val_reward": "val_reward",
}


# Columns of constant β's table after x and y: what a user choosing a β weighs besides drift and reward (each shown
# when some run measured it: the accuracy on the built-in tasks, the held-out reward on a user's `--dataset`).
LINE_COLUMNS = (
    "mean_completion_length",
    "length_drift",
    "delta_retention",
    "final_answer_accuracy",
    "final_val_reward",
)


def curve(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The frontier's vertices: the `(x, y)` points sorted by x, points of equal x merged into one at their mean y
    (two β that drift alike are one measurement of the reward there, not a vertical step)."""
    by_x: dict[float, list[float]] = {}
    for x, y in points:
        by_x.setdefault(x, []).append(y)
    return [(x, sum(ys) / len(ys)) for x, ys in sorted(by_x.items())]


def interpolate(points: Iterable[tuple[float, float]], x: float) -> float:
    """F(x): the piecewise-linear interpolation through `curve(points)`, held flat beyond its first and last vertices
    (the frontier says nothing past the measured drifts, so the nearest measured y stands for them). NaN without
    points."""
    vertices = curve(points)
    if not vertices:
        return math.nan
    if x <= vertices[0][0]:
        return vertices[0][1]
    for (x0, y0), (x1, y1) in zip(vertices, vertices[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return vertices[-1][1]


def reach(points: Iterable[tuple[float, float]], y: float) -> float:
    """G(y), the mirror of `interpolate`: the least x in the measured range at which the curve F reaches y. The first
    vertex's x when y is at or below F there (less drift is not measured); the x of the curve's highest vertex (the
    first, if several tie) when y is above all of it; otherwise the x where the first segment that reaches y crosses
    it, so that a curve that dips and rises again is read at its first crossing. NaN without points."""
    vertices = curve(points)
    if not vertices:
        return math.nan
    if y <= vertices[0][1]:
        return vertices[0][0]
    for (x0, y0), (x1, y1) in zip(vertices, vertices[1:]):
        if y1 >= y:  # y0 < y here: the segments before this one stayed below y
            return x0 + (x1 - x0) * (y - y0) / (y1 - y0)
    return max(vertices, key=lambda vertex: vertex[1])[0]


def best_at_most(points: Iterable[tuple[float, float]], x: float) -> float:
    """E(x): the most y the curve reaches at x or less, the larger of F(x) and every vertex's y at or left of x. Where
    the line dips (a constant β that drifted more earned less than one that drifted less), F reads the dip and E the
    better point before it: D against E is never above D against F, so a method above F only by sitting in a dip is
    not above E. Added once the frontier study's line was seen to dip (seeds 0 and 2), after its runs began: a
    sensitivity analysis beside the primary (the second frontier states it before its runs). NaN without points."""
    vertices = curve(points)
    if not vertices:
        return math.nan
    return max([interpolate(vertices, x), *(y for vertex_x, y in vertices if vertex_x <= x)])


@dataclass(frozen=True)
class PerSeed:
    """One reading on each seed that has it, `(seed, value)` in order of seed, and their mean ± the 95% t half-width
    (n − 1 degrees of freedom) over those `n` seeds."""

    pairs: list[tuple[int, float]]
    mean: float
    half_width: float
    n: int

    @classmethod
    def of(cls, pairs: Iterable[tuple[int, float]]) -> PerSeed:
        kept = sorted((seed, value) for seed, value in pairs if math.isfinite(value))
        mean, half_width, n = mean_interval([value for _, value in kept])
        return cls(kept, mean, half_width, n)

    @property
    def values(self) -> list[float]:
        return [value for _, value in self.pairs]


@dataclass(frozen=True)
class MethodReading:
    """A method against the frontier: its own `x` and `y` on the seeds of the primary reading; `above`, D = y − F_s(x)
    per seed; `above_best`, y − E_s(x) per seed (`best_at_most`); `mirror`, x − G_s(y) per seed; `secondary`, each
    secondary metric minus the line's interpolation of it at the method's x (key → readings); `outside`, the seeds
    where the method's x lies outside the drifts its line measured (read against a flat extrapolation); D's two-sided
    t-test `p`, its Holm-adjusted p across the methods (`holm_p`), the D the design detects with 80% power
    (`detectable`), and the `reading` those allow."""

    method: str
    x: PerSeed
    y: PerSeed
    above: PerSeed
    above_best: PerSeed
    mirror: PerSeed
    secondary: dict[str, PerSeed]
    outside: list[int]
    p: float
    holm_p: float
    detectable: float
    reading: str


def methods(runs: list[VariantRun], frontier: Frontier) -> list[str]:
    """The study's methods: every variant of `runs` not on the line, in the order they first appear."""
    return [name for name in seed_groups(runs) if name not in frontier.line]


def start_point(line_runs: list[VariantRun], steps: int) -> dict[str, float]:
    """The start's point of one seed's line: each `START_VALUES` metric, the mean over the seed's constant-β runs
    (NaN where none has it)."""
    point = {}
    for key, source in START_VALUES.items():
        if source is None:
            values = [0.0] * len(line_runs)
        elif source == "reward":  # each run's mean over its first `steps` logged steps
            values = [finite_mean([h["reward"] for h in run.history if "reward" in h][:steps]) for run in line_runs]
        else:  # NaN for a run without an evaluation or without this score
            values = [run.evaluations[0].get(source, math.nan) if run.evaluations else math.nan for run in line_runs]
        mean, _, count = mean_interval(values)
        point[key] = mean if count else math.nan
    return point


@dataclass(frozen=True)
class SeedLine:
    """One seed's line: the `summarize` row of each constant-β run, and the start's point (`start_point`) when the
    start is on the line."""

    points: list[dict[str, float]]
    start: dict[str, float] | None = None

    def curve(self, x: str, metric: str) -> list[tuple[float, float]] | None:
        """The `(x, metric)` points the line interpolates: every constant β's, and the start's where it has the metric;
        None when a constant β lacks x or the metric (a seed must have the whole line)."""
        points = [(row[x], row[metric]) for row in self.points]
        if not all(math.isfinite(value) for point in points for value in point):
            return None
        start = self.start or {}
        if math.isfinite(start.get(x, math.nan)) and math.isfinite(start.get(metric, math.nan)):
            points.append((start[x], start[metric]))
        return points


def line_by_seed(runs: list[VariantRun], frontier: Frontier, with_start: bool) -> dict[int, SeedLine]:
    """Seed → its line, for the seeds where every line point has a run; with the start's point when `with_start` (and
    the frontier states `start_steps`)."""
    groups = seed_groups(runs)
    by_seed: dict[int, list[VariantRun]] = {}
    for variant in frontier.line:
        for run in groups.get(variant, []):
            by_seed.setdefault(run_seed(run), []).append(run)
    return {
        seed: SeedLine(
            [summarize(run) for run in line_runs],
            start_point(line_runs, frontier.start_steps) if with_start and frontier.start_steps else None,
        )
        for seed, line_runs in by_seed.items()
        if len(line_runs) == len(frontier.line)
    }


def _against_line(line: SeedLine, method: dict[str, float], x: str, metric: str) -> float:
    """The method's `metric` minus the line's interpolation of `metric` against `x` at the method's x, on one seed;
    NaN when the method or any line point lacks x or the metric."""
    points = line.curve(x, metric)
    if points is None or not (math.isfinite(method[x]) and math.isfinite(method[metric])):
        return math.nan
    return method[metric] - interpolate(points, method[x])


def read_methods(runs: list[VariantRun], frontier: Frontier, with_start: bool | None = None) -> list[MethodReading]:
    """Every method read against the frontier (the primary endpoint, its mirror and the secondaries at matched
    drift), paired by seed, with D's p-values Holm-adjusted across the methods; the start's point on the line when
    `with_start` (default: when the frontier states `start_steps`)."""
    with_start = bool(frontier.start_steps) if with_start is None else with_start
    lines = line_by_seed(runs, frontier, with_start)
    groups = seed_groups(runs)
    x, y = frontier.x, frontier.y
    partial = []
    for method in methods(runs, frontier):
        paired = [(run_seed(run), summarize(run)) for run in groups[method] if run_seed(run) in lines]
        above, above_best, mirror, own_x, own_y, outside = [], [], [], [], [], []
        for seed, row in paired:
            difference = _against_line(lines[seed], row, x, y)
            if math.isnan(difference):
                continue
            above.append((seed, difference))
            points = lines[seed].curve(x, y)
            above_best.append((seed, row[y] - best_at_most(points, row[x])))
            mirror.append((seed, row[x] - reach(points, row[y])))
            own_x.append((seed, row[x]))
            own_y.append((seed, row[y]))
            if not min(px for px, _ in points) <= row[x] <= max(px for px, _ in points):
                outside.append(seed)
        secondary = {
            key: PerSeed.of((seed, _against_line(lines[seed], row, x, key)) for seed, row in paired)
            for key in frontier.secondary
        }
        partial.append(
            dict(
                method=method,
                x=PerSeed.of(own_x),
                y=PerSeed.of(own_y),
                above=PerSeed.of(above),
                above_best=PerSeed.of(above_best),
                mirror=PerSeed.of(mirror),
                secondary=secondary,
                outside=outside,
            )
        )
    p_values = [t_test_p(fields["above"].values) for fields in partial]
    adjusted = holm(p_values)
    tested = sum(1 for p in adjusted if not math.isnan(p))
    readings = []
    for fields, p, holm_p in zip(partial, p_values, adjusted, strict=True):
        detectable = detectable_difference(fields["above"].values)
        reading = _reading(fields["above"], p, holm_p, detectable, tested, frontier)
        readings.append(MethodReading(**fields, p=p, holm_p=holm_p, detectable=detectable, reading=reading))
    return readings


def _reading(gain: PerSeed, p: float, holm_p: float, detectable: float, family: int, frontier: Frontier) -> str:
    """The words D's interval and Holm allow: above or below the frontier only where the adjusted p is below
    `ALPHA`; otherwise no difference detected, with the seeds, what the interval still allows (its two ends: a D
    that may be a gain or a loss, not "on the frontier") and the detectable difference, and whether the unadjusted
    interval excluded 0."""
    if gain.n == 0:
        return "not measured yet: no seed has a finished run of the method and of every constant β"
    if gain.n < 2:
        return "one seed: no test, no result"
    y_header, y_spec = metric_column(frontier.y)
    x_header, _ = metric_column(frontier.x)
    side = "above" if gain.mean > 0 else "below"
    more = "more" if gain.mean > 0 else "less"
    if holm_p < ALPHA:
        return (
            f"{side} the frontier: {more} {y_header} than constant β at the same {x_header} (Holm-adjusted "
            f"p = {format_p(holm_p)}, {gain.n} seeds)"
        )
    signed = "+" + y_spec.lstrip("+")
    low, high = gain.mean - gain.half_width, gain.mean + gain.half_width
    reading = (
        f"no difference detected with {gain.n} seeds: the interval allows D from {format(low, signed)} to "
        f"{format(high, signed)} (detectable at 80% power: ±{format(detectable, y_spec.lstrip('+'))})"
    )
    if p < ALPHA:
        reading += (
            f"; the unadjusted interval excludes 0 ({side}, p = {format_p(p)}), but not under Holm's adjustment "
            f"across the {family} methods (adjusted p = {format_p(holm_p)})"
        )
    return reading


def beta_of(variant: str) -> str:
    """The β a line variant is named with (`"beta=0.02, loss_type=grpo"` → `"0.02"`); the name itself without one."""
    for part in variant.split(", "):
        if part.startswith("beta="):
            return part[len("beta=") :]
    return variant


def line_section(runs: list[VariantRun], frontier: Frontier, plot: str | None = None) -> str:
    """Markdown for constant β's points: one row per line point (β, seeds, then x, y and those of `LINE_COLUMNS` some
    run measured, each the
    mean ± 95% half-width over that β's seeds), a sentence per β bounding the drift it keeps, and the plot (`plot`,
    a file name beside the summary) when given."""
    groups = seed_groups(runs)
    summaries = {variant: [summarize(run) for run in groups.get(variant, [])] for variant in frontier.line}
    measured = [row for rows in summaries.values() for row in rows]
    keys = list(dict.fromkeys((frontier.x, frontier.y, *LINE_COLUMNS)))
    keys = [key for key in keys if key in (frontier.x, frontier.y) or any(not math.isnan(r[key]) for r in measured)]
    columns = [metric_column(key) for key in keys]
    rows = [
        [beta_of(variant), str(len(summaries[variant]))]
        + [interval_cell([row[key] for row in summaries[variant]], spec) for key, (_, spec) in zip(keys, columns)]
        for variant in frontier.line
    ]
    start_note = []
    if frontier.start_steps:
        starts = [line.start for line in line_by_seed(runs, frontier, with_start=True).values()]
        rows.insert(
            0,
            ["start", str(len(starts))]
            + [interval_cell([start[key] for start in starts], spec) if key in START_VALUES else "—"
               for key, (_, spec) in zip(keys, columns)],
        )  # fmt: skip
        start_note = [
            f"The start's row is the point at drift 0 on every seed's line: the mean reward of the first "
            f"{frontier.start_steps} steps of that seed's constant-β runs, the step-0 evaluation's "
            + ("held-out reward" if "final_val_reward" in keys else "accuracies")
            + ", and no change in length or retention"
            + (" (added after the runs, as a correction: see below)." if frontier.start_added_after_runs else "."),
            "",
        ]
    x_header, x_spec = metric_column(frontier.x)
    lines = [
        "",
        "## Constant β's frontier",
        "",
        "Constant β's points, the line the methods are read against (each a mean over that β's seeds ± the 95% "
        "half-width): the table to choose a constant β from in this study's setting.",
        "",
        markdown_table(("β", "seeds", *(header for header, _ in columns)), rows),
        *start_note,
        f"What each β kept the {x_header} under, in this setting. Rule: X is the largest upper end of the 95% "
        f"intervals of the mean {x_header} of that β and of every larger β measured, so every constant β from Y up "
        "had a mean drift below X at 95% confidence each (a bound on the mean over seeds, not on a single run; "
        "smaller β than Y may or may not stay under X):",
        "",
        *_bound_sentences(frontier, summaries, x_header, x_spec),
    ]
    if plot:
        y_header = metric_column(frontier.y)[0]
        low, high = frontier.y_range
        y_cut = (
            f", and a bar of {y_header} cut where it leaves the values it can take, {low:g} to {high:g}"
            if math.isfinite(low) or math.isfinite(high)
            else ""
        )
        lines += [
            "",
            f"![Constant β's frontier and the methods]({plot})",
            "",
            f"{x_header} (log scale when every value is positive) against {y_header}: constant β's points (means "
            "over seeds ± the 95% half-width on both axes, a bar cut at the left edge of a log axis reaching 0 or "
            f"below{y_cut}) joined in order of drift, and each method's. The primary endpoint is read on each seed's "
            "own frontier, not on this line through means.",
        ]
    return "\n".join(lines) + "\n"


def _bound_sentences(frontier: Frontier, summaries: dict, x_header: str, x_spec: str) -> list[str]:
    """`line_section`'s bullets: for each β, "for a <x> under X here, β ≥ Y" (or why there is no bound yet)."""
    numeric = {}  # each β as a number, to order them by (a name without one last)
    for variant in frontier.line:
        try:
            numeric[variant] = float(beta_of(variant))
        except ValueError:
            numeric[variant] = math.inf
    ordered = sorted(frontier.line, key=numeric.get)
    upper = {}
    for variant in ordered:
        mean, half_width, _ = mean_interval([row[frontier.x] for row in summaries[variant]])
        upper[variant] = mean + half_width  # NaN below 2 seeds
    sentences = []
    for i, variant in enumerate(ordered):
        larger = ordered[i:]
        missing = [v for v in larger if math.isnan(upper[v])]
        if missing:
            names = ", ".join(f"β = {beta_of(v)}" for v in missing)
            sentences.append(f"- β ≥ {beta_of(variant)}: no bound yet ({names}: fewer than 2 seeds)")
            continue
        bound = max(upper[v] for v in larger)
        sentences.append(f"- for a {x_header} under {format(bound, x_spec)} here, β ≥ {beta_of(variant)}")
    return sentences


def methods_section(
    readings: list[MethodReading], frontier: Frontier, with_start: bool, correction: bool = False
) -> str:
    """Markdown for the primary endpoint: per method the seeds, its x and y, the line's y at its x (F_s(x), y − D
    seed by seed: what constant β earned at its drift), D by seed and its mean ± half-width, p, the Holm-adjusted p,
    the detectable D, D against the line's monotone envelope, the mirror, the seeds read outside the line and the
    reading. `with_start`: the readings put the start's point on the line; `correction`: they are
    the correction beside a stated endpoint that did not."""
    x_header, x_spec = metric_column(frontier.x)
    y_header, y_spec = metric_column(frontier.y)
    signed_x, signed_y = "+" + x_spec.lstrip("+"), "+" + y_spec.lstrip("+")
    tested = sum(1 for reading in readings if not math.isnan(reading.holm_p))
    lines = []  # F_s at each method's drift, on each seed of its reading: its y minus D
    for reading in readings:
        above = dict(reading.above.pairs)
        lines.append(PerSeed.of((seed, y - above[seed]) for seed, y in reading.y.pairs if seed in above))
    rows = [
        [
            reading.method,
            str(reading.above.n),
            format_interval(reading.x.mean, reading.x.half_width, x_spec),
            format_interval(reading.y.mean, reading.y.half_width, y_spec),
            format_interval(line.mean, line.half_width, y_spec),
            ", ".join(f"{format(value, signed_y)} ({seed})" for seed, value in reading.above.pairs) or "—",
            format_interval(reading.above.mean, reading.above.half_width, signed_y),
            format_p(reading.p),
            format_p(reading.holm_p),
            "n/a" if math.isnan(reading.detectable) else "±" + format(reading.detectable, y_spec.lstrip("+")),
            format_interval(reading.above_best.mean, reading.above_best.half_width, signed_y),
            format_interval(reading.mirror.mean, reading.mirror.half_width, signed_x),
            ", ".join(map(str, reading.outside)) or "none",
            reading.reading,
        ]
        for reading, line in zip(readings, lines, strict=True)
    ]
    header = (
        "method", "seeds", x_header, y_header, "the line at its drift", "D by seed (seed)", "D: above the frontier",
        "p", "Holm-adjusted p", "detectable at 80% power", "D against the monotone envelope",
        "mirror: drift beyond the frontier's", "seeds read outside the line", "reading",
    )  # fmt: skip
    through = (
        f"the start's point (drift 0, the mean {y_header.split(' (')[0]} of the first {frontier.start_steps} steps of "
        "seed s's constant-β runs) and seed s's constant-β points"
        if with_start
        else "seed s's constant-β points"
    )
    if correction:
        title = "Correction: D with the start's point on the line"
        opening = (
            "Added after the runs, as a correction to the stated endpoint above, which stands beside it: the same D "
            f"with F_s through {through}, so that a method that drifted less than every constant β is read against a "
            "line falling towards the start instead of one held flat at the least-drifting β's reward. Its own Holm "
            "adjustment across the methods."
        )
    else:
        title = "Methods against the frontier (primary endpoint)"
        opening = (
            f"Stated before the runs: for each method and seed s, D = {y_header} − F_s({x_header}), where F_s is "
            f"constant β's frontier on seed s: the piecewise-linear interpolation of {y_header} against {x_header} "
            f"through {through} in order of drift (points of equal drift: their mean), held flat beyond its first and "
            "last points."
        )
    return (
        f"\n## {title}\n\n{opening} A seed counts only where the method and every constant β have a finished run "
        "(`seeds`: how many did; the method's drift and reward are over those seeds; the line at its drift: F_s "
        f"there, the {y_header} constant β earned at that drift, the method's less D seed by seed). D is the mean ± "
        "the 95% half-width (t, n − 1 degrees of freedom) with the two-sided one-sample t-test's p, Holm-adjusted "
        f"across the methods with a test ({tested} so far; family-wise α = {ALPHA}): above or below the frontier "
        "only where the adjusted p is below it. Detectable: the smallest true D this many seeds would detect with "
        "80% power, (t_{0.975,n−1} + t_{0.80,n−1}) · s / √n. The mirror: the method's drift minus G_s(its reward), "
        "the least "
        "drift at which seed s's frontier reaches that reward (the first point's drift when the reward is at or "
        "below the curve there, the drift of the curve's highest point when it is above all of it): negative, less "
        "drift than constant β needed for the same reward. A sensitivity analysis beside D, with no test: D against "
        f"the line's monotone envelope E_s, the most {y_header} seed s's frontier reaches at the method's drift or "
        "less; never above D, so where D is above 0 only because the line dips, this is not. Seeds read outside the "
        "line: where the method's drift lies beyond the drifts its line measured, so that F_s there is the nearest "
        "point's reward held flat.\n\n" + markdown_table(header, rows)
    )


def secondary_section(readings: list[MethodReading], frontier: Frontier) -> str:
    """Markdown for the secondary metrics at matched drift: per method and metric, the difference from the line's
    interpolation at the method's drift by seed, its mean ± half-width, and what the unadjusted interval says; ""
    without secondary metrics."""
    if not frontier.secondary:
        return ""
    x_header, _ = metric_column(frontier.x)
    rows = []
    for reading in readings:
        for key in frontier.secondary:
            header, spec = metric_column(key)
            signed = "+" + spec.lstrip("+")
            found = reading.secondary[key]
            if found.n == 0:
                words = "not measured yet"
            elif found.n < 2:
                words = "one seed: no interval, no result"
            elif abs(found.mean) > found.half_width:
                words = f"the interval excludes 0: {'higher' if found.mean > 0 else 'lower'} than constant β's"
            else:
                words = f"the interval contains 0: no difference detected with {found.n} seeds"
            rows.append(
                [
                    reading.method,
                    header,
                    str(found.n),
                    ", ".join(f"{format(value, signed)} ({seed})" for seed, value in found.pairs) or "—",
                    format_interval(found.mean, found.half_width, signed),
                    words,
                ]
            )
    header = ("method", "metric", "seeds", "by seed (seed)", "minus constant β at the same drift", "reading")
    return (
        "\n## Secondary endpoints at matched drift\n\n"
        f"Each method's metric minus constant β's at the method's {x_header}, on the same seed (the same "
        f"interpolation as D's, of the metric against {x_header}), mean ± the 95% half-width. Not adjusted for "
        "multiplicity (no Holm): an interval that excludes 0 here describes, it does not establish a difference.\n\n"
        + markdown_table(header, rows)
    )


def write_frontier_report(
    runs: list[VariantRun],
    directory: str,
    title: str,
    notes: str,
    frontier: Frontier,
    endpoints: Iterable = (),
    plot: str = "frontier.png",
) -> dict:
    """`report.write_report` of the runs (with what each method did), then the frontier's picture (`plot`, beside the
    summary) and its sections at the end of the summary: what `adaptive-kl frontier` and the studies' runner write.
    Returns `write_report`'s paths and `"frontier_plot"` (None without matplotlib)."""
    paths = write_report(runs, directory, title, notes, list(endpoints), with_activity=True)
    drawn = write_frontiers_plot(
        [(runs, frontier, "Constant β's frontier and the methods")], os.path.join(directory, plot)
    )
    with open(paths["summary"], "a") as f:
        f.write(frontier_sections(runs, frontier, plot if drawn else None))
    return {**paths, "frontier_plot": drawn}


def frontier_sections(runs: list[VariantRun], frontier: Frontier, plot: str | None = None) -> str:
    """The summary's frontier sections: constant β's table (with `plot`, the picture's file name, when given), the
    methods against it (the primary endpoint; with `start_added_after_runs`, then the correction with the start's
    point), the secondaries at matched drift, and the seeds that learned the task (`learned`)."""
    start_stated = bool(frontier.start_steps) and not frontier.start_added_after_runs
    stated = read_methods(runs, frontier, with_start=start_stated)
    sections = line_section(runs, frontier, plot) + methods_section(stated, frontier, with_start=start_stated)
    if frontier.start_steps and frontier.start_added_after_runs:
        corrected = read_methods(runs, frontier, with_start=True)
        sections += methods_section(corrected, frontier, with_start=True, correction=True)
    return (
        sections
        + controller_section(runs, frontier)
        + drift_section(runs, frontier)
        + secondary_section(stated, frontier)
        + learned_section(runs, frontier)
    )


def held_and_acting_kl(run: VariantRun) -> tuple[float, float]:
    """`(mean training KL of the logged steps after which the controller held β, of the others)`: a step was held when
    `adaptive_kl/held_updates` (a running count) rose at it. NaN for a run that logged no such count, or no such
    step. With a log every step (as the demo logs), a logged step is an optimizer step."""
    held, acting, count_before = [], [], 0.0
    for entry in run.history:
        count, kl = entry.get("adaptive_kl/held_updates"), entry.get("adaptive_kl/raw_kl")
        if count is None or kl is None:
            continue
        (held if count > count_before else acting).append(kl)
        count_before = count
    return tuple(sum(values) / len(values) if values else math.nan for values in (held, acting))


def value_in_name(method: str, field: str) -> str | None:
    """The value a method's name gives `field` ("…, target_kl=0.147, …" → "0.147"), or None where it sets none."""
    return next((part.split("=", 1)[1] for part in method.split(", ") if part.startswith(f"{field}=")), None)


def controller_section(runs: list[VariantRun], frontier: Frontier) -> str:
    """Markdown for the target-KL controllers among the methods ("" without one): per method the last quarter's mean
    training KL (`adaptive_kl/raw_kl`) over its `target_kl` by seed and its mean ± 95% half-width, the largest β it
    logged, its last quarter's reward, that reward over its seed's line at its drift (with the start's point when the
    frontier states it) at its least over the seeds, the steps it held β (every group agreed), and the KL over the
    target on those steps and on the others (`held_and_acting_kl`)."""
    targets = {method: value_in_name(method, "target_kl") for method in methods(runs, frontier)}
    controllers = [method for method, target in targets.items() if target is not None]
    if not controllers:
        return ""
    lines = line_by_seed(runs, frontier, with_start=bool(frontier.start_steps))
    groups = seed_groups(runs)
    _, y_spec = metric_column(frontier.y)
    rows = []
    for method in controllers:
        target = float(targets[method])
        group = sorted(groups[method], key=run_seed)
        ratios = [(run_seed(run), late_mean(run, "adaptive_kl/raw_kl") / target) for run in group]
        largest = [max((h["adaptive_kl/current_beta"] for h in run.history if "adaptive_kl/current_beta" in h),
                       default=math.nan) for run in group]  # fmt: skip
        held = [next((h["adaptive_kl/held_updates"] for h in reversed(run.history) if "adaptive_kl/held_updates" in h),
                     math.nan) for run in group]  # fmt: skip
        held_kl, acting_kl = zip(*(held_and_acting_kl(run) for run in group))
        shares = []
        for run in group:
            row = summarize(run)
            points = lines[run_seed(run)].curve(frontier.x, frontier.y) if run_seed(run) in lines else None
            if points and math.isfinite(row[frontier.x]):
                shares.append(row[frontier.y] / interpolate(points, row[frontier.x]))
        mean, half_width, _ = mean_interval([ratio for _, ratio in ratios])
        rows.append(
            [
                method,
                str(len(group)),
                ", ".join(f"{ratio:.2f} ({seed})" for seed, ratio in ratios),
                format_interval(mean, half_width, ".2f"),
                interval_cell(largest, ".4g") + f" (largest {max(largest):.4g})" if largest else "—",
                interval_cell([summarize(run)[frontier.y] for run in group], y_spec),
                f"{min(shares):.2f}" if shares else "—",
                interval_cell(held, ".1f"),
                f"{interval_cell([kl / target for kl in held_kl], '.2f')}; "
                f"{interval_cell([kl / target for kl in acting_kl], '.2f')} "
                f"(paired: {interval_cell([(h - a) / target for h, a in zip(held_kl, acting_kl)], '+.2f')})",
            ]
        )
    header = (
        "controller", "seeds", "last-quarter KL / target by seed (seed)", "KL / target", "largest β",
        f"{metric_column(frontier.y)[0]}", "least reward / the line's at its drift", "steps held",
        "KL / target: steps held; the others (paired difference)",
    )  # fmt: skip
    return (
        "\n## What the target-KL controllers did\n\n"
        "Per controller: the last quarter's mean training KL (`adaptive_kl/raw_kl`) over its `target_kl` (1: on "
        "target), mean ± the 95% half-width over its seeds; the largest β it logged; its reward; the least over its "
        "seeds of its reward over the seed's line at its drift (below 0.5: it earned less than half what a constant "
        "β earned there); the steps after which it held β because every group's rewards agreed (n/a for "
        "runs made before the hold existed); and its mean training KL over the target on those steps and on the "
        "others, over all its steps, and their difference on the same seed: where the held steps' is the higher, the "
        "hold kept the controller from the steps that drifted most.\n\n" + markdown_table(header, rows)
    )


# A drift controller's run lands on its target when its final drift is within this fraction of it (issue 107's goal).
DRIFT_TOLERANCE = 0.2


def drift_section(runs: list[VariantRun], frontier: Frontier) -> str:
    """Markdown for the drift controllers among the methods ("" without one): each run's final drift (`frontier.x`)
    against its `target_drift`, and per controller the drift over the target (mean ± 95% half-width), the runs within
    ±`DRIFT_TOLERANCE` of it, and its seeds' spread of drift (standard deviation, and over the mean) beside that of the
    constant β whose mean drift is nearest, with the ratio of the two and its 95% interval; then each run's drift at
    every measurement and the β it trained with there."""
    targets = {method: value_in_name(method, "target_drift") for method in methods(runs, frontier)}
    controllers = [method for method, target in targets.items() if target is not None]
    if not controllers:
        return ""
    groups = seed_groups(runs)
    drifts = {name: [summarize(run)[frontier.x] for run in group] for name, group in groups.items()}
    line = [beta for beta in frontier.line if len(drifts.get(beta, [])) > 1]

    def within_of_mean(values: list[float]) -> str:
        # what a constant β does at its best: the target its own seeds' mean drift, known only after a sweep
        mean = statistics.fmean(values)
        return f"{sum(abs(value / mean - 1) <= DRIFT_TOLERANCE for value in values)} of {len(values)}"

    def spread(values: list[float]) -> str:
        if len(values) < 2:
            return "—"
        sd = statistics.stdev(values)
        return f"{sd:.4f} ({sd / statistics.fmean(values):.2f})"

    per_run, measured, rows = [], [], []
    for method in controllers:
        target = float(targets[method])
        group = sorted(groups[method], key=run_seed)
        ratios = []
        for run in group:
            drift = summarize(run)[frontier.x]
            betas = [h["adaptive_kl/current_beta"] for h in run.history if "adaptive_kl/current_beta" in h]
            ratios.append(drift / target)
            per_run.append([method, str(run_seed(run)), f"{target:g}", f"{drift:.4f}", f"{drift / target:.2f}",
                            "yes" if abs(drift / target - 1) <= DRIFT_TOLERANCE else "no",
                            f"{betas[-1]:.4g}" if betas else "—", f"{max(betas):.4g}" if betas else "—"])  # fmt: skip
            measurements = [h for h in run.history if "adaptive_kl/drift" in h]  # the log lines of its measurements
            at = [h["step"] for h in measurements]
            evenly = len(at) > 2 and len({b - a for a, b in zip(at, at[1:])}) == 1
            drift_cells = " ".join(f"{h['adaptive_kl/drift']:.2f}" for h in measurements)
            beta_cells = " ".join(f"{h.get('adaptive_kl/current_beta', math.nan):.2g}" for h in measurements)
            steps_cell = f"{at[0]}–{at[-1]}, every {at[1] - at[0]}" if evenly else ", ".join(map(str, at))
            measured.append([method, str(run_seed(run)), steps_cell, drift_cells, beta_cells])
        mean = statistics.fmean(drifts[method])
        nearest = min(line, key=lambda beta: abs(statistics.fmean(drifts[beta]) - mean), default=None)
        ratio_mean, ratio_half, _ = mean_interval(ratios)
        sd_ratio, sd_low, sd_high = sd_ratio_interval(drifts[method], drifts[nearest] if nearest else [])
        rows.append(
            [
                method,
                str(len(group)),
                interval_cell(drifts[method], ".4f"),
                format_interval(ratio_mean, ratio_half, ".2f"),
                f"{sum(abs(r - 1) <= DRIFT_TOLERANCE for r in ratios)} of {len(ratios)}",
                spread(drifts[method]),
                "—"
                if nearest is None
                else f"{nearest}: {interval_cell(drifts[nearest], '.4f')}, {spread(drifts[nearest])}",
                "—" if math.isnan(sd_ratio) else f"{sd_ratio:.2f} [{sd_low:.2f}, {sd_high:.2f}]",
                "—" if nearest is None else within_of_mean(drifts[nearest]),
            ]
        )
    header = ("controller", "seeds", f"{metric_column(frontier.x)[0]}", "drift / target",
              f"runs within ±{DRIFT_TOLERANCE:.0%}", "seeds' SD of drift (SD / mean)",
              "constant β nearest in mean drift: its drift, SD (SD / mean)", "SD over that β's SD [95%]",
              f"that β's seeds within ±{DRIFT_TOLERANCE:.0%} of its mean")  # fmt: skip
    run_header = ("controller", "seed", "target", "final drift", "drift / target", f"within ±{DRIFT_TOLERANCE:.0%}",
                  "final β", "largest β")  # fmt: skip
    return (
        "\n## Where the drift controllers landed\n\n"
        f"Per controller: its final drift (`{frontier.x}`) and that over its `target_drift` (1: on target), mean ± "
        f"the 95% half-width over its seeds; the runs whose drift is within ±{DRIFT_TOLERANCE:.0%} of the target; and "
        "the seeds' spread of drift, beside the spread of the constant β whose mean drift is nearest (the spread a "
        "constant β chosen for that drift leaves), and the ratio of the two standard deviations with its 95% interval "
        "(F with the two arms' seeds − 1 degrees of freedom, the seeds taken as independent samples; an interval "
        "containing 1: no difference in spread detected), and how many of that β's seeds ended within "
        f"±{DRIFT_TOLERANCE:.0%} of its own mean drift (a constant β at its best: a target set, after the sweep, to "
        "where its seeds land on average). Then every run.\n\n"
        + markdown_table(header, rows)
        + "\n"
        + markdown_table(run_header, per_run)
        + "\nWhat each run measured (`adaptive_kl/drift`, on its held-out texts) and the β it trained with at those "
        "steps (`adaptive_kl/current_beta`: set by the measurement before):\n\n"
        + markdown_table(("controller", "seed", "steps", "drift", "β"), measured)
    )


def learned_section(runs: list[VariantRun], frontier: Frontier) -> str:
    """Markdown for whether each run learned the task (`frontier.learned`; "" without it): per arm, each seed's
    last-quarter mean of the metric, how many seeds reached the threshold, and the exact 95% interval of that
    proportion (Clopper-Pearson)."""
    if frontier.learned is None:
        return ""
    metric, threshold = frontier.learned
    rows = []
    for variant, group in seed_groups(runs).items():
        values = sorted((run_seed(run), late_mean(run, metric)) for run in group)
        learned = sum(1 for _, value in values if value >= threshold)
        low, high = binomial_interval(learned, len(values))
        rows.append(
            [
                variant,
                ", ".join(f"{value:.3f} ({seed})" for seed, value in values),
                f"{learned} of {len(values)}",
                f"[{low:.2f}, {high:.2f}]",
            ]
        )
    header = ("variant", f"`{metric}`, last quarter, by seed (seed)", "seeds that learned", "95% interval (exact)")
    return (
        "\n## Seeds that learned\n\n"
        f"Stated before the runs: a run learned the task when the last quarter's mean of `{metric}` reaches "
        f"{threshold:g}. This reward's outcome can be all or nothing by seed, which a mean over seeds hides: per arm, "
        "each seed's value and the count of seeds that learned, with the exact (Clopper-Pearson) 95% interval of "
        "that proportion.\n\n" + markdown_table(header, rows)
    )


MARKERS = ("s", "^", "D", "v", "P", "X", "*", "<", ">", "h")
COLOURS = tuple(f"C{i}" for i in range(10) if i != 7)  # not C7, grey: constant β's line and bars are grey
LINE_LABEL = "constant β (seed means)"
START_LABEL = "the start (drift 0; on a log axis, drawn at its left edge)"


def bar(value: float, half_width: float, low: float = -math.inf, high: float = math.inf) -> list[list[float]]:
    """`[[below], [above]]`, one point's bar as matplotlib's `errorbar` takes it: the lengths of the bar
    `value ± half_width` drawn from `value`, stopped at `low` and `high`. A t-interval over few seeds can reach past
    what the metric can take (over 2 seeds it is 12.7 standard errors wide); the picture shows only values the metric
    can take. A `value` outside them means the range is wrong."""
    if not low <= value <= high:
        raise ValueError(f"{value!r} is outside the range its metric is stated to take, [{low:g}, {high:g}]")
    return [[value - max(value - half_width, low)], [min(value + half_width, high) - value]]


def write_frontiers_plot(panels: list[tuple[list[VariantRun], Frontier, str]], path: str) -> str | None:
    """Writes several frontiers side by side to `path`, one panel each `(runs, frontier, title)` (`draw_frontier`),
    each with its legend below it: `write_frontier_report`'s picture for each setting. Returns `path`, or None
    without matplotlib or without a point to draw in some panel."""
    try:
        import matplotlib
    except ImportError:
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # One method, one look, in every panel: its marker and colour follow its label in the first panel that has it.
    looks: dict[str, int] = {}
    for runs, frontier, _ in panels:
        _, _, look_of = legend_labels(methods(runs, frontier))
        for look in look_of.values():
            looks.setdefault(look, len(looks))
    fig, axes = plt.subplots(1, len(panels), figsize=(8 * len(panels), 5.5), squeeze=False)
    legends = [draw_frontier(ax, runs, frontier, title, looks) for ax, (runs, frontier, title) in zip(axes[0], panels)]
    if None in legends:
        plt.close(fig)
        return None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", bbox_extra_artists=legends)
    plt.close(fig)
    return path


def log_ticks(low: float, high: float, most: int = 7) -> list[float]:
    """Where to label a log axis from `low` to `high` (both positive): the numbers 1, 2 and 5 times a power of 10
    inside it (every whole multiple of one, 1 to 9, where fewer than two of those are), kept in order only when at
    least 1/`most` of the axis' width in log units from the last kept, so that at most `most` + 1 labels share it
    and plain decimals ("0.003", "0.004") have room."""
    span = math.log10(high / low)

    def inside(multiples: Iterable[int]) -> list[float]:
        decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
        found = (float(f"{m}e{k}") for k in decades for m in multiples)
        return [tick for tick in found if low <= tick <= high]

    ticks = inside((1, 2, 5))
    if len(ticks) < 2:
        ticks = inside(range(1, 10))
    kept: list[float] = []
    for tick in ticks:
        if not kept or math.log10(tick / kept[-1]) >= span / most:
            kept.append(tick)
    return kept


def legend_labels(names: list[str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """`(shared, labels, look_of)` of methods' names: the settings every one of them has (the legend's title says
    those); each name's label, what it adds to them (the whole name when nothing is shared or nothing is added); and
    each name's look, what decides its marker and colour: its label less `target_kl`, which each study fixes by its
    own rule, so that one controller looks the same on every frontier drawn beside another."""
    split = {name: name.split(", ") for name in names}
    shared = []
    if len(names) > 1:
        shared = [part for part in split[names[0]] if all(part in parts for parts in split.values())]
    labels = {name: ", ".join(part for part in parts if part not in shared) or name for name, parts in split.items()}
    look_of = {
        name: ", ".join(part for part in label.split(", ") if not part.startswith("target_kl="))
        for name, label in labels.items()
    }
    return shared, labels, look_of


def draw_frontier(ax, runs: list[VariantRun], frontier: Frontier, title: str, looks: dict[str, int] | None = None):
    """Draws the frontier on the matplotlib axes `ax`: x against y, constant β as a line through its points' seed
    means (each with 95% bars on both axes and labelled with its β), each method a marker of its own with its bars
    (where `looks` is given, the `looks[look]`-th marker and colour, its look as `legend_labels` gives it, so that
    panels drawn side by side agree; else in order), and a legend below. x is on a log scale when every drawn value
    is positive (the drifts span decades); a bar reaching 0 or below stops at the axis' left edge, and a y bar at the
    ends of `frontier.y_range`; a log axis is labelled in plain decimals at `log_ticks`, its minor ticks unlabelled.
    Returns the legend, or None without a point to draw."""
    groups = seed_groups(runs)
    # Each variant's `((x, half-width), (y, half-width))` over its runs (half-width 0 for one run), where both are
    # finite: constant β's points, labelled with their β, and the methods' marks.
    points = {}
    for name in [*frontier.line, *methods(runs, frontier)]:
        if not groups.get(name):
            continue
        point = []
        for key in (frontier.x, frontier.y):
            mean, half_width, _ = mean_interval([summarize(run)[key] for run in groups[name]])
            point.append((mean, 0.0 if math.isnan(half_width) else half_width))
        if math.isfinite(point[0][0]) and math.isfinite(point[1][0]):
            points[name] = point
    line = [(beta_of(variant), *points[variant]) for variant in frontier.line if variant in points]
    marks = [(name, *points[name]) for name in methods(runs, frontier) if name in points]
    if not line and not marks:
        return None
    # The legend names each method by what it adds to the settings all methods share (its title says those).
    shared, labels, look_of = legend_labels(methods(runs, frontier))
    x_header, _ = metric_column(frontier.x)
    y_header, _ = metric_column(frontier.y)
    means = [x for _, (x, _), _ in line + marks]
    logarithmic = min(means) > 0
    # A log axis cannot show 0: bars that reach it stop at the left edge, a third of the least mean.
    left = min(means) / 3 if logarithmic else -math.inf
    starts = [seed_line.start for seed_line in line_by_seed(runs, frontier, with_start=True).values()]
    start_y = mean_interval([start[frontier.y] for start in starts if start]) if frontier.start_steps else None
    if line:
        ordered = sorted(line, key=lambda point: point[1][0])
        ax.plot([x for _, (x, _), _ in ordered], [y for _, _, (y, _) in ordered], "-", color="0.45", zorder=1)
        if start_y is not None and start_y[2]:  # the start's point: drift 0, at the axis' left edge on a log axis
            start_x = left if logarithmic else 0.0
            mean, half_width = start_y[0], 0.0 if math.isnan(start_y[1]) else start_y[1]
            ax.plot([start_x, ordered[0][1][0]], [mean, ordered[0][2][0]], "--", color="0.45", zorder=1)
            ax.errorbar(start_x, mean, yerr=bar(mean, half_width, *frontier.y_range), fmt="o", mfc="white",
                        color="black", ecolor="0.4", elinewidth=1, capsize=3, markersize=6, zorder=3,
                        label=START_LABEL)  # fmt: skip
        for i, (beta, (x, x_half), (y, y_half)) in enumerate(line):
            ax.errorbar(x, y, xerr=bar(x, x_half, low=left), yerr=bar(y, y_half, *frontier.y_range), fmt="o",
                        color="black", ecolor="0.4", elinewidth=1, capsize=3, markersize=6, zorder=3,
                        label=LINE_LABEL if i == 0 else None)  # fmt: skip
            ax.annotate(f"β = {beta}", (x, y), textcoords="offset points", xytext=(6, -13), fontsize=8, color="0.1",
                        bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.8),
                        zorder=5)  # fmt: skip
    for i, (name, (x, x_half), (y, y_half)) in enumerate(marks):
        look = i if looks is None else looks[look_of[name]]
        ax.errorbar(x, y, xerr=bar(x, x_half, low=left), yerr=bar(y, y_half, *frontier.y_range),
                    fmt=MARKERS[look % len(MARKERS)], color=COLOURS[look % len(COLOURS)], elinewidth=1, capsize=3,
                    markersize=8, alpha=0.9, zorder=4, label=labels[name])  # fmt: skip
    if logarithmic:
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

        ax.set_xscale("log")
        ax.set_xlim(left=left / 1.25)  # the start's marker, drawn at `left`, whole
        # Plain decimals, spaced apart, and no labels on the minor ticks: matplotlib's own labels the minor ticks of
        # an axis spanning about two decades or less, in scientific notation, and at small drift those run into each
        # other ("3×10⁻³4×10⁻³"). The minor ticks stay, for the grid.
        ax.xaxis.set_major_locator(FixedLocator(log_ticks(*ax.get_xlim())))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"{x_header}{' (log scale)' if logarithmic else ''}")
    ax.set_ylabel(y_header)
    ax.set_title(f"{title} (means over seeds ± 95% half-widths)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.grid(alpha=0.1, which="minor")
    handles, labels = ax.get_legend_handles_labels()
    # Constant β and the start last, below the methods the legend's title introduces.
    last = [i for i, label in enumerate(labels) if label in (LINE_LABEL, START_LABEL)]
    order = [i for i in range(len(labels)) if i not in last] + last
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    return ax.legend(
        handles,
        [textwrap.fill(label, 95, subsequent_indent="  ") for label in labels],
        title=f"methods (each {', '.join(shared)}, with):" if shared else None,
        title_fontsize=8,
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12),
        frameon=False,
    )
