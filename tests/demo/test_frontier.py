"""Methods read against constant β's frontier (`adaptive_kl.demo.frontier`): the interpolation and its mirror on
hand-worked curves, and the primary endpoint on fabricated runs whose methods sit above, below and on a known
frontier, with its sections and picture."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest
from test_demo import check_png

from adaptive_kl.demo.frontier import (
    Frontier,
    bar,
    best_at_most,
    beta_of,
    curve,
    frontier_sections,
    interpolate,
    line_section,
    log_ticks,
    methods,
    reach,
    read_methods,
    write_frontiers_plot,
)
from adaptive_kl.demo.runner import VariantRun
from adaptive_kl.demo.seeds import group_name


# The title `write_frontier_report` gives a frontier's picture.
PLOT_TITLE = "Constant β's frontier and the methods"


# --- the interpolation and its mirror -------------------------------------------------------------------------------

# Three points, given out of order: (0.1, 0.6), (0.4, 0.8), (1.6, 1.0).
POINTS = [(1.6, 1.0), (0.1, 0.6), (0.4, 0.8)]


def test_the_curve_sorts_its_points_by_x_and_merges_equal_x_into_their_mean():
    assert curve(POINTS) == [(0.1, 0.6), (0.4, 0.8), (1.6, 1.0)]
    assert curve([(0.4, 0.7), (0.1, 0.6), (0.4, 0.9)]) == [(0.1, 0.6), (0.4, pytest.approx(0.8))]
    assert curve([]) == []


def test_the_frontier_is_linear_between_its_points_and_flat_beyond_them():
    assert interpolate(POINTS, 0.1) == 0.6 and interpolate(POINTS, 1.6) == 1.0  # through every point
    assert interpolate(POINTS, 0.4) == pytest.approx(0.8)
    assert interpolate(POINTS, 0.25) == pytest.approx(0.7)  # halfway from 0.1 to 0.4
    assert interpolate(POINTS, 1.0) == pytest.approx(0.9)  # halfway from 0.4 to 1.6
    assert interpolate(POINTS, 0.01) == 0.6 and interpolate(POINTS, 0.0) == 0.6  # flat below the first point
    assert interpolate(POINTS, 5.0) == 1.0  # and above the last
    # Two points of equal x are one vertex at their mean: 0.7 and 0.9 at 0.4 read as 0.8.
    tied = [(0.1, 0.6), (0.4, 0.7), (0.4, 0.9), (1.6, 1.0)]
    assert interpolate(tied, 0.25) == pytest.approx(0.7) and interpolate(tied, 0.4) == pytest.approx(0.8)
    # A curve that dips: (0, 1), (1, 0), (2, 2).
    dipping = [(2.0, 2.0), (0.0, 1.0), (1.0, 0.0)]
    assert interpolate(dipping, 0.5) == pytest.approx(0.5) and interpolate(dipping, 1.5) == pytest.approx(1.0)
    assert interpolate([(0.3, 0.5)], 0.1) == interpolate([(0.3, 0.5)], 9.0) == 0.5  # one point: flat everywhere
    assert math.isnan(interpolate([], 0.3))


def test_the_mirror_is_the_least_x_at_which_the_curve_reaches_y():
    assert reach(POINTS, 0.7) == pytest.approx(0.25) and reach(POINTS, 0.9) == pytest.approx(1.0)
    assert reach(POINTS, 0.8) == pytest.approx(0.4)  # a point's own y: its x
    assert reach(POINTS, 0.6) == 0.1 and reach(POINTS, 0.2) == 0.1  # at or below the curve's start: the first x
    assert reach(POINTS, 1.3) == 1.6  # above all of it: the x of its highest point
    # A curve that dips, (0, 1), (1, 0), (2, 2): y = 0.5 is at or below the start, reached at x = 0 already; y = 1.5
    # first on the last segment (0.5 of the way from 0 to 2: x = 1.75).
    dipping = [(2.0, 2.0), (0.0, 1.0), (1.0, 0.0)]
    assert reach(dipping, 0.5) == 0.0 and reach(dipping, 1.5) == pytest.approx(1.75)
    # A curve that rises, falls and rises less: (0, 0), (1, 2), (2, 1), (3, 1.5): y = 1 is first reached on the first
    # segment (x = 0.5), not at the later dip; above its highest point (2 at x = 1), the x of that point.
    humped = [(0.0, 0.0), (1.0, 2.0), (2.0, 1.0), (3.0, 1.5)]
    assert reach(humped, 1.0) == pytest.approx(0.5) and reach(humped, 2.5) == 1.0
    # A flat top: the first x of it.
    assert reach([(0.0, 0.0), (1.0, 1.0), (2.0, 1.0)], 1.0) == 1.0
    assert reach([(0.0, 0.0), (1.0, 1.0), (2.0, 1.0)], 3.0) == 1.0  # the highest point's first x
    assert math.isnan(reach([], 0.3))


def test_the_best_at_no_more_drift_is_the_curve_where_it_rises_and_its_best_point_before_a_dip():
    # A rising curve: the curve itself, flat beyond its ends.
    for x in (0.0, 0.1, 0.25, 0.4, 1.0, 1.6, 5.0):
        assert best_at_most(POINTS, x) == pytest.approx(interpolate(POINTS, x))
    # (0, 0), (1, 2), (2, 1), (3, 1.5): in the dip after x = 1 the curve reads 1.5 at x = 1.5, the best point at no
    # more drift is (1, 2); past the dip, at x = 3 the curve's 1.5 is still below that point's 2.
    humped = [(0.0, 0.0), (1.0, 2.0), (2.0, 1.0), (3.0, 1.5)]
    assert interpolate(humped, 1.5) == pytest.approx(1.5) and best_at_most(humped, 1.5) == 2.0
    assert best_at_most(humped, 3.0) == 2.0 and best_at_most(humped, 0.5) == pytest.approx(1.0)
    # Before a vertex is reached it does not count: at x = 0.9 the best is the curve's 1.8, not the point's 2.
    assert best_at_most(humped, 0.9) == pytest.approx(1.8)
    assert math.isnan(best_at_most([], 0.3))


def test_a_method_in_a_dip_of_the_line_is_above_it_but_not_above_the_best_at_no_more_drift():
    """Seed by seed the line is (0.1, 0.6), (0.4, 0.9), (0.8, 0.7) and (1.6, 1.0) (β = 0.2, 0.05, 0.02, 0): a method
    at drift 0.8 earning 0.8 is 0.1 above the line there (0.7) and 0.1 below β = 0.05's 0.9 at less drift."""
    line = (*LINE[:2], "beta=0.02, loss_type=grpo", LINE[2])
    points = dict(zip(line, [(1.6, 1.0), (0.4, 0.9), (0.8, 0.7), (0.1, 0.6)]))
    runs = [fake(variant, seed, *points[variant]) for seed in range(3) for variant in line]
    runs += [fake(ABOVE, seed, 0.8, 0.8 + 0.01 * seed) for seed in range(3)]
    (reading,) = read_methods(runs, Frontier(line=line))
    assert reading.above.values == pytest.approx([0.1, 0.11, 0.12])
    assert reading.above_best.values == pytest.approx([-0.1, -0.09, -0.08])


