"""The benchmark scripts run and report every variant (a smoke test: no timing is asserted)."""

from __future__ import annotations

import json
import math
import os
import re
import sys

import pytest
import torch
from tiny import run_python


BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")

# Each smoke run: `python benchmarks/<script> <arguments>`, its report written to `<name>.md`.
RUNS = {
    "step": ("step_overhead.py", "--steps", "2", "--warmup", "1", "--rounds", "2", "--batch", "4", "--num-generations",
             "4", "--completion-length", "4", "--methods", "none,clip", "--scalings", "none,sqrt"),
    "loss": ("loss_cost.py", "--reps", "4", "--warmup", "1", "--prompts", "2", "--num-generations", "4",
             "--completion-length", "6"),
    "forward": ("loss_cost.py", "--forward-only", "--reps", "2", "--warmup", "1", "--memory-reps", "2", "--prompts",
                "2", "--num-generations", "4", "--completion-length", "6"),
    "ops": ("loss_cost.py", "--count-ops", "--prompts", "2", "--num-generations", "4", "--completion-length", "6"),
    "reference": ("reference_cost.py", "--steps", "3", "--warmup", "1", "--rounds", "1", "--batch", "4",
                  "--num-generations", "4", "--completion-length", "4", "--reset-steps", "2"),
    "zero-beta": ("zero_beta_cost.py", "--lora", "--steps", "5", "--switch-step", "3", "--warmup", "1", "--rounds",
                  "1", "--batch", "4", "--num-generations", "4", "--completion-length", "4"),
    "term": ("kl_term.py", "--shape", "tiny", "--batch", "2", "--lengths", "4,16", "--min-run-time", "0.01"),
    "drift": ("drift_cost.py", "--lora", "--steps", "3", "--warmup", "1", "--rounds", "1", "--batch", "4",
              "--num-generations", "4", "--completion-length", "4", "--drift-samples", "3"),
    "soak": ("soak.py", "--steps", "3", "--warmup", "1", "--methods", "none,dynamic", "--max-growth", "inf"),
}  # fmt: skip

# Runs each script as `python <script>` runs it (`__main__`, the benchmarks' folder first on the path), one after the
# other in one interpreter: the imports of torch, Transformers and TRL (most of a smoke run's time) are paid once. A
# later script's memory numbers include what the earlier ones left in the process; the tests read only their sign.
RUN_EACH = """
import json, runpy, sys, traceback
benchmarks, runs = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, benchmarks)
for name, (script, *args) in runs.items():
    sys.argv = [script, *args]
    try:
        runpy.run_path(f"{benchmarks}/{script}", run_name="__main__")
        code = 0
    except SystemExit as stopped:
        code = stopped.code or 0
    except Exception:
        traceback.print_exc()
        code = 1
    print(f"{name}: exit {code}", flush=True)
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """`report(name)`: the text of that run's report, once its script exited 0 (all ran in one process, once)."""
    out = tmp_path_factory.mktemp("benchmarks")
    runs = {name: (*arguments, "--output", str(out / f"{name}.md")) for name, arguments in RUNS.items()}
    result = run_python("-c", RUN_EACH, BENCHMARKS, json.dumps(runs), check=False)

    def read(name: str) -> str:
        assert f"{name}: exit 0" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
        return (out / f"{name}.md").read_text()

    return read


def _rows(markdown: str) -> dict[str, list[str]]:
    """Table rows of a markdown text, keyed by their first cell (header and rule left out)."""
    rows = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and not set(cells[0]) <= set("-") and cells[0] not in ("variant", "B × T"):
            rows.setdefault(cells[0], []).append(cells)
    return rows


def _positive(cell: str) -> float:
    value = float(re.sub(r"[*%]", "", cell))
    assert math.isfinite(value) and value > 0, cell
    return value


def test_step_overhead_reports_every_variant(report):
    text = report("step")
    assert "- device: CPU" in text and "trl " in text
    rows = _rows(text)
    assert list(rows) == ["stock", "stock, again", "none", "clip", "none, kl_scaling=sqrt"]
    for (cells,) in rows.values():
        _positive(cells[2]), _positive(cells[6])  # time and memory ratios
        assert re.fullmatch(r"\d\.\d{3} \(\d+\.\d{3}–\d+\.\d{3}, n=2\)", cells[4]), cells[4]  # 1 step x 2 rounds
        assert _positive(cells[8]) == 4.0  # tokens per completion: forced to full length
    assert _positive(rows["stock"][0][2]) == 1.0


