"""Reports of a comparison: a markdown summary table, per-step metrics as CSV, and PNG plots (one line per variant).

With several seeds per variant (`compare --seed 0,1,2`), the table gives each variant's mean over seeds with its 95%
interval and a `seeds` column, followed by the paired differences from the first variant; the plots draw seed means
with a shaded 95% band. The CSV keeps every run.
"""

from __future__ import annotations

import csv
import math
import os
import textwrap
from dataclasses import dataclass

from ..kl.metrics import METRIC_NAMES
from .runner import VariantRun
from .seeds import (
    detectable_difference,
    format_interval,
    format_p,
    holm,
    mean_interval,
    paired_differences,
    run_seed,
    seed_groups,
    t_test_p,
)


# Leading CSV columns, in this order; any other metric a run logged follows them, sorted by name.
CSV_COLUMNS = (
    "variant",
    "step",
    "reward",
    "reward_std",
    "rewards/format_reward/mean",
    "rewards/accuracy_reward/mean",
    "completions/mean_length",
    "kl",
    *METRIC_NAMES,
    "loss",
    "val_accuracy",
    "val_answer_accuracy",
    "val_format",
    "val_completion_length",
)
SUMMARY_HEADER = (
    "variant",
    "val. accuracy (final)",
    "Δ from step 0",
    "Δ from best",
    "mean raw KL",
    "mean adapted KL",
    "final β",
    "mean completion length",
    "wall time (s)",
    "reward (last quarter)",
    "retention loglik (final)",
    "Δ retention",
    "KL-band warnings",
    "held-out KL to start (final)",
    "Δ length (last − first quarter)",
    "KL–length corr. (last quarter)",
)
# Columns after `SUMMARY_HEADER`, shown only when some run of the table has them (TRL's truncation rate, which says
# whether a lengthening stopped at `max_completion_length`; the chat task's general-prompt retention, `tasks.general`):
# (summary key, header, number format).
OPTIONAL_SUMMARY_COLUMNS = (
    ("late_truncated", "truncated (last quarter)", ".2f"),
    # The validation accuracy counts an answer only after the task's marker, which a chat model does not write at
    # first; the right final number anywhere in the answer (`tasks.answers.final_number`) is the yardstick beside it.
    ("start_answer_accuracy", "format-free accuracy (step 0)", ".3f"),
    ("final_answer_accuracy", "format-free accuracy (final)", ".3f"),
    # The fraction of greedy validation answers with the task's marker: the format alone, right answer or not.
    ("final_format", "greedy format rate (final)", ".3f"),
    ("delta_general_loglik", "Δ general-chat loglik", "+.4f"),
    ("final_general_kl_to_start", "general-chat KL to start (final)", ".4f"),
    # The task `dataset` (`--dataset`): the greedy answers' total reward on its held-out prompts.
    ("final_val_reward", "held-out reward (final)", ".3f"),
)
OPTIONAL_SUMMARY_KEYS = frozenset(key for key, _, _ in OPTIONAL_SUMMARY_COLUMNS)
# The columns `adaptive-kl demo` and `compare` print at the end, in this order: those a reader compares across the
# variants (validation accuracy, reward, KL, β, completion length, drift from the start, wall time). summary.md keeps
# them all.
TERMINAL_COLUMNS = (
    "final_accuracy",
    "late_reward",
    "mean_raw_kl",
    "final_beta",
    "mean_completion_length",
    "final_kl_to_start",
    "wall_time",
)
# The diversity table, written when a run logged `diversity/*` (`diversity_metrics=True`): means over the last quarter.
DIVERSITY_COLUMNS = (
    ("unique fraction", "diversity/unique_fraction"),
    ("distinct-1", "diversity/distinct_1"),
    ("distinct-2", "diversity/distinct_2"),
    ("embedding similarity", "diversity/embedding_similarity"),
    ("token entropy", "diversity/entropy"),
)


