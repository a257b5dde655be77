"""Several seeds per variant (`compare --seed 0,1,...`): means with 95% t-intervals, paired differences, seed bands
in the plots, no empty panels; checked against independent computations, and end to end on the embedded task."""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics

import pytest
from test_demo import check_png
from tiny import run_python

from adaptive_kl.demo.report import (
    PANEL_BOUNDS,
    SUMMARY_HEADER,
    TERMINAL_COLUMNS,
    PairedEndpoint,
    _seed_curve,
    activity,
    activity_section,
    endpoint_section,
    endpoints_section,
    panel_bounds,
    summarize,
    summary_table,
    write_plots,
)
from adaptive_kl.demo.runner import VariantRun
from adaptive_kl.demo.seeds import (
    binomial_interval,
    detectable_difference,
    format_p,
    group_name,
    holm,
    mean_interval,
    paired_differences,
    regularized_beta,
    sd_ratio_interval,
    seed_groups,
    t_cdf,
    t_quantile,
    t_test_p,
)


def test_t_quantiles_are_students():
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (*range(1, 31), 60, 200, 1000):
        assert t_quantile(0.975, df) == pytest.approx(scipy_stats.t.ppf(0.975, df), abs=1e-9)
        assert t_quantile(0.80, df) == pytest.approx(scipy_stats.t.ppf(0.80, df), abs=1e-9)
    with pytest.raises(ValueError):
        t_quantile(0.975, 0)


def test_mean_interval_by_hand():
    mean, half, n = mean_interval([0.4, 0.5, 0.6, float("nan"), None])
    assert (mean, n) == (pytest.approx(0.5), 3)
    assert half == pytest.approx(4.302653 * 0.1 / math.sqrt(3))  # t_{0.975,2} · s / √n, s = 0.1
    assert mean_interval([0.7])[1] != mean_interval([0.7])[1]  # NaN: no interval from one seed
    assert all(math.isnan(v) for v in mean_interval([])[:2])


def run(variant: str, seed: int, accuracy: float, kl: float) -> VariantRun:
    """A fabricated run of `variant` with `seed`: final accuracy `accuracy`, KL `kl` at both steps."""
    history = [
        {"step": 1, "reward": 1.0 + seed, "adaptive_kl/raw_kl": kl, "adaptive_kl/adapted_kl": kl,
         "adaptive_kl/current_beta": 0.1, "completions/mean_length": 10.0},
        {"step": 2, "reward": 2.0 + seed, "adaptive_kl/raw_kl": kl, "adaptive_kl/adapted_kl": kl,
         "adaptive_kl/current_beta": 0.1, "completions/mean_length": 12.0},
    ]  # fmt: skip
    evaluations = [{"step": 0, "val_accuracy": 0.3}, {"step": 2, "val_accuracy": accuracy}]
    name = f"{variant}, seed={seed}" if variant else f"seed={seed}"
    return VariantRun(name, {"kl_scaling": variant, "seed": seed}, history, evaluations, wall_time=5.0)


# Accuracies chosen so that the paired differences (0.05, 0.07, 0.06) vary far less than the accuracies themselves.
RUNS = [
    run("kl_scaling=none", 0, 0.40, 0.01),
    run("kl_scaling=none", 1, 0.50, 0.02),
    run("kl_scaling=none", 2, 0.45, 0.03),
    run("kl_scaling=log", 0, 0.45, 0.02),
    run("kl_scaling=log", 1, 0.57, 0.02),
    run("kl_scaling=log", 2, 0.51, 0.05),
]