def test_loss_cost_reports_ours_and_the_a_a_with_their_intervals(report):
    text = report("loss")
    assert "- device: CPU" in text and "4 repetitions after 1" in text
    rows = {name: cells for name, (cells,) in _rows(text).items() if name != "against stock"}
    assert list(rows) == ["ours (defaults)", "ours (adapting β)", "ours (own term)", "stock, again"]
    for cells in rows.values():
        assert cells[1] == "4"
        ratio, (low, high) = _positive(cells[2]), map(float, cells[3].split("–"))
        assert low <= ratio <= high and _positive(cells[4]) == pytest.approx(100 * (high - low) / 2, abs=0.01)
        assert re.fullmatch(r"[+-]\d+\.\d ± \d+\.\d", cells[7]), cells[7]


def test_loss_cost_forward_only_times_the_loss_without_its_backward(report):
    """`--forward-only`: the pass is the trainer's loss alone (no gradient reaches the model); the report says so."""
    sys.path.insert(0, BENCHMARKS)
    from loss_cost import forward_and_backward, forward_only

    class Trainer:  # what the two passes call: `compute_loss(model, inputs)`
        model = torch.nn.Linear(2, 1)

        def compute_loss(self, model, inputs):
            return model(inputs["x"]).sum()

    trainer, inputs = Trainer(), {"x": torch.ones(3, 2)}
    forward_only(trainer, inputs)
    assert trainer.model.weight.grad is None
    forward_and_backward(trainer, inputs)
    assert torch.equal(trainer.model.weight.grad, torch.full((1, 2), 3.0))

    text = report("forward")
    assert "loss forward alone, a log line after every 10" in text and "2 repetitions after 1" in text


def test_at_the_defaults_every_operation_ours_adds_is_the_packages_own(report):
    """`loss_cost.py --count-ops`: stock and the A/A run the same tensor operations; ours at the defaults runs stock's
    (the host's loss with its own KL term, untouched) and, beyond them, exactly those the package's code issues (the
    KL's measure: its estimate and per-sequence sums). A change that made the host's own computation differ would break
    the equality. On TRL 1.15 on a CPU every row also runs the package's stand-in for TRL's GPU-only scorer
    (`trainers/scorer.py`), stock's too."""
    rows = {name: cells for name, (cells,) in _rows(report("ops")).items()}
    assert list(rows) == ["stock", "stock, again", "ours (defaults)", "ours (adapting β)", "ours (own term)"]
    stock, again, ours = rows["stock"], rows["stock, again"], rows["ours (defaults)"]
    assert again[1:] == stock[1:] and stock[2] == "+0", (stock, again)
    assert all(name.startswith("`trainers/scorer.py:") for name in stock[4].split(", ") if stock[3] != "0"), stock
    assert int(ours[2]) == int(ours[3]) - int(stock[3]) > 0, (ours, stock)
    # per micro-batch only the KL's measure, exactly these operations (docs/performance.md: 16 beyond stock's, a log
    # line 14): the log-ratio, the estimate and the importance ratio (10), the per-sequence sums (4), and the trainer's
    # detach of the log-probabilities and cast of the mask (2); an adaptation of β alone runs the same (the host's
    # own term, at β_t)
    own = [name for name in ours[4].split(", ") if not name.startswith("`trainers/scorer.py:")]  # TRL 1.15: scorer
    assert own == [
        "`kl/estimators.py:masked_log_ratio` 4", "`kl/metrics.py:kl_sequence_sums` 4",
        "`kl/estimators.py:kl_estimate` 3", "`trainers/grpo.py:_loss_and_kl_sums` 2",
        "`kl/estimators.py:importance_ratio` 2", "`kl/estimators.py:estimate_and_transform` 1",
    ], own  # fmt: skip
    assert ours[2] == "+16" and ours[5] == "+14", ours
    assert rows["ours (adapting β)"][1:5] == ours[1:5], rows
    assert stock[5] == again[5] == "+0", (stock, again, ours)  # the metrics: at the log line
    # its own term, in the micro-batch: the formula sheet's aggregation as the host's loss, which the defaults skip
    assert "`kl/aggregation.py:aggregate_like_host`" in rows["ours (own term)"][4], rows
    assert "`kl/aggregation.py:aggregate_like_host`" not in ours[4], ours


def test_the_ratio_interval_is_students_on_the_log_ratios():
    """Paired ratios 1.1, 1.0 and 0.9 over 3 repetitions: the geometric mean, and exp(mean ± t_{0.975,2}·s/√3) of
    their logs."""
    import statistics

    sys.path.insert(0, BENCHMARKS)
    from loss_cost import ratio_interval

    ratio, low, high, n = ratio_interval([1.1, 1.0, 0.9], [1.0, 1.0, 1.0])
    logs = [math.log(1.1), 0.0, math.log(0.9)]
    half = 4.302653 * statistics.stdev(logs) / math.sqrt(3)
    assert n == 3 and ratio == pytest.approx(math.exp(statistics.fmean(logs)))
    assert (low, high) == pytest.approx(
        (math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half))
    )