# --- the primary endpoint on fabricated runs -------------------------------------------------------------------------

LINE = ("beta=0, loss_type=grpo", "beta=0.05, loss_type=grpo", "beta=0.2, loss_type=grpo")
FRONTIER = Frontier(
    line=LINE,
    x="final_kl_to_start",
    y="late_reward",
    secondary=("delta_retention", "final_answer_accuracy", "length_drift"),
)
ABOVE = "beta=0.2, loss_type=grpo, kl_adaptation_method=clip"
BELOW = "beta=0.2, loss_type=grpo, kl_adaptation_method=sigmoid"
ON = "beta=0.2, loss_type=grpo, kl_adaptation_method=dynamic"
UNADJUSTED = "beta=0.2, loss_type=grpo, kl_adaptation_method=dynamic, reward_threshold=0.8"
# D on seeds 0-4 of each method (the reward above the frontier): 10 times the spread above and below 0; about 0; and
# one whose unadjusted p (0.040) is below 0.05 but not once Holm doubles it (the second smallest of 4 p-values is ×3,
# the third ×2: 0.080).
D = {
    ABOVE: [0.10, 0.12, 0.09, 0.11, 0.10],
    BELOW: [-0.10, -0.08, -0.12, -0.09, -0.11],
    ON: [0.02, -0.03, 0.01, -0.01, 0.0],
    UNADJUSTED: [0.02, 0.05, 0.0, 0.06, 0.03],
}


def fake(variant: str, seed: int, kl: float, reward: float, retention=0.0, accuracy=0.0, lengthening=0.0):
    """A run of `variant` on `seed` whose summary has held-out KL `kl` (final), reward `reward` (last quarter), Δ
    retention `retention`, format-free accuracy `accuracy` (final) and Δ length `lengthening`."""
    lengths = [40.0, 40.0, 40.0, 40.0 + lengthening]
    history = [{"step": step, "reward": reward, "completions/mean_length": n} for step, n in enumerate(lengths, 1)]
    retention_log = [
        {"step": 0, "retention/loglik": -2.0, "retention/kl_to_start": 0.0},
        {"step": 4, "retention/loglik": -2.0 + retention, "retention/kl_to_start": kl},
    ]
    evaluations = [
        {"step": 0, "val_accuracy": 0.0, "val_answer_accuracy": 0.25},
        {"step": 4, "val_accuracy": 0.0, "val_answer_accuracy": accuracy},
    ]
    return VariantRun(f"{variant}, seed={seed}", {"seed": seed}, history, evaluations, 1.0, retention=retention_log)