def test_students_t_is_computed_without_scipy():
    """`t_cdf` (Abramowitz & Stegun's finite series) against the closed forms for 1 to 4 degrees of freedom and the
    known quantiles; `t_quantile` (bisection on it) against tabulated t_{0.975, df} and t_{0.80,4} = 0.9410."""
    for t in (-30.0, -2.5, -0.7, 0.0, 0.3, 1.0, 2.776445, 12.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(t * t + 2)), abs=1e-12)
        u = 1 + t * t / 3
        assert t_cdf(t, 3) == pytest.approx(0.5 + (t / (math.sqrt(3) * u) + math.atan(t / math.sqrt(3))) / math.pi)
        v = 1 + t * t / 4
        assert t_cdf(t, 4) == pytest.approx(0.5 + 3 / 8 * t / math.sqrt(v) * (1 - t * t / (12 * v)), abs=1e-12)
    assert 2 * (1 - t_cdf(2.776445, 4)) == pytest.approx(0.05, abs=1e-6)  # t_{0.975,4}: two-sided p = 0.05
    assert t_cdf(math.inf, 3) == 1.0 and t_cdf(-math.inf, 6) == 0.0
    assert t_quantile(0.975, 1) == pytest.approx(12.706205, abs=1e-6)
    for df, tabulated in ((2, 4.302653), (10, 2.228139), (30, 2.042272)):
        assert t_quantile(0.975, df) == pytest.approx(tabulated, abs=1e-6)
    assert t_quantile(0.80, 4) == pytest.approx(0.9410, abs=1e-4)
    assert t_quantile(0.80, 2) == pytest.approx(0.6 / math.sqrt(2 * 0.8 * 0.2), abs=1e-9)  # ν = 2's closed form
    assert t_quantile(0.025, 4) == pytest.approx(-2.776445, abs=1e-6) and t_quantile(0.5, 7) == 0.0
    assert 1.959964 < t_quantile(0.975, 1000) < t_quantile(0.975, 500) < t_quantile(0.975, 30)  # down to the normal's
    with pytest.raises(ValueError):
        t_cdf(1.0, 0)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


def test_a_paired_t_test_and_the_difference_it_would_detect():
    # (1, 2, 3): t = 2 / (1/√3) = 2√3 with 2 degrees of freedom, p = 1 − t/√(t² + 2).
    assert t_test_p([1.0, 2.0, 3.0]) == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(14), abs=1e-12)
    assert t_test_p([-1.0, -2.0, -3.0]) == t_test_p([1.0, 2.0, 3.0])  # two-sided
    assert t_test_p([0.1, 0.1, 0.1]) == 0.0 and t_test_p([0.0, 0.0]) == 1.0  # no spread
    assert math.isnan(t_test_p([0.4])) and math.isnan(t_test_p([0.4, math.nan]))
    # (t_{0.975,2} + t_{0.80,2}) · s / √n with s = 1: 4.302653 + 1.060660 over √3.
    assert detectable_difference([1.0, 2.0, 3.0]) == pytest.approx((4.302653 + 1.060660) / math.sqrt(3), abs=1e-5)
    assert math.isnan(detectable_difference([0.3]))
    assert [format_p(p) for p in (0.0098, 0.00001, math.nan, 1.0)] == ["0.0098", "< 0.0001", "n/a", "1.0000"]


def test_holms_adjustment_by_hand():
    """p = 0.01, 0.04, 0.03, 0.005: sorted 0.005, 0.01, 0.03, 0.04, times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04, each
    at least the one before (0.04 → 0.06), in the given order 0.03, 0.06, 0.06, 0.02. A NaN (no test) is not counted
    in the family; nothing exceeds 1."""
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    adjusted = holm([0.01, math.nan, 0.04])
    assert adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.04)
    assert holm([0.6, 0.7]) == [1.0, 1.0] and holm([]) == []


def test_runs_group_by_variant_without_the_seed():
    assert group_name(RUNS[4]) == "kl_scaling=log" and group_name(run("", 3, 0.1, 0.1)) == "default"
    groups = seed_groups(RUNS)
    assert list(groups) == ["kl_scaling=none", "kl_scaling=log"] and [len(g) for g in groups.values()] == [3, 3]
    accuracy = lambda r: r.evaluations[-1]["val_accuracy"]  # noqa: E731
    assert paired_differences(groups["kl_scaling=log"], groups["kl_scaling=none"], accuracy) == pytest.approx(
        [0.05, 0.07, 0.06]
    )
    assert paired_differences(groups["kl_scaling=log"][:2], groups["kl_scaling=none"][1:], accuracy) == (
        pytest.approx([0.07])  # only seed 1 is shared
    )


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_table_gives_means_intervals_seeds_and_paired_differences():
    text = summary_table(RUNS)
    tables = [[cells(line) for line in block.splitlines() if line.startswith("| ")] for block in text.split("\n\n")]
    means, differences = [t for t in tables if t]
    assert means[0] == [SUMMARY_HEADER[0], "seeds", *SUMMARY_HEADER[1:]] == differences[0]
    none, log = means[1], means[2]
    assert none[:2] == ["kl_scaling=none", "3"] and log[:2] == ["kl_scaling=log", "3"]
    for row, accuracies in ((none, [0.40, 0.50, 0.45]), (log, [0.45, 0.57, 0.51])):
        half = 4.302653 * statistics.stdev(accuracies) / math.sqrt(3)
        assert row[2] == f"{statistics.fmean(accuracies):.3f} ± {half:.3f}"
    kl_column = SUMMARY_HEADER.index("mean raw KL") + 1
    assert none[kl_column] == f"0.0200 ± {4.302653 * 0.01 / math.sqrt(3):.4f}"
    assert summarize(RUNS[0])["final_accuracy"] == 0.40
    (log_vs_none,) = differences[1:]
    assert log_vs_none[:2] == ["kl_scaling=log", "3"]
    assert log_vs_none[2] == f"+0.060 ± {4.302653 * 0.01 / math.sqrt(3):.3f}"  # paired: s of (0.05, 0.07, 0.06)
    assert "Paired differences from kl_scaling=none" in text