def test_reference_cost_reports_every_variant_against_its_baseline(report):
    text = report("reference")
    rows = _rows(text)
    ours = [
        "full, β > 0, ours",
        "full, β > 0, ours, ref_reset_steps=2",
        "LoRA, β > 0, ours",
        "LoRA, β > 0, ours, ref_reset_steps=2 ('ref' adapter)",
    ]
    stock = ["full, β > 0, stock (reference copy)", "LoRA, β > 0, stock (adapter disabled)"]
    baselines = ["full, β = 0, stock", "LoRA, β = 0, stock"]
    assert set(rows) == {*ours, *stock, *baselines, "full, β = 0, stock, again"}
    for label in [*ours, *stock]:  # in both tables: against β = 0, and ours against stock at the same β
        assert len(rows[label]) == 2, label
    for label in stock:
        assert _positive(rows[label][1][2]) == 1.0 and _positive(rows[label][1][6]) == 1.0
    for label in baselines:
        assert len(rows[label]) == 1 and _positive(rows[label][0][2]) == 1.0 and _positive(rows[label][0][6]) == 1.0
    for cells_list in rows.values():
        for cells in cells_list:
            _positive(cells[2]), _positive(cells[6])
            assert _positive(cells[8]) == 4.0


def test_zero_beta_cost_reports_both_phases_and_the_memory(report):
    """Before the switch ours against stock at β > 0, from it against stock at β = 0, an A/A row, and the memory of
    a full-model run before and after its reference is freed."""
    rows = _rows(report("zero-beta"))
    skip, no_skip = "ours, dynamic → β = 0, reference skipped", "ours, dynamic → β = 0, skip disabled"
    before, after = rows["before the switch (steps 2–2)"], rows["from the switch (steps 3–5)"]
    assert [(cells[1], cells[3]) for cells in before] == [(skip, "stock, β > 0"), (no_skip, "stock, β > 0")]
    assert [(cells[1], cells[3]) for cells in after] == [
        (skip, "stock, β = 0"),
        (no_skip, "stock, β = 0"),
        ("stock, β > 0", "stock, β = 0"),
    ]
    assert [cells[1] for cells in rows["every step (A/A: the noise)"]] == ["stock, β = 0, again"]
    for cells in before + after:
        _positive(cells[2]), _positive(cells[4])
    assert len(rows[skip]) == 1 and len(rows["stock, β = 0"]) == 1  # the memory table: one row each
    for cells in (rows[skip][0], rows["stock, β = 0"][0]):
        _positive(cells[1]), _positive(cells[2])


def test_drift_cost_reports_each_variant_against_beta_held(report):
    """The drift controller at its defaults and measuring every step, and the A/A row, each a ratio to ours with β
    held."""
    rows = _rows(report("drift"))
    assert set(rows) == {
        "ours, β held (kl_controller='fixed')",
        "ours, β held, again",
        "drift, every 5 steps, 3 texts",
        "drift, every step, 3 texts",
    }
    assert _positive(rows["ours, β held (kl_controller='fixed')"][0][2]) == 1.0
    for (cells,) in rows.values():
        _positive(cells[2]), _positive(cells[6])
        assert _positive(cells[8]) == 4.0


def test_kl_term_micro_benchmark_reports_every_term(report):
    rows = _rows(report("term"))
    assert list(rows) == ["2 × 4", "2 × 16"]
    for cells_per_term in rows.values():
        terms = [cells[2] for cells in cells_per_term]
        assert terms == ["stock TRL k3 (inline)", "none", "clip", "sigmoid", "length_normalized"]
        for cells in cells_per_term:
            _positive(cells[1]), _positive(cells[3]), _positive(cells[5])


def test_soak_reports_every_method(report):
    rows = _rows(report("soak"))
    rows.pop("method")  # the header
    assert list(rows) == ["stock (beta=0)", "none", "dynamic"]
    for (cells,) in rows.values():
        assert cells[1] == "3"  # steps
        assert cells[2] == "0"  # non-finite values
        _positive(cells[4]), _positive(cells[5])  # memory after warm-up and at the end
        assert cells[8] == "yes"
    assert float(rows["stock (beta=0)"][0][3]) == 0.0 and float(rows["none"][0][3]) == 0.1  # final β