def line_point(variant: str, seed: int) -> tuple[float, float]:
    """Seed s's constant-β points: (0.1k, 0.6), (0.4k, 0.8) and (1.6k, 1.0) for β = 0.2, 0.05, 0, with k = 1 + s/10,
    and every reward 0.01·s higher: halfway between the first two, at x = 0.25k, the frontier is 0.7 + 0.01·s."""
    k = 1 + seed / 10
    kl, reward = {LINE[2]: (0.1, 0.6), LINE[1]: (0.4, 0.8), LINE[0]: (1.6, 1.0)}[variant]
    return kl * k, reward + 0.01 * seed


def fabricated_runs() -> list[VariantRun]:
    runs = []
    accuracy = {LINE[2]: 0.2, LINE[1]: 0.4, LINE[0]: 0.0}  # 0.3 halfway between the first two
    for seed in range(6):
        for variant in LINE:
            if seed == 5 and variant == LINE[1]:
                continue  # seed 5 lacks a constant β: no method's seed 5 counts
            kl, reward = line_point(variant, seed)
            runs.append(fake(variant, seed, kl, reward, retention=0.1, accuracy=accuracy[variant]))
    for method, differences in D.items():
        for seed, difference in enumerate(differences):
            k = 1 + seed / 10
            runs.append(fake(method, seed, 0.25 * k, 0.7 + 0.01 * seed + difference, retention=-0.1, accuracy=0.3,
                             lengthening=5.0 + seed))  # fmt: skip
    runs.append(fake(ON, 5, 0.3, 0.9))  # seed 5 has no β = 0.05: left out
    return runs


def test_the_methods_are_the_variants_not_on_the_line():
    assert methods(fabricated_runs(), FRONTIER) == list(D)


def test_methods_above_below_and_on_the_frontier_are_read_as_such():
    readings = {reading.method: reading for reading in read_methods(fabricated_runs(), FRONTIER)}
    for method, differences in D.items():
        reading = readings[method]
        assert reading.above.n == 5 and [seed for seed, _ in reading.above.pairs] == [0, 1, 2, 3, 4]
        assert reading.above.values == pytest.approx(differences)  # D = reward − (0.7 + 0.01·s): the difference
        assert reading.above_best.values == pytest.approx(differences)  # a line that rises: no dip to discount
        half = 2.776445 * statistics.stdev(differences) / math.sqrt(5)
        assert reading.above.mean == pytest.approx(statistics.fmean(differences))
        assert reading.above.half_width == pytest.approx(half, rel=1e-6)
        assert reading.x.values == pytest.approx([0.25 * (1 + s / 10) for s in range(5)])
        # At the method's drift, the line's retention is 0.1 and its accuracy 0.3: the method's −0.1 and 0.3 differ
        # by −0.2 and 0; the line's Δ length is 0, the method's 5 + s.
        assert reading.secondary["delta_retention"].values == pytest.approx([-0.2] * 5)
        assert reading.secondary["final_answer_accuracy"].values == pytest.approx([0.0] * 5)
        assert reading.secondary["length_drift"].values == pytest.approx([5.0, 6.0, 7.0, 8.0, 9.0])
        detectable = (2.776445 + 0.940965) * statistics.stdev(differences) / math.sqrt(5)
        assert reading.detectable == pytest.approx(detectable, rel=1e-5)
    above, below, on, unadjusted = (readings[m] for m in D)
    assert above.reading.startswith("above the frontier: more reward (last quarter) than constant β")
    assert below.reading.startswith("below the frontier: less reward (last quarter)")
    assert above.holm_p < 0.05 and below.holm_p < 0.05
    # No difference detected is not "on the frontier": the reading gives what D's interval still allows, both ends.
    half = 2.776445 * statistics.stdev(D[ON]) / math.sqrt(5)
    assert [f"{statistics.fmean(D[ON]) + side * half:+.3f}" for side in (-1, 1)] == ["-0.026", "+0.022"]
    assert on.reading == (
        "no difference detected with 5 seeds: the interval allows D from -0.026 to +0.022 (detectable at 80% power: "
        "±0.032)"
    )
    assert unadjusted.p == pytest.approx(0.04006, abs=1e-4) and unadjusted.holm_p == pytest.approx(2 * unadjusted.p)
    assert unadjusted.reading.startswith("no difference detected with 5 seeds: the interval allows D from +0.002 to")
    assert all("on the frontier" not in reading.reading for reading in readings.values())
    assert "the unadjusted interval excludes 0 (above, p = 0.0401)" in unadjusted.reading
    assert "but not under Holm's adjustment across the 4 methods (adjusted p = 0.0801)" in unadjusted.reading
    # The mirror, by hand on two seeds. Seed 0 (k = 1): reward 0.8 is β = 0.05's, reached at 0.4; 0.25 − 0.4.
    # Seed 2 (k = 1.2): reward 0.81 on the segment from (0.12, 0.62) to (0.48, 0.82), at 0.12 + 0.36·0.19/0.2.
    mirror = dict(above.mirror.pairs)
    assert mirror[0] == pytest.approx(-0.15) and mirror[2] == pytest.approx(0.3 - (0.12 + 0.36 * 0.95))