def test_a_cell_measured_on_fewer_seeds_than_its_row_says_its_own_n():
    """A metric one run did not measure (NaN: e.g. a column added after it ran) is averaged over the others, and the
    cell says so: `(n=2)` under a row whose `seeds` is 3, in the means and in the paired differences."""
    runs = [dataclasses.replace(r) for r in RUNS]
    runs[0] = dataclasses.replace(
        runs[0], evaluations=[{"step": 0, "val_accuracy": 0.3}, {"step": 2, "val_accuracy": math.nan}]
    )
    text = summary_table(runs)
    blocks = [[cells(line) for line in block.splitlines() if line.startswith("| ")] for block in text.split("\n\n")]
    means, differences = [t for t in blocks if t]
    none, log = means[1], means[2]
    half = 12.706205 * statistics.stdev([0.50, 0.45]) / math.sqrt(2)  # t_{0.975,1}: two seeds, one degree of freedom
    assert none[1] == "3" and none[2] == f"0.475 ± {half:.3f} (n=2)"
    assert "(n=" not in log[2]  # every seed measured it
    assert differences[1][1] == "3" and differences[1][2].endswith("(n=2)")  # seed 0's difference is NaN


def test_a_stated_endpoint_reads_its_paired_interval_and_claims_a_difference_only_where_it_excludes_0():
    endpoint = PairedEndpoint(variant="kl_scaling=log", against="kl_scaling=none", metric="final_accuracy")
    text = endpoint_section(RUNS, endpoint)
    half = 4.302653 * 0.01 / math.sqrt(3)  # s of the paired differences (0.05, 0.07, 0.06) is 0.01
    assert "- seeds both ran: 3 (2 degrees of freedom)" in text
    assert "- by seed: +0.050 (seed 0), +0.070 (seed 1), +0.060 (seed 2)" in text
    assert f"- paired difference: +0.060 ± {half:.3f}" in text
    assert "excludes 0: val. accuracy (final) is higher with kl_scaling=log (3 seeds)" in text

    # The same variants' KL: paired (0.01, 0, 0.02), mean 0.01 with a half-width of 0.0248: no claim.
    text = endpoint_section(RUNS, dataclasses.replace(endpoint, metric="mean_raw_kl"))
    assert "- paired difference: +0.0100 ± 0.0248" in text
    assert "contains 0: no difference detected with 3 seeds" in text and "higher" not in text

    # Reversed, the sign and the side flip; unpaired seeds are left out; one pair is no result.
    reversed_ = dataclasses.replace(endpoint, variant="kl_scaling=none", against="kl_scaling=log")
    assert "higher with kl_scaling=log" in endpoint_section(RUNS, reversed_)
    text = endpoint_section(RUNS[:1] + RUNS[3:5], endpoint)
    assert "seeds both ran: 1 (0 degrees of freedom)" in text and "no interval, no result" in text
    assert "no seed has a finished run of both" in endpoint_section(RUNS[:3], endpoint)