def finite_mean(values) -> float:
    """The mean of the finite `values` (None and NaN left out); NaN without any."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan


def late_mean(run: VariantRun, metric: str) -> float:
    """Mean of a logged metric over the last quarter of the run's steps (at least one step)."""
    values = [h[metric] for h in run.history if metric in h]
    return finite_mean(values[-max(1, len(values) // 4) :])


def summarize(run: VariantRun) -> dict[str, float]:
    """The summary row of one run: final validation accuracy, its change from step 0 and from the best evaluation
    (≤ 0: how much was lost since the best point), mean raw/adapted KL and completion length over steps, final β,
    the reward of the last quarter of steps, the final retention log-likelihood and its change from step 0, and how
    many times the KL left its band; then the final exact KL to the starting policy on the held-out solutions (logged
    whatever β, NaN without held-out solutions), the completion-length drift, and the late correlation between a
    completion's KL and its length (`adaptive_kl/kl_length_corr`, logged only with β > 0); last, the fraction of
    completions cut at `max_completion_length` over the last quarter of steps (TRL's `completions/clipped_ratio`), the
    change of the general-prompt log-likelihood from step 0 and the final general-prompt KL to the start
    (`tasks.general`), the format-free accuracy (the right final number, marker or not) at step 0 and at the end, and
    the final greedy format rate, and the final held-out reward (the task `dataset`); NaN for what a run did not
    log."""
    accuracies = [e["val_accuracy"] for e in run.evaluations if "val_accuracy" in e]
    answer_accuracies = [e["val_answer_accuracy"] for e in run.evaluations if "val_answer_accuracy" in e]
    formats = [e["val_format"] for e in run.evaluations if "val_format" in e]
    held_out_rewards = [e["val_reward"] for e in run.evaluations if "val_reward" in e]
    betas = [h["adaptive_kl/current_beta"] for h in run.history if "adaptive_kl/current_beta" in h]
    retention = [e["retention/loglik"] for e in run.retention if "retention/loglik" in e]
    drift = [e["retention/kl_to_start"] for e in run.retention if "retention/kl_to_start" in e]
    general = [e["general/loglik"] for e in run.retention if "general/loglik" in e]
    general_drift = [e["general/kl_to_start"] for e in run.retention if "general/kl_to_start" in e]
    lengths = [h["completions/mean_length"] for h in run.history if "completions/mean_length" in h]
    quarter = max(1, len(lengths) // 4)
    final = accuracies[-1] if accuracies else math.nan
    return {
        "final_accuracy": final,
        "delta_from_start": final - accuracies[0] if accuracies else math.nan,
        "delta_from_best": final - max(accuracies) if accuracies else math.nan,
        "mean_raw_kl": finite_mean(h.get("adaptive_kl/raw_kl") for h in run.history),
        "mean_adapted_kl": finite_mean(h.get("adaptive_kl/adapted_kl") for h in run.history),
        "final_beta": betas[-1] if betas else run.config.get("beta", math.nan),  # β = 0 logs no adaptive_kl/*
        "mean_completion_length": finite_mean(h.get("completions/mean_length") for h in run.history),
        "wall_time": run.wall_time,
        "late_reward": late_mean(run, "reward"),
        "final_retention": retention[-1] if retention else math.nan,
        "delta_retention": retention[-1] - retention[0] if retention else math.nan,
        "kl_warnings": float(len(run.kl_warnings)),
        "final_kl_to_start": drift[-1] if drift else math.nan,
        # How far the policy lengthened (> 0) or shortened its completions: the last quarter's mean length minus the
        # first quarter's (the same number of steps).
        "length_drift": finite_mean(lengths[-quarter:]) - finite_mean(lengths[:quarter]) if lengths else math.nan,
        "kl_length_corr": late_mean(run, "adaptive_kl/kl_length_corr"),
        "late_truncated": late_mean(run, "completions/clipped_ratio"),
        "delta_general_loglik": general[-1] - general[0] if general else math.nan,
        "final_general_kl_to_start": general_drift[-1] if general_drift else math.nan,
        "start_answer_accuracy": answer_accuracies[0] if answer_accuracies else math.nan,
        "final_answer_accuracy": answer_accuracies[-1] if answer_accuracies else math.nan,
        "final_format": formats[-1] if formats else math.nan,
        "final_val_reward": held_out_rewards[-1] if held_out_rewards else math.nan,
    }


# The number format of each summary value (after the variant's name), in `summarize`'s order.
SUMMARY_FORMATS = (
    ".3f", "+.3f", "+.3f", ".4f", ".4f", ".4g", ".1f", ".0f", ".3f", ".4f", "+.4f", ".0f", ".4f", "+.2f", "+.3f"
)  # fmt: skip


# Every `(summary key, header, number format)` of the table: `SUMMARY_HEADER`'s columns, in `summarize`'s order (that
# of any run's row, an empty one's here), then all `OPTIONAL_SUMMARY_COLUMNS`.
SUMMARY_COLUMNS = (
    *zip(
        [key for key in summarize(VariantRun("", {}, [], [], 0.0)) if key not in OPTIONAL_SUMMARY_KEYS],
        SUMMARY_HEADER[1:],
        SUMMARY_FORMATS,
        strict=True,
    ),
    *OPTIONAL_SUMMARY_COLUMNS,
)


def metric_column(metric: str) -> tuple[str, str]:
    """`(header, number format)` of a `summarize` key as the summary table writes it (e.g. `late_reward` →
    `("reward (last quarter)", ".3f")`)."""
    return next((header, spec) for key, header, spec in SUMMARY_COLUMNS if key == metric)


def markdown_table(header, rows) -> str:
    """A markdown table: the `header` cells, the rule, then one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def _summary_columns(summaries: list[dict], only: tuple[str, ...] | None = None) -> tuple[list, list, list]:
    """`(keys, headers, formats)` of the table: `SUMMARY_HEADER`'s columns, then each optional column that some
    run has a value for; or, given `only` (summary keys), those columns alone, in its order."""
    columns = [
        (key, header, spec)
        for key, header, spec in SUMMARY_COLUMNS
        if key not in OPTIONAL_SUMMARY_KEYS or any(not math.isnan(summary[key]) for summary in summaries)
    ]
    if only is not None:
        by_key = {key: (key, header, spec) for key, header, spec in columns}
        columns = [by_key[key] for key in only]
    return [k for k, _, _ in columns], [h for _, h, _ in columns], [f for _, _, f in columns]


def summary_table(runs: list[VariantRun], columns: tuple[str, ...] | None = None) -> str:
    """A markdown table with one row per variant (columns: `SUMMARY_HEADER`, then any `OPTIONAL_SUMMARY_COLUMNS`
    some run has; or the summary keys `columns`, in their order). With several seeds per variant, the cells are
    `mean ± half-width` over seeds, a `seeds` column follows the name, and a second table gives each variant's paired
    difference from the first variant (on the seeds both ran)."""
    groups = seed_groups(runs)
    summaries = {id(run): summarize(run) for run in runs}
    keys, headers, formats = _summary_columns(list(summaries.values()), columns)
    if all(len(group) == 1 for group in groups.values()):
        rows = [
            [run.name]
            + [
                "n/a" if math.isnan(summaries[id(run)][key]) else format(summaries[id(run)][key], spec)
                for key, spec in zip(keys, formats, strict=True)
            ]
            for run in runs
        ]
        return markdown_table((SUMMARY_HEADER[0], *headers), rows)
    header = (SUMMARY_HEADER[0], "seeds", *headers)
    rows, differences = [], []
    (first_name, first), *others = groups.items()
    for name, group in groups.items():
        cells = [
            interval_cell([summaries[id(run)][key] for run in group], spec)
            for key, spec in zip(keys, formats, strict=True)
        ]
        rows.append([name, str(len(group)), *cells])
    for name, group in others:
        deltas = {key: paired_differences(group, first, lambda run, key=key: summaries[id(run)][key]) for key in keys}
        cells = [interval_cell(deltas[key], "+" + spec.lstrip("+")) for key, spec in zip(keys, formats, strict=True)]
        differences.append([name, str(len(deltas[keys[0]])), *cells])
    paired = (
        f"\nPaired differences from {first_name} (the mean over the seeds both ran of variant − {first_name}, "
        "± the 95% half-width):\n\n" + markdown_table(header, differences)
        if differences
        else ""
    )
    intro = "Means over seeds ± the half-width of the 95% t-interval over seeds.\n\n"
    return intro + markdown_table(header, rows) + paired


def interval_cell(values: list[float], spec: str) -> str:
    """`mean ± half-width` of the finite `values`, followed by `(n=k)` when only k of them are finite (a metric some
    runs did not measure, e.g. one added after they ran): the row's `seeds` column is then not this cell's n."""
    mean, half_width, count = mean_interval(values)
    cell = format_interval(mean, half_width, spec)
    return cell if count in (0, len(values)) else f"{cell} (n={count})"


@dataclass(frozen=True)
class PairedEndpoint:
    """A comparison stated before its runs: `variant − against` of one summary metric (a key of `summarize`),
    paired on the seeds both variants ran. Variants are named as `compare --variant` names them (`"a=1, b=2"`)."""

    variant: str
    against: str
    metric: str


@dataclass(frozen=True)
class EndpointReading:
    """What a `PairedEndpoint` measured: the metric's header and number format, `(seed, variant − against)` per seed
    both ran, their mean ± the 95% t half-width over `n` seeds, the reading the interval allows, and the two-sided
    paired t-test's p-value (NaN below 2 seeds)."""

    header: str
    spec: str
    pairs: list[tuple[int, float]]
    mean: float
    half_width: float
    n: int
    reading: str
    p: float = math.nan


def read_endpoint(runs: list[VariantRun], endpoint: PairedEndpoint) -> EndpointReading:
    """The paired differences of `endpoint` on the seeds both its variants ran, and the reading their interval allows:
    a difference only where it excludes 0, else "no difference detected" with the number of seeds."""
    header, spec = metric_column(endpoint.metric)
    groups = seed_groups(runs)
    variant, against = groups.get(endpoint.variant, []), groups.get(endpoint.against, [])
    by_seed = {run_seed(run): summarize(run)[endpoint.metric] for run in against}
    pairs = sorted(
        (run_seed(run), summarize(run)[endpoint.metric] - by_seed[run_seed(run)])
        for run in variant
        if run_seed(run) in by_seed
    )
    mean, half_width, n = mean_interval([difference for _, difference in pairs])
    if n == 0:
        reading = "not measured yet: no seed has a finished run of both"
    elif n < 2:
        reading = "one seed: no interval, no result"
    elif abs(mean) > half_width:
        higher = endpoint.variant if mean > 0 else endpoint.against
        reading = f"the interval excludes 0: {header} is higher with {higher} ({n} seeds)"
    else:
        detectable = format(detectable_difference([difference for _, difference in pairs]), spec.lstrip("+"))
        reading = (
            f"the interval contains 0: no difference detected with {n} seeds (the design detects ±{detectable} "
            "at 80% power)"
        )
    p = t_test_p([difference for _, difference in pairs])
    return EndpointReading(header, spec, pairs, mean, half_width, n, reading, p)


def endpoint_section(runs: list[VariantRun], endpoint: PairedEndpoint) -> str:
    """Markdown for a stated endpoint: the seeds both variants ran, the paired difference on each, their mean ± the
    95% t half-width (n − 1 degrees of freedom), and the reading the interval allows (`read_endpoint`)."""
    result = read_endpoint(runs, endpoint)
    signed = "+" + result.spec.lstrip("+")
    lines = [
        "",
        "## Primary endpoint",
        "",
        f"Stated before the runs: the paired {result.header} of {endpoint.variant} minus {endpoint.against}, on the "
        "seeds both ran (mean ± the 95% half-width, t with n − 1 degrees of freedom).",
        "",
    ]
    if not result.pairs:
        return "\n".join(lines + ["Not measured yet: no seed has a finished run of both.", ""])
    by_seed_cells = ", ".join(f"{format(difference, signed)} (seed {seed})" for seed, difference in result.pairs)
    dof = f"{result.n - 1} degree{'s' if result.n != 2 else ''} of freedom"
    lines += [
        f"- seeds both ran: {result.n} ({dof})",
        f"- by seed: {by_seed_cells}",
        f"- paired difference: {format_interval(result.mean, result.half_width, signed)}",
        f"- p (two-sided paired t-test): {format_p(result.p)}",
        f"- reading: {result.reading}",
        "",
    ]
    return "\n".join(lines)


def endpoints_section(runs: list[VariantRun], endpoints: list[PairedEndpoint]) -> str:
    """Markdown for the stated endpoints: `endpoint_section` for one; for several, one table row each (variant minus
    what it is compared with, the metric, the seeds both ran, the difference on each seed, their mean ± the 95% t
    half-width with n − 1 degrees of freedom, the two-sided paired t-test's p, that p Holm-adjusted across the
    endpoints with a test, and the reading: a difference is claimed only where the adjusted p is below 0.05)."""
    if len(endpoints) == 1:
        return endpoint_section(runs, endpoints[0])
    results = [read_endpoint(runs, endpoint) for endpoint in endpoints]
    adjusted = holm([result.p for result in results])
    tested = sum(1 for p in adjusted if not math.isnan(p))
    rows = []
    for endpoint, result, holm_p in zip(endpoints, results, adjusted, strict=True):
        signed = "+" + result.spec.lstrip("+")
        rows.append(
            [
                f"{endpoint.variant} − {endpoint.against}",
                result.header,
                str(result.n),
                ", ".join(f"{format(difference, signed)} ({seed})" for seed, difference in result.pairs) or "—",
                format_interval(result.mean, result.half_width, signed),
                format_p(result.p),
                format_p(holm_p),
                holm_reading(endpoint, result, holm_p, tested),
            ]
        )
    header = (
        "comparison", "metric", "seeds", "by seed (seed)", "paired difference", "p", "Holm-adjusted p", "reading"
    )  # fmt: skip
    return (
        "\n## Primary endpoints\n\nStated before the runs: each comparison's paired difference on the seeds both "
        "ran (mean ± the 95% half-width, t with n − 1 degrees of freedom), the two-sided paired t-test's p, and that "
        f"p Holm-adjusted across the {tested} endpoints with a test (family-wise α = 0.05): several endpoints give "
        "several chances of a false difference, so a difference is claimed only where the adjusted p is below "
        "0.05.\n\n" + markdown_table(header, rows)
    )


def holm_reading(endpoint: PairedEndpoint, result: EndpointReading, holm_p: float, family: int) -> str:
    """The reading of one of `family` endpoints after Holm's adjustment (`holm_p`): a difference where the adjusted p
    is below 0.05; where only the unadjusted interval excludes 0, that it does not hold under Holm; otherwise
    `read_endpoint`'s reading (no seed, one seed, or an interval that contains 0)."""
    if result.n < 2 or math.isnan(holm_p):
        return result.reading
    higher = endpoint.variant if result.mean > 0 else endpoint.against
    if holm_p < 0.05:
        return (
            f"the interval excludes 0 and the difference holds under Holm: {result.header} is higher with {higher} "
            f"({result.n} seeds)"
        )
    if abs(result.mean) > result.half_width:
        return (
            f"the interval excludes 0 (unadjusted: {result.header} higher with {higher}), but the difference does "
            f"not hold under Holm across the {family} endpoints: none claimed with {result.n} seeds"
        )
    return result.reading


# What each method does to the term, per run (docs/design.md §3, §5): the fraction of tokens `clip` cut, how much of
# the raw KL the transform kept (for `sigmoid`, the KL-weighted mean of its gate σ(k − τ)), β's decays and, for a
# target-KL controller, its rises and the largest β it reached.
ACTIVITY_HEADER = (
    "variant",
    "seeds",
    "clip fraction (mean over steps)",
    "adapted / raw KL (mean over steps)",
    "final β",
    "steps that lowered β",
    "first step at a lower β",
    "steps that raised β",
    "largest β",
)


def activity(run: VariantRun) -> dict[str, float]:
    """One run's method activity (NaN for what it did not log): the mean `adaptive_kl/clip_fraction`, the ratio of
    the mean adapted to the mean raw KL over the steps, the final β, how many logged steps have a β below the step
    before, the first step whose β is below the first step's (NaN when β never fell), how many logged steps have a β
    above the step before, and the largest logged β."""
    betas = [h["adaptive_kl/current_beta"] for h in run.history if "adaptive_kl/current_beta" in h]
    steps = [h["step"] for h in run.history if "adaptive_kl/current_beta" in h]
    raw = finite_mean(h.get("adaptive_kl/raw_kl") for h in run.history)
    changes = list(zip(betas, betas[1:]))  # (β before, β after) of each logged step after the first
    first_lower = next((step for step, beta in zip(steps, betas) if beta < betas[0]), math.nan) if betas else math.nan
    return {
        "clip_fraction": finite_mean(h.get("adaptive_kl/clip_fraction") for h in run.history),
        "kept": finite_mean(h.get("adaptive_kl/adapted_kl") for h in run.history) / raw if raw > 0 else math.nan,
        "final_beta": betas[-1] if betas else run.config.get("beta", math.nan),
        "lowered": float(sum(after < before for before, after in changes)) if betas else math.nan,
        "first_lower": float(first_lower),
        "raised": float(sum(after > before for before, after in changes)) if betas else math.nan,
        "largest_beta": max(betas) if betas else run.config.get("beta", math.nan),
    }


ACTIVITY_FORMATS = (".4f", ".3f", ".4g", ".1f", ".1f", ".1f", ".4g")


def activity_section(runs: list[VariantRun]) -> str:
    """Markdown table of `activity` per variant (mean ± 95% half-width over seeds; a cell measured on fewer seeds says
    its n), so that a null result can be told from an idle method; "" when no run logged the adaptive-KL metrics."""
    if not any("adaptive_kl/current_beta" in h for run in runs for h in run.history):
        return ""
    rows = []
    for name, group in seed_groups(runs).items():
        values = [activity(run) for run in group]
        cells = [
            interval_cell([value[key] for value in values], spec)
            for key, spec in zip(values[0], ACTIVITY_FORMATS, strict=True)
        ]
        rows.append([name, str(len(group)), *cells])
    return (
        "\n## What each method did\n\nPer run, then mean ± the 95% half-width over seeds: the fraction of tokens "
        "whose KL `clip` cut, the mean adapted KL over the mean raw KL (for `sigmoid`, the KL-weighted mean of its "
        "gate σ(k − τ); 1 without a transform), β at the end, the steps whose β is below the step before's "
        "(`dynamic`'s decays), the first step trained at a lower β than the first (a cell with `(n=k)` averages "
        "the k seeds where it happened), the steps whose β is above the step before's (a target-KL controller's "
        "raises) and the largest β logged.\n\n" + markdown_table(ACTIVITY_HEADER, rows)
    )


def diversity_table(runs: list[VariantRun]) -> str:
    """A markdown table of the `diversity/*` metrics (last-quarter means), or "" when no run logged them."""
    if not any(key in h for run in runs for h in run.history for _, key in DIVERSITY_COLUMNS[:-1]):
        return ""
    header = ["variant", *(name for name, _ in DIVERSITY_COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        values = [late_mean(run, key) for _, key in DIVERSITY_COLUMNS]
        lines.append("| " + " | ".join([run.name] + ["n/a" if math.isnan(v) else f"{v:.3f}" for v in values]) + " |")
    return "\n".join(lines) + "\n"


def step_rows(runs: list[VariantRun]) -> list[dict]:
    """One row per (variant, step), with the validation scores on the steps where they were evaluated."""
    rows = []
    for run in runs:
        evaluations = {e["step"]: e for e in run.evaluations}
        steps = {h["step"]: h for h in run.history}
        for step in sorted(set(steps) | set(evaluations)):
            row = {"variant": run.name, "step": step}
            row.update({k: v for k, v in steps.get(step, {}).items() if isinstance(v, (int, float)) and k != "step"})
            row.update({k: v for k, v in evaluations.get(step, {}).items() if k != "step"})
            rows.append(row)
    return rows


def write_csv(runs: list[VariantRun], path: str) -> None:
    rows = step_rows(runs)
    extra = sorted({k for row in rows for k in row} - set(CSV_COLUMNS))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*CSV_COLUMNS, *extra], restval="")
        writer.writeheader()
        writer.writerows(rows)


# Panels of the plot: title → (metric, y label); raw vs adapted KL share a panel (solid raw, dashed adapted).
PANELS = (
    ("reward", "reward", "mean task reward (format + accuracy)"),
    ("validation_accuracy", "val_accuracy", "greedy validation accuracy"),
    ("kl", "adaptive_kl/raw_kl", "per-token KL: raw (solid) vs adapted (dashed)"),
    ("beta", "adaptive_kl/current_beta", "β"),
    ("completion_length", "completions/mean_length", "mean completion length (tokens)"),
    ("retention", "retention/loglik", "retention: log-likelihood of held-out solutions"),
    ("drift", "retention/kl_to_start", "exact KL to the starting policy (held-out solutions)"),
    ("general_retention", "general/loglik", "log-likelihood of the start's answers to general chat prompts"),
    ("general_drift", "general/kl_to_start", "exact KL to the starting policy (general chat prompts)"),
    ("diversity", "diversity/unique_fraction", "unique completions per group"),
)


# Panels evaluated every eval_every steps → the run's attribute holding them.
EVALUATED_PANELS = {
    "validation_accuracy": "evaluations",
    **dict.fromkeys(("retention", "drift", "general_retention", "general_drift"), "retention"),
}


def _series(run: VariantRun, panel: str, metric: str) -> dict[int, float]:
    """Step → value of a panel's metric in one run (smoothed over steps for per-step metrics, but β)."""
    if panel in EVALUATED_PANELS:
        return {e["step"]: e[metric] for e in getattr(run, EVALUATED_PANELS[panel]) if metric in e}
    points = [(h["step"], h[metric]) for h in run.history if metric in h]
    if not points:
        return {}
    steps, values = zip(*points)
    # A trailing moving average: noisy per-step metrics are easier to compare smoothed.
    window = max(1, len(values) // 20) if panel != "beta" else 1
    smoothed = [
        sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))
    ]
    return dict(zip(steps, smoothed))


# Panels whose metric cannot leave a range → that range. A t-interval over 3 seeds of a fraction can reach past 0 or
# 1 (one seed at 0, two near 0.8); the band is clipped so that it never shows a value the metric cannot take.
PANEL_BOUNDS = {
    **dict.fromkeys(("validation_accuracy", "diversity"), (0.0, 1.0)),
    **dict.fromkeys(("completion_length", "drift", "general_drift"), (0.0, math.inf)),
}


def panel_bounds(panel: str, runs: list[VariantRun]) -> tuple[float, float]:
    """The values `panel`'s metric can take: `PANEL_BOUNDS`, and for the mean completion length no more than the
    longest completion any of `runs` logged (TRL's `completions/max_length`, at most `max_completion_length`), which
    no per-step mean, smoothed or averaged over seeds, can exceed."""
    floor, ceiling = PANEL_BOUNDS.get(panel, (-math.inf, math.inf))
    if panel == "completion_length":
        longest = [
            entry["completions/max_length"]
            for run in runs
            for entry in run.history
            if "completions/max_length" in entry
        ]
        ceiling = min(ceiling, max(longest, default=math.inf))
    return floor, ceiling


def _seed_curve(series: list[dict[int, float]], bounds: tuple[float, float] = (-math.inf, math.inf)):
    """`(steps, mean, low, high)` over the steps every seed logged; the band is the 95% t-interval (none for one
    seed), clipped to `bounds`, the values the metric can take."""
    steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
    stats = [mean_interval([s[step] for s in series]) for step in steps]
    mean = [m for m, _, _ in stats]
    half = [0.0 if math.isnan(h) else h for _, h, _ in stats]
    floor, ceiling = bounds
    low = [max(floor, m - h) for m, h in zip(mean, half)]
    high = [min(ceiling, m + h) for m, h in zip(mean, half)]
    return steps, mean, low, high


def write_plots(runs: list[VariantRun], directory: str) -> list[str]:
    """`metrics.png` with every panel some run has data for, and one `<panel>.png` per such panel; one curve per
    variant (the mean over its seeds, with a shaded 95% band when it has several). Returns the paths written (none
    without matplotlib, which the `demo` extra installs)."""
    try:
        import matplotlib
    except ImportError:
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = seed_groups(runs)
    panels = [p for p in PANELS if any(_series(run, p[0], p[1]) for run in runs)]  # an empty panel is not drawn

    def draw(ax, panel, metric, title):
        bounds = panel_bounds(panel, runs)
        for i, (name, group) in enumerate(groups.items()):
            color = f"C{i % 10}"
            steps, mean, low, high = _seed_curve([_series(run, panel, metric) for run in group], bounds)
            if not steps:
                continue
            style = dict(marker="o", markersize=3) if panel in EVALUATED_PANELS else {}
            ax.plot(steps, mean, color=color, label=name, **style)
            if len(group) > 1:
                ax.fill_between(steps, low, high, color=color, alpha=0.15, linewidth=0)
            if panel == "kl":
                adapted = _seed_curve([_series(run, panel, "adaptive_kl/adapted_kl") for run in group])
                ax.plot(adapted[0], adapted[1], "--", color=color)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)

    paths = []
    columns = 4
    rows = -(-(len(panels) + 1) // columns)  # the panels and the legend
    fig, axes = plt.subplots(rows, columns, figsize=(18, 3.75 * rows), squeeze=False)
    for ax, (panel, metric, title) in zip(axes.flat, panels):
        draw(ax, panel, metric, title)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    # Long variant names wrap, so that the legend's cell does not squeeze the panels' columns.
    labels = [textwrap.fill(label, 40, subsequent_indent="  ") for label in labels]
    axes.flat[len(panels)].legend(handles, labels, loc="center", title="variant", fontsize=9)
    fig.tight_layout()
    paths.append(os.path.join(directory, "metrics.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    for panel, metric, title in panels:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        draw(ax, panel, metric, title)
        handles, labels = ax.get_legend_handles_labels()
        # Below the axes, wrapped: long variant names (a study's overrides) would otherwise cover the curves or be cut.
        labels = [textwrap.fill(label, 70, subsequent_indent="  ") for label in labels]
        legend = ax.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
        paths.append(os.path.join(directory, f"{panel}.png"))
        fig.savefig(paths[-1], dpi=110, bbox_inches="tight", bbox_extra_artists=[legend])
        plt.close(fig)
    return paths


def write_completions(runs: list[VariantRun], path: str) -> str | None:
    """Writes what each run's policy wrote at its evaluations (`VariantRun.samples`: the greedy answer and one
    sampled at temperature 1, for the first validation problems) to `path` as Markdown; returns the path, or `None`
    (nothing written) when no run saved any."""
    if not any(run.samples for run in runs):
        return None
    lines = ["# Completions", "", "At each evaluation, the first validation problems: the greedy answer and one "
             "sampled at temperature 1 (the training's own sampling is not touched by it).", ""]  # fmt: skip
    for run in runs:
        for sample in run.samples:
            prompt = f"Prompt (answer {sample['answer']}):" if sample["answer"] else "Prompt:"  # `--dataset`: none
            lines += [f"## {run.name}: step {sample['step']}", "", prompt, ""]
            lines += [f"> {line}" for line in sample["prompt"].splitlines()] + [""]
            for kind in ("greedy", "sampled"):
                lines += [f"{kind}:", "", "```text", sample[kind], "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def write_report(
    runs: list[VariantRun],
    directory: str,
    title: str = "adaptive-kl comparison",
    notes: str = "",
    endpoints: list[PairedEndpoint] | tuple = (),
    with_activity: bool = False,
) -> dict:
    """Writes `summary.md` (with the stated `endpoints` when given, and with `with_activity` what each method did),
    `metrics.csv` and the PNG plots to `directory`; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    summary = os.path.join(directory, "summary.md")
    with open(summary, "w") as f:
        f.write(f"# {title}\n\n{notes}\n\n" if notes else f"# {title}\n\n")
        f.write(summary_table(runs))
        if endpoints:
            f.write(endpoints_section(runs, list(endpoints)))
        if with_activity:
            f.write(activity_section(runs))
        diversity = diversity_table(runs)
        if diversity:
            f.write(f"\nDiversity (means over the last quarter of steps):\n\n{diversity}")
    metrics = os.path.join(directory, "metrics.csv")
    write_csv(runs, metrics)
    return {"summary": summary, "csv": metrics, "plots": write_plots(runs, directory)}