def test_a_seed_counts_only_with_the_method_and_every_line_point():
    runs = fabricated_runs()
    # Seed 1's β = 0 is gone: no method's seed 1 counts; the clip arm's seed 3 lost its held-out KL (not measured).
    runs = [run for run in runs if run.name != f"{LINE[0]}, seed=1"]
    clip3 = next(run for run in runs if run.name == f"{ABOVE}, seed=3")
    clip3.retention = []
    readings = {reading.method: reading for reading in read_methods(runs, FRONTIER)}
    assert [seed for seed, _ in readings[ON].above.pairs] == [0, 2, 3, 4]
    assert [seed for seed, _ in readings[ABOVE].above.pairs] == [0, 2, 4]
    one_seed = [run for run in runs if group_name(run) != BELOW or run.config["seed"] == 0]
    reading = next(r for r in read_methods(one_seed, FRONTIER) if r.method == BELOW)
    assert reading.above.n == 1 and reading.reading == "one seed: no test, no result" and math.isnan(reading.p)
    no_line = read_methods([run for run in runs if group_name(run) != LINE[1]], FRONTIER)
    assert all(r.above.n == 0 and r.reading.startswith("not measured yet") for r in no_line)
    assert all(math.isnan(r.holm_p) for r in no_line)


# --- what the summary and the picture show --------------------------------------------------------------------------


def test_the_line_section_tabulates_each_beta_and_bounds_the_drift_it_kept():
    runs = fabricated_runs()
    text = line_section(runs, FRONTIER)
    rows = {cells[0]: cells for cells in table_rows(text)}
    assert list(rows)[:1] == ["β"] and set(rows) == {"β", "0", "0.05", "0.2"}
    assert rows["0.2"][1] == "6" and rows["0.05"][1] == "5"
    # β = 0.2's KL over seeds 0-5: 0.1·(1 + s/10), mean 0.125; the bound is its interval's upper end, and β = 0.05's
    # the larger of its own and β = 0.2's.
    low = [0.1 * (1 + s / 10) for s in range(6)]
    mid = [0.4 * (1 + s / 10) for s in range(5)]
    upper_low = statistics.fmean(low) + 2.570582 * statistics.stdev(low) / math.sqrt(6)
    upper_mid = statistics.fmean(mid) + 2.776445 * statistics.stdev(mid) / math.sqrt(5)
    assert rows["0.2"][2] == f"{statistics.fmean(low):.4f} ± {2.570582 * statistics.stdev(low) / math.sqrt(6):.4f}"
    assert f"- for a held-out KL to start (final) under {upper_low:.4f} here, β ≥ 0.2" in text
    assert f"- for a held-out KL to start (final) under {max(upper_low, upper_mid):.4f} here, β ≥ 0.05" in text
    # With one seed of β = 0.05 there is no bound from it down.
    single = [run for run in runs if not (LINE[1] in run.name and run.config["seed"] > 0)]
    text = line_section(single, FRONTIER)
    assert "- β ≥ 0.05: no bound yet (β = 0.05: fewer than 2 seeds)" in text
    assert "- β ≥ 0: no bound yet (β = 0.05: fewer than 2 seeds)" in text
    assert "![" not in text and "](frontier.png)" in line_section(runs, FRONTIER, "frontier.png")
    assert beta_of("beta=0.02, loss_type=grpo") == "0.02" and beta_of("kl_scaling=log") == "kl_scaling=log"


def table_rows(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ")
    ]


def test_the_sections_state_the_endpoint_and_read_every_method():
    text = frontier_sections(fabricated_runs(), FRONTIER)
    for heading in (
        "## Constant β's frontier",
        "## Methods against the frontier (primary endpoint)",
        "## Secondary endpoints at matched drift",
    ):
        assert heading in text
    methods_table = text[text.index("## Methods against") : text.index("## Secondary")]
    rows = {cells[0]: cells for cells in table_rows(methods_table)}
    header = rows.pop("method")
    assert list(rows) == list(D)
    above = dict(zip(header, rows[ABOVE]))
    assert above["seeds"] == "5"
    assert above["D by seed (seed)"] == "+0.100 (0), +0.120 (1), +0.090 (2), +0.110 (3), +0.100 (4)"
    # The line at the method's drift, 0.7 + 0.01·s on seed s: what constant β earned there, its reward less D.
    line = [0.7 + 0.01 * seed for seed in range(5)]
    assert above["the line at its drift"] == f"0.720 ± {2.776445 * statistics.stdev(line) / math.sqrt(5):.3f}"
    assert above["D: above the frontier"] == f"+0.104 ± {2.776445 * statistics.stdev(D[ABOVE]) / math.sqrt(5):.3f}"
    assert above["reading"].startswith("above the frontier")
    assert above["D against the monotone envelope"] == above["D: above the frontier"]
    assert dict(zip(header, rows[ON]))["Holm-adjusted p"] == "0.8276"  # the largest p: times 1, as it was
    assert "Not adjusted for multiplicity (no Holm)" in text
    secondary = table_rows(text[text.index("## Secondary") :])
    assert len(secondary) == 1 + 3 * len(D)
    retention = next(row for row in secondary if row[:2] == [ABOVE, "Δ retention"])
    assert retention[2:] == ["5", ", ".join(f"-0.2000 ({s})" for s in range(5)), "-0.2000 ± 0.0000",
                             "the interval excludes 0: lower than constant β's"]  # fmt: skip