def test_several_endpoints_are_one_row_each_with_the_reading_of_a_single_one():
    endpoint = PairedEndpoint(variant="kl_scaling=log", against="kl_scaling=none", metric="final_accuracy")
    kl = dataclasses.replace(endpoint, metric="mean_raw_kl")
    assert endpoints_section(RUNS, [endpoint]) == endpoint_section(RUNS, endpoint)
    rows = [cells(line) for line in endpoints_section(RUNS, [endpoint, kl]).splitlines() if line.startswith("| ")]
    header, accuracy, raw_kl = rows
    assert header[:3] == ["comparison", "metric", "seeds"]
    half = 4.302653 * 0.01 / math.sqrt(3)
    # Paired t with 2 degrees of freedom, p = 1 − t/√(t² + 2): accuracy t = 0.06/(0.01/√3) = 6√3, p = 0.0091, the
    # smaller of the two, doubled by Holm to 0.0183; the KL's t = √3, p = 0.2254, kept.
    reading = (
        "the interval excludes 0 and the difference holds under Holm: val. accuracy (final) is higher with "
        "kl_scaling=log (3 seeds)"
    )
    assert accuracy == [
        "kl_scaling=log − kl_scaling=none", "val. accuracy (final)", "3", "+0.050 (0), +0.070 (1), +0.060 (2)",
        f"+0.060 ± {half:.3f}", "0.0091", "0.0183", reading,
    ]  # fmt: skip
    # The KL's smallest detectable difference at 80% power: (t_{0.975,2} + t_{0.80,2})·s/√3, with the closed form of
    # 2 degrees of freedom t_{0.80,2} = 0.6·√(2 / 0.64) and s = 0.01 (the differences 0.01, 0, 0.02).
    detectable = (4.302653 + 0.6 * math.sqrt(2 / 0.64)) * 0.01 / math.sqrt(3)
    assert raw_kl[4:] == [
        "+0.0100 ± 0.0248", "0.2254", "0.2254",
        f"the interval contains 0: no difference detected with 3 seeds (the design detects ±{detectable:.4f} at 80% "
        "power)",
    ]  # fmt: skip
    assert "p (two-sided paired t-test): 0.0091" in endpoint_section(RUNS, endpoint)


def test_a_difference_whose_interval_excludes_0_is_not_claimed_when_holm_does_not_keep_it():
    """Accuracy differences 0.05, 0.07, 0.03: t = 0.05/(0.02/√3) = 4.330 > t_{0.975,2}, p = 0.0494; beside the KL's
    p = 0.2254, Holm doubles it to 0.0988: the interval excludes 0, the family-wise reading does not."""
    runs = [*RUNS[:3], run("kl_scaling=log", 0, 0.45, 0.02), run("kl_scaling=log", 1, 0.57, 0.02),
            run("kl_scaling=log", 2, 0.48, 0.05)]  # fmt: skip
    endpoint = PairedEndpoint(variant="kl_scaling=log", against="kl_scaling=none", metric="final_accuracy")
    rows = [
        cells(line)
        for line in endpoints_section(
            runs, [endpoint, dataclasses.replace(endpoint, metric="mean_raw_kl")]
        ).splitlines()
        if line.startswith("| ")
    ]
    accuracy = dict(zip(rows[0], rows[1]))
    assert accuracy["paired difference"] == f"+0.050 ± {4.302653 * 0.02 / math.sqrt(3):.3f}"  # 0.050 ± 0.050
    assert (accuracy["p"], accuracy["Holm-adjusted p"]) == ("0.0494", "0.0988")
    assert accuracy["reading"] == (
        "the interval excludes 0 (unadjusted: val. accuracy (final) higher with kl_scaling=log), but the difference "
        "does not hold under Holm across the 2 endpoints: none claimed with 3 seeds"
    )


def test_a_methods_activity_is_read_from_its_logged_steps():
    """The clip fraction and the adapted/raw ratio are means over the steps; β's decays are counted where a step's β
    is below the one before, and the first such step named; its raises where it is above, and its largest value kept;
    a run at a fixed β has neither."""
    betas, clips = [0.2, 0.2, 0.18, 0.27, 0.162], [0, 0.1, 0.3, 0, 0.1]  # down, up ×1.5, down: a controller's β
    raws, adapted = [0, 1, 2, 3, 4], [0, 1, 1, 1, 2]
    history = [
        {"step": step, "adaptive_kl/current_beta": b, "adaptive_kl/clip_fraction": c, "adaptive_kl/raw_kl": r,
         "adaptive_kl/adapted_kl": a}
        for step, b, c, r, a in zip(range(1, 6), betas, clips, raws, adapted)
    ]  # fmt: skip
    decaying = VariantRun("dynamic, seed=0", {"seed": 0}, history, [], wall_time=1.0)
    got = activity(decaying)
    assert got["clip_fraction"] == pytest.approx(0.1) and got["kept"] == pytest.approx(5 / 10)
    assert (got["final_beta"], got["lowered"], got["first_lower"]) == (0.162, 2.0, 3.0)
    assert (got["raised"], got["largest_beta"]) == (1.0, 0.27)
    fixed = activity(RUNS[0])
    assert fixed["lowered"] == 0 and math.isnan(fixed["first_lower"]) and fixed["kept"] == 1.0
    assert fixed["raised"] == 0 and fixed["largest_beta"] == fixed["final_beta"]
    table = activity_section([decaying, *RUNS[:3]])
    rows = {row[0]: row for row in (cells(line) for line in table.splitlines() if line.startswith("| "))}
    assert rows["dynamic"][1:] == ["1", "0.1000", "0.500", "0.162", "2.0", "3.0", "1.0", "0.27"]
    assert rows["kl_scaling=none"][5:7] == ["0.0 ± 0.0", "n/a"]  # β never fell: no first step
    assert rows["kl_scaling=none"][7] == "0.0 ± 0.0"  # nor rose
    no_kl = VariantRun("beta=0, seed=0", {"seed": 0}, [{"step": 1, "reward": 1.0}], [], wall_time=1.0)
    assert activity_section([no_kl]) == ""


def test_the_printed_table_over_seeds_keeps_its_intervals_and_paired_differences():
    """The table the command prints has the seed means and the paired differences of the full table, for the columns
    a reader compares alone."""
    text = summary_table(RUNS, TERMINAL_COLUMNS)
    tables = [[cells(line) for line in block.splitlines() if line.startswith("| ")] for block in text.split("\n\n")]
    means, differences = [t for t in tables if t]
    wanted = ["val. accuracy (final)", "reward (last quarter)", "mean raw KL", "final β", "mean completion length",
              "held-out KL to start (final)", "wall time (s)"]  # fmt: skip
    assert means[0] == ["variant", "seeds", *wanted] == differences[0]
    full = [
        [cells(line) for line in block.splitlines() if line.startswith("| ")]
        for block in summary_table(RUNS).split("\n\n")
    ]
    full_means = [t for t in full if t][0]
    for row, full_row in zip(means[1:], full_means[1:], strict=True):
        assert row == [full_row[full_means[0].index(name)] for name in means[0]]
    assert "Paired differences from kl_scaling=none" in text


def test_one_seed_per_variant_keeps_the_plain_table():
    table = summary_table([RUNS[0], RUNS[3]]).splitlines()
    assert cells(table[0]) == list(SUMMARY_HEADER)  # the two runs have different seeds, but one each
    assert "±" not in "\n".join(table)


def test_plots_draw_no_empty_panel_and_seed_bands(tmp_path):
    pytest.importorskip("matplotlib")
    paths = write_plots(RUNS, str(tmp_path))
    names = sorted(p.rsplit("/", 1)[-1] for p in paths)
    # no retention, no diversity: those panels are not drawn at all
    assert names == sorted(["metrics.png", "reward.png", "validation_accuracy.png", "kl.png", "beta.png",
                            "completion_length.png"])  # fmt: skip
    for path in paths:
        check_png(path)


def test_a_seed_band_stays_inside_the_values_its_metric_can_take():
    """Accuracy 0, 0.719, 0.844 over 3 seeds: the t-interval (0.521 ± 1.131) reaches below 0 and above 1, and the
    plotted band is clipped to [0, 1]; a metric with no bounds keeps the whole interval."""
    series = [{100: 0.0}, {100: 0.719}, {100: 0.844}]
    mean, half = statistics.mean([0.0, 0.719, 0.844]), 4.303 * statistics.stdev([0.0, 0.719, 0.844]) / 3**0.5
    assert mean - half < 0 and mean + half > 1
    steps, means, low, high = _seed_curve(series, PANEL_BOUNDS["validation_accuracy"])
    assert steps == [100] and means == pytest.approx([mean]) and low == [0.0] and high == [1.0]
    _, _, low, high = _seed_curve(series)
    assert low == pytest.approx([mean - half], abs=1e-3) and high == pytest.approx([mean + half], abs=1e-3)