def test_the_frontier_plot_is_written_on_a_log_or_linear_axis(tmp_path):
    pytest.importorskip("matplotlib")
    runs = fabricated_runs()
    path = write_frontiers_plot([(runs, FRONTIER, PLOT_TITLE)], str(tmp_path / "frontier.png"))
    assert path == str(tmp_path / "frontier.png")
    check_png(path)
    # A drift of 0 (a method that never moved) cannot go on a log axis: the axis is linear.
    still = [*runs, fake("beta=0.2, loss_type=grpo, kl_scaling=log", 0, 0.0, 0.5)]
    check_png(write_frontiers_plot([(still, FRONTIER, PLOT_TITLE)], str(tmp_path / "linear.png")))
    assert write_frontiers_plot([([], FRONTIER, PLOT_TITLE)], str(tmp_path / "none.png")) is None


def test_the_log_axis_is_labelled_in_plain_decimals_that_do_not_overlap(tmp_path, monkeypatch):
    """matplotlib's own labels on a log axis of two decades or less go on the minor ticks too, in scientific
    notation, and at small drift they run into each other ("3×10⁻³4×10⁻³"): the picture labels 1, 2 and 5 times a
    power of 10 (every multiple where those are too few), as plain decimals, none over another."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    assert log_ticks(0.03, 3.0) == [0.05, 0.1, 0.2, 0.5, 1.0, 2.0]
    assert log_ticks(0.0031, 0.0047) == [0.004]  # too narrow for two of 1, 2 or 5: every multiple
    assert log_ticks(0.0025, 0.0047) == [0.003, 0.004]
    assert log_ticks(1e-3, 1e3) == [1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1e3]  # no closer than 1/7 of the axis
    close, figures = plt.close, []
    monkeypatch.setattr(plt, "close", figures.append)
    for scale in (0.03, 0.3, 3.0):  # every drift times `scale`: from a few thousandths to a few units
        runs = fabricated_runs()
        for run in runs:
            for row in run.retention:
                row["retention/kl_to_start"] *= scale
        check_png(write_frontiers_plot([(runs, FRONTIER, PLOT_TITLE)], str(tmp_path / f"frontier-{scale}.png")))
        (axes,) = figures.pop().axes
        axes.figure.canvas.draw()
        renderer = axes.figure.canvas.get_renderer()
        low, high = axes.get_xlim()
        shown = sorted(
            (label for minor in (False, True) for label in axes.xaxis.get_ticklabels(minor=minor)
             if label.get_visible() and label.get_text() and low <= label.get_position()[0] <= high),
            key=lambda label: label.get_position()[0],
        )  # fmt: skip
        texts = [label.get_text() for label in shown]
        boxes = [label.get_window_extent(renderer) for label in shown]
        assert all(left.x1 < right.x0 for left, right in zip(boxes, boxes[1:])), (scale, texts)
        assert len(texts) >= 2 and all(float(text) > 0 for text in texts), (scale, texts)
        close(axes.figure)


def test_frontiers_drawn_side_by_side_give_one_method_one_look(tmp_path, monkeypatch):
    """Two frontiers in one picture: a method in both has the same marker and colour in both, whatever order or
    company it has in each, a controller whatever `target_kl` each study fixed; two methods never share a look."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    controller = "beta=0.2, loss_type=grpo, kl_controller=stepwise, target_kl={}, beta_max=0.2"
    line = [run for run in fabricated_runs() if run.name.rsplit(", seed=", 1)[0] in LINE]
    left = [*fabricated_runs(), *(fake(controller.format(0.147), seed, 0.3, 0.8) for seed in range(3))]
    # The second setting: the controller first, at its own target, then `ON` and `ABOVE` (in that order); no `BELOW`.
    right = [*line, *(fake(controller.format(0.184), seed, 0.3, 0.8) for seed in range(3))]
    right += [run for run in fabricated_runs() if run.name.rsplit(", seed=", 1)[0] in (ON, ABOVE)][::-1]
    path = write_frontiers_plot([(left, FRONTIER, "left"), (right, FRONTIER, "right")], str(tmp_path / "both.png"))
    check_png(path)

    def looks(axes) -> dict[str, tuple[str, str]]:
        """Each method's `(marker, colour)` in `axes`, by its legend label."""
        marks = [bars for bars in axes.containers if bars.get_label().startswith("kl_")]
        return {bars.get_label(): (bars.lines[0].get_marker(), bars.lines[0].get_color()) for bars in marks}

    left_looks, right_looks = (looks(axes) for axes in figures.pop().axes)
    name = {ABOVE: "kl_adaptation_method=clip", ON: "kl_adaptation_method=dynamic"}
    for method in (ABOVE, ON):
        assert left_looks[name[method]] == right_looks[name[method]]
    assert (
        left_looks["kl_controller=stepwise, target_kl=0.147, beta_max=0.2"]
        == right_looks["kl_controller=stepwise, target_kl=0.184, beta_max=0.2"]
    )
    assert len(set(left_looks.values())) == len(left_looks) == 5  # ABOVE, BELOW, ON, UNADJUSTED, the controller
    # The control: drawn alone, each panel numbers its methods in its own order, and the two would disagree.
    check_png(write_frontiers_plot([(right, FRONTIER, PLOT_TITLE)], str(tmp_path / "right.png")))
    (alone,) = figures.pop().axes
    assert looks(alone)[name[ON]] != left_looks[name[ON]]