def test_a_mean_length_band_stays_below_the_longest_completion():
    """Mean lengths 128, 128, 60 at a step of a 128-token budget: the t-interval (105.3 ± 97.5) reaches past 128,
    which no mean length can; the band stops at the longest completion the runs logged (`completions/max_length`).
    Without that metric, or on another panel, the bounds are `PANEL_BOUNDS`'."""
    lengths = [128.0, 128.0, 60.0]
    runs = [
        dataclasses.replace(r, history=[{"step": 1, "completions/mean_length": n, "completions/max_length": 128.0}])
        for r, n in zip(RUNS, lengths)
    ]
    assert panel_bounds("completion_length", runs) == (0.0, 128.0)
    assert panel_bounds("completion_length", RUNS) == PANEL_BOUNDS["completion_length"]  # no max_length logged
    assert panel_bounds("reward", runs) == (-math.inf, math.inf)
    mean, half = statistics.mean(lengths), 4.303 * statistics.stdev(lengths) / 3**0.5
    assert mean + half > 128
    series = [{1: n} for n in lengths]
    _, means, low, high = _seed_curve(series, panel_bounds("completion_length", runs))
    assert means == pytest.approx([mean]) and low == pytest.approx([mean - half], abs=0.1) and high == [128.0]


def test_a_panel_legend_of_long_variant_names_is_kept_whole_below_the_curves(tmp_path):
    """A study's variant names are long (`beta=0.2, loss_type=grpo, kl_placement=reward, ...`): the single-panel
    PNG grows to hold the wrapped legend below the axes instead of cutting it or covering the curves."""
    image = pytest.importorskip("matplotlib.image")
    long_name = ", ".join(f"field_{i}=value_{i}" for i in range(12))
    runs = [dataclasses.replace(run, name=run.name.replace("kl_scaling=none", long_name)) for run in RUNS]
    (tmp_path / "short").mkdir(), (tmp_path / "long").mkdir()
    short = image.imread(next(p for p in write_plots(RUNS, str(tmp_path / "short")) if p.endswith("reward.png")))
    long = image.imread(next(p for p in write_plots(runs, str(tmp_path / "long")) if p.endswith("reward.png")))
    assert long.shape[0] > short.shape[0]  # taller: the legend's extra wrapped lines are in the image
    assert abs(long.shape[1] - short.shape[1]) < 0.1 * short.shape[1]  # not widened by an unwrapped name


def test_compare_over_seeds_end_to_end(tmp_path):
    """`adaptive-kl compare --seed 0,1 --quick`: the printed table has `±` and `seeds`, the CSV every run."""
    out = tmp_path / "compare"
    result = run_python(
        "-m", "adaptive_kl", "compare", "--kl_scaling", "none,log", "--seed", "0,1", "--quick", "--steps", "2",
        "--eval-every", "2", "--n-validation", "8", "--no-progress", "--out", str(out),
    )  # fmt: skip
    lines = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert cells(lines[0])[:2] == ["variant", "seeds"]
    rows = {cells(line)[0]: cells(line) for line in lines[1:3]}  # the first table
    assert rows["kl_scaling=none"][1] == rows["kl_scaling=log"][1] == "2" and "±" in rows["kl_scaling=none"][2]
    assert "Paired differences from kl_scaling=none" in result.stdout
    header = cells(lines[0])
    drift = rows["kl_scaling=log"][header.index("held-out KL to start (final)")]
    assert float(drift.split(" ± ")[0]) > 0  # measured whatever β, from the held-out solutions
    summary = (out / "summary.md").read_text()
    for line in (
        "- versions: Python",
        "- command: `adaptive-kl compare --kl_scaling none,log --seed 0,1",
        "- wall time: ",
    ):
        assert line in summary
    assert "seed(s) 0, 1;" in summary
    with open(out / "metrics.csv") as f:
        variants = {r["variant"] for r in csv.DictReader(f)}
    assert variants == {f"kl_scaling={k}, seed={s}" for k in ("none", "log") for s in (0, 1)}


@pytest.mark.parametrize(
    "successes, trials, expected",
    [  # Clopper-Pearson 95% intervals as tabled (e.g. R's binom.test)
        (0, 5, (0.0, 0.5218)),
        (2, 5, (0.0527, 0.8534)),
        (5, 5, (0.4782, 1.0)),
        (1, 10, (0.0025, 0.4450)),
        (3, 3, (0.2924, 1.0)),
    ],
)
def test_the_exact_binomial_interval(successes, trials, expected):
    assert binomial_interval(successes, trials) == pytest.approx(expected, abs=1e-4)


def test_the_exact_binomial_interval_holds_its_coverage_at_its_ends():
    """At the lower end P(X ≥ k) = 0.025, at the upper P(X ≤ k) = 0.025."""
    low, high = binomial_interval(2, 5)
    assert sum(math.comb(5, i) * low**i * (1 - low) ** (5 - i) for i in range(2, 6)) == pytest.approx(0.025, abs=1e-9)
    assert sum(math.comb(5, i) * high**i * (1 - high) ** (5 - i) for i in range(3)) == pytest.approx(0.025, abs=1e-9)
    assert all(math.isnan(v) for v in binomial_interval(0, 0))


def test_the_incomplete_beta_function_is_computed_without_scipy():
    """`regularized_beta` against its closed forms (I_x(1, 1) = x, I_x(a, 1) = x^a, I_x(1, b) = 1 − (1 − x)^b), against
    Student's t (T² with ν degrees of freedom is F(1, ν): I_{t²/(t² + ν)}(½, ν/2) = 2·P(T ≤ t) − 1, by `t_cdf`'s
    own series) and against scipy on a grid of shapes, small and large, on both sides of its switch."""
    for x in (0.0, 1e-6, 0.2, 0.5, 0.93, 1.0):
        assert regularized_beta(x, 1, 1) == pytest.approx(x, abs=1e-14)
        assert regularized_beta(x, 3.5, 1) == pytest.approx(x**3.5, abs=1e-14)
        assert regularized_beta(x, 1, 2.5) == pytest.approx(1 - (1 - x) ** 2.5, abs=1e-14)
    for nu in (1, 2, 3, 4, 7, 30):
        for t in (0.1, 0.9, 2.0, 4.3, 25.0):
            assert regularized_beta(t * t / (t * t + nu), 0.5, nu / 2) == pytest.approx(
                2 * t_cdf(t, nu) - 1, abs=1e-12
            )
    special = pytest.importorskip("scipy.special")
    for a in (0.3, 0.5, 1.5, 2, 4.5, 40):
        for b in (0.3, 0.5, 2, 3.5, 40):
            for x in (0.01, 0.3, 0.5, 0.7, 0.99):
                assert regularized_beta(x, a, b) == pytest.approx(special.betainc(a, b, x), abs=1e-12)


def test_the_ratio_of_two_spreads_has_the_f_interval():
    """Two samples of 5 (4 and 4 degrees of freedom): the ratio of their SDs, over and under by √F_{0.975}(4, 4) =
    √9.6045 (tabulated; F(4, 4) is its own reciprocal's); samples of 3 and 6 against scipy's F quantiles; NaN where a
    sample has under 2 values or the second no spread."""
    values, others = [0.61, 0.53, 0.68, 0.6, 0.66], [0.5, 0.91, 0.43, 0.7, 0.82]
    ratio, low, high = sd_ratio_interval(values, others)
    assert ratio == pytest.approx(statistics.stdev(values) / statistics.stdev(others), rel=1e-12)
    assert (low, high) == pytest.approx((ratio / 9.6045**0.5, ratio * 9.6045**0.5), rel=1e-4)
    stats = pytest.importorskip("scipy.stats")
    values, others = [1.0, 1.4, 0.7], [2.0, 2.5, 1.1, 1.9, 3.0, 2.2]
    ratio, low, high = sd_ratio_interval(values, others)
    assert (low, high) == pytest.approx(
        (ratio / stats.f.ppf(0.975, 2, 5) ** 0.5, ratio / stats.f.ppf(0.025, 2, 5) ** 0.5), rel=1e-9
    )
    for short in ([1.0], [], [1.0, math.nan]):
        assert all(math.isnan(v) for v in sd_ratio_interval(short, others))
        assert all(math.isnan(v) for v in sd_ratio_interval(values, short))
    assert all(math.isnan(v) for v in sd_ratio_interval(values, [0.4, 0.4, 0.4]))