def test_a_bar_stops_where_the_metric_cannot_go():
    # `[[below], [above]]`, as matplotlib's `errorbar` takes one point's bar.
    assert bar(0.5, 0.2) == [[pytest.approx(0.2)], [pytest.approx(0.2)]]  # no range: the whole interval
    assert bar(0.9, 0.5, 0.0, 1.0) == [[pytest.approx(0.5)], [pytest.approx(0.1)]]  # cut at the top
    assert bar(0.1, 0.5, 0.0, 1.0) == [[pytest.approx(0.1)], [pytest.approx(0.5)]]  # and at the bottom
    assert bar(0.4, 0.6, low=0.1) == [[pytest.approx(0.3)], [pytest.approx(0.6)]]
    with pytest.raises(ValueError, match=r"outside the range its metric is stated to take, \[0, 1\]"):
        bar(1.05, 0.1, 0.0, 1.0)


def test_the_plots_reward_bars_stay_in_the_range_the_study_states(tmp_path, monkeypatch):
    """A method with 2 seeds at rewards 0.1 and 0.9 has a t-interval of 0.5 ± 5.08: drawn whole, its bar would run
    from -4.6 to 5.6 and squash every other point into a line; with a stated range it stops at the range's ends (the
    fabricated line reaches 1.05, so the range here is 0 to 1.1)."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    runs = [*fabricated_runs(), fake("kl_scaling=log", 0, 0.3, 0.1), fake("kl_scaling=log", 1, 0.3, 0.9)]

    def reward_bar_ends(frontier: Frontier) -> list[float]:
        write_frontiers_plot([(runs, frontier, PLOT_TITLE)], str(tmp_path / "frontier.png"))
        (axes,) = figures.pop().axes
        ends = [y for collection in axes.collections for segment in collection.get_segments() for _, y in segment]
        assert ends, "the picture has no error bars"
        return ends

    unbounded = reward_bar_ends(FRONTIER)  # the control: the same picture without a range
    assert min(unbounded) < -4 and max(unbounded) > 5
    stated = dataclasses.replace(FRONTIER, y_range=(0.0, 1.1))
    bounded = reward_bar_ends(stated)
    assert min(bounded) == pytest.approx(0.0) and max(bounded) == pytest.approx(1.1)
    caption = line_section(runs, stated, "frontier.png")
    assert "a bar of reward (last quarter) cut where it leaves the values it can take, 0 to 1.1)" in caption
    assert "cut where it leaves" not in line_section(runs, FRONTIER, "frontier.png")


# --- the start's point on the line ----------------------------------------------------------------------------------


def started(variant: str, seed: int, kl: float, early: float, late: float, accuracy: float = 0.0) -> VariantRun:
    """A run of 8 steps whose first 2 earn `early` and the rest `late` (its reward of the last quarter), with held-out
    KL `kl`, accuracy 0.5 at step 0 and `accuracy` at the end, and its accuracy reward `late` − 0.5 (0 at least)."""
    history = [
        {"step": step, "reward": early if step <= 2 else late, "rewards/accuracy_reward/mean": max(0.0, late - 0.5),
         "completions/mean_length": 40.0}
        for step in range(1, 9)
    ]  # fmt: skip
    retention = [{"step": 0, "retention/loglik": -2.0, "retention/kl_to_start": 0.0},
                 {"step": 8, "retention/loglik": -2.1, "retention/kl_to_start": kl}]  # fmt: skip
    evaluations = [{"step": 0, "val_accuracy": 0.5}, {"step": 8, "val_accuracy": accuracy}]
    return VariantRun(f"{variant}, seed={seed}", {"seed": seed}, history, evaluations, 1.0, retention=retention)


def started_runs() -> list[VariantRun]:
    """Every seed's line: (0.1, 0.6), (0.4, 0.8), (1.6, 1.0) for β = 0.2, 0.05, 0, each run earning 0.2 + 0.1·k at
    its first 2 steps (k = 0, 1, 2 in the line's order): the start's reward is their mean, 0.3. `BELOW` drifts 0.05,
    less than every constant β, and earns 0.5 + 0.01·s."""
    runs = []
    for seed in range(4):
        for k, (variant, (kl, late)) in enumerate(zip(LINE[::-1], [(0.1, 0.6), (0.4, 0.8), (1.6, 1.0)])):
            runs.append(started(variant, seed, kl, 0.2 + 0.1 * k, late, accuracy=0.2))
        runs.append(started(BELOW, seed, 0.05, 0.3, 0.5 + 0.01 * seed, accuracy=0.3))
    return runs


def test_the_start_on_the_line_reads_a_method_that_drifted_least_against_a_line_falling_to_the_start():
    """Held flat, the line reads 0.6 at drift 0.05 (D = −0.1 + 0.01·s, outside the measured drifts); with the start's
    point (0, 0.3) it reads 0.45, halfway to β = 0.2's point (D = +0.05 + 0.01·s, inside). The secondaries read the
    start's values too: Δ retention 0, the step-0 accuracy 0.5."""
    flat = Frontier(line=LINE, secondary=("delta_retention", "final_accuracy"))
    with_start = dataclasses.replace(flat, start_steps=2)
    (held,) = read_methods(started_runs(), flat)
    assert held.above.values == pytest.approx([-0.1, -0.09, -0.08, -0.07]) and held.outside == [0, 1, 2, 3]
    (reading,) = read_methods(started_runs(), with_start)
    assert reading.above.values == pytest.approx([0.05, 0.06, 0.07, 0.08]) and reading.outside == []
    # Δ retention −0.1 everywhere on the line, 0 at the start: −0.05 at drift 0.05, so the method's −0.1 is −0.05.
    assert reading.secondary["delta_retention"].values == pytest.approx([-0.05] * 4)
    # Accuracy 0.2 on the line, 0.5 at the start: 0.35 at drift 0.05, the method's 0.3 is −0.05 below it.
    assert reading.secondary["final_accuracy"].values == pytest.approx([-0.05] * 4)
    # The mirror: 0.5 is reached at drift 0.0667 on the line through the start (0.3 + 0.3·x/0.1).
    assert reading.mirror.values[0] == pytest.approx(0.05 - 0.2 / 3)
    assert read_methods(started_runs(), with_start, with_start=False)[0].above.values == held.above.values


def test_a_start_added_after_the_runs_is_a_correction_beside_the_stated_endpoint():
    stated = Frontier(line=LINE, start_steps=2)
    text = frontier_sections(started_runs(), stated)
    assert "## Correction" not in text and "through the start's point (drift 0, the mean reward" in text
    assert "| start | 4 | 0.0000 ± 0.0000 | 0.300 ± 0.000 |" in text
    corrected = frontier_sections(started_runs(), dataclasses.replace(stated, start_added_after_runs=True))
    primary, correction = corrected.split("## Correction: D with the start's point on the line")
    assert "| -0.085 ± " in primary and "| 0, 1, 2, 3 |" in primary  # held flat: below, every seed outside
    assert "| +0.065 ± " in correction and "| none |" in correction
    assert "added after the runs, as a correction" in primary


def test_the_seeds_that_learned_are_counted_per_arm_with_an_exact_interval():
    """`BELOW`'s accuracy reward is 0.5 + 0.01·s − 0.5 = 0.01·s: none of 4 seeds reaches 0.3; β = 0's (1.0 − 0.5 =
    0.5) all do."""
    frontier = Frontier(line=LINE, start_steps=2, learned=("rewards/accuracy_reward/mean", 0.3))
    text = frontier_sections(started_runs(), frontier)
    assert "## Seeds that learned" in text
    assert f"| {LINE[0]} | 0.500 (0), 0.500 (1), 0.500 (2), 0.500 (3) | 4 of 4 | [0.40, 1.00] |" in text
    assert f"| {BELOW} | 0.000 (0), 0.010 (1), 0.020 (2), 0.030 (3) | 0 of 4 | [0.00, 0.60] |" in text
    assert "## Seeds that learned" not in frontier_sections(started_runs(), Frontier(line=LINE))


def test_a_target_kl_controller_is_read_against_its_target_its_ceiling_and_the_line():
    """A controller at target 0.1 whose last-quarter KL is 0.08 (ratio 0.8), whose β peaked at 0.2 and which held β
    after steps 2, 3 and 5, whose KL was 0.3 (3× the target; 0.8× on the others); its reward 0.5 at drift 0.05 is
    0.5 / 0.45 of the line there (with the start's point, as above)."""
    controller = "beta=0.2, kl_controller=stepwise, target_kl=0.1"
    runs = [run for run in started_runs() if group_name(run) != BELOW]
    held_by_step = [0.0, 1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0]  # the running count: it rises at steps 2, 3 and 5
    for seed in range(4):
        run = started(controller, seed, 0.05, 0.3, 0.5)
        for step, entry in enumerate(run.history, 1):
            entry.update({"adaptive_kl/raw_kl": 0.3 if step in (2, 3, 5) else 0.08,
                          "adaptive_kl/current_beta": 0.2 if step == 4 else 0.1,
                          "adaptive_kl/held_updates": held_by_step[step - 1]})  # fmt: skip
        runs.append(run)
    text = frontier_sections(runs, Frontier(line=LINE, start_steps=2))
    section = text.split("## What the target-KL controllers did")[1]
    row = next(line for line in section.splitlines() if line.startswith(f"| {controller} |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1:] == ["4", "0.80 (0), 0.80 (1), 0.80 (2), 0.80 (3)", "0.80 ± 0.00", "0.2 ± 0 (largest 0.2)",
                         "0.500 ± 0.000", f"{0.5 / 0.45:.2f}", "3.0 ± 0.0",
                         "3.00 ± 0.00; 0.80 ± 0.00 (paired: +2.20 ± 0.00)"]  # fmt: skip
    assert "## What the target-KL controllers did" not in frontier_sections(started_runs(), Frontier(line=LINE))


def test_a_drift_controller_is_read_against_its_target_and_the_spread_of_the_nearest_constant_beta():
    """A drift controller at target 0.5 whose seeds end at drift 0.45, 0.5, 0.55 and 0.7 (ratios 0.9, 1.0, 1.1, 1.4:
    3 of 4 within ±20%), its β last 0.05 and at most 0.4; the line's β = 0.05 (the nearest constant β to its mean
    drift, 0.55) drifts 0.3, 0.4, 0.45 and 0.45: the ratio of the two SDs with its interval from F(3, 3)'s tabulated
    97.5% point, and 3 of its 4 seeds within ±20% of its mean 0.4 (0.3 is 0.75 of it); a line with no spread gives no
    ratio, and all 4 seeds on its mean. Each run's measurements (after steps 4 and 8) and β there."""
    controller = "beta=0.1, kl_controller=drift, beta_max=1, target_drift=0.5"
    runs = started_runs()
    line_drifts = (0.3, 0.4, 0.45, 0.45)
    for run in runs:
        if run.name.startswith(f"{LINE[1]}, seed="):
            run.retention[-1]["retention/kl_to_start"] = line_drifts[run.config["seed"]]
    for seed, drift in enumerate((0.45, 0.5, 0.55, 0.7)):
        run = started(controller, seed, drift, 0.3, 0.7)
        for step, entry in enumerate(run.history, 1):
            entry["adaptive_kl/current_beta"] = 0.4 if step == 3 else 0.05
            if step % 4 == 0:  # measured after steps 4 and 8
                entry["adaptive_kl/drift"] = drift * step / 8
        runs.append(run)
    section = frontier_sections(runs, Frontier(line=LINE)).split("## Where the drift controllers landed")[1]
    row = next(line for line in section.splitlines() if line.startswith(f"| {controller} | 4 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    ratios = [0.9, 1.0, 1.1, 1.4]
    t = 3.182446305284263  # t_{0.975,3}: the half-width is t · s / √4
    half = t * statistics.stdev(ratios) / 2
    sd, line_sd = statistics.stdev([0.45, 0.5, 0.55, 0.7]), statistics.stdev(line_drifts)
    f_975 = 15.439  # F_{0.975}(3, 3), tabulated; F_{0.025}(3, 3) is its inverse
    assert cells[2:] == [
        f"0.5500 ± {t * sd / 2:.4f}",
        f"1.10 ± {half:.2f}",
        "3 of 4",
        f"{sd:.4f} ({sd / 0.55:.2f})",
        f"{LINE[1]}: 0.4000 ± {t * line_sd / 2:.4f}, {line_sd:.4f} ({line_sd / 0.4:.2f})",
        f"{sd / line_sd:.2f} [{sd / line_sd / f_975**0.5:.2f}, {sd / line_sd * f_975**0.5:.2f}]",
        "3 of 4",
    ]
    run_rows = [line for line in section.splitlines() if line.startswith(f"| {controller} | ") and "| 4 |" not in line]
    assert [row.split(" | ")[1:] for row in run_rows[:4]] == [
        [str(seed), "0.5", f"{drift:.4f}", f"{drift / 0.5:.2f}", within, "0.05", "0.4 |"]
        for seed, drift, within in ((0, 0.45, "yes"), (1, 0.5, "yes"), (2, 0.55, "yes"), (3, 0.7, "no"))
    ]
    # What each run measured, and the β it trained with at those steps.
    assert [row.split(" | ")[1:] for row in run_rows[4:]] == [
        [str(seed), "4, 8", f"{drift / 2:.2f} {drift:.2f}", "0.05 0.05 |"]
        for seed, drift in enumerate((0.45, 0.5, 0.55, 0.7))
    ]
    for run in runs:
        if run.name.startswith(f"{LINE[1]}, seed="):
            run.retention[-1]["retention/kl_to_start"] = 0.4
    section = frontier_sections(runs, Frontier(line=LINE)).split("## Where the drift controllers landed")[1]
    row = next(line for line in section.splitlines() if line.startswith(f"| {controller} | 4 |"))
    assert [cell.strip() for cell in row.strip("|").split("|")[-2:]] == ["—", "4 of 4"]
    assert "## Where the drift controllers landed" not in frontier_sections(started_runs(), Frontier(line=LINE))
