"""`benchmarks/gpu_check.sh`, the one device call a GPU session gets, known to work before a GPU runs it.

The runner (streaming, budget, selection, fail-soft) is tested here on stand-in checks; the script's whole path runs
dry on the CPU (Unsloth's generated trainer, LoRA, parity for every loss type, training, the TRL process), with a
check made to fail on purpose: the KL term dropped, or scaled by 1.01. Timings are reported, never asserted. The dry
runs need Unsloth (CI's TRL 1.15 environment); elsewhere they skip."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import statistics
import subprocess
import sys
from types import SimpleNamespace

import pytest
from repo_paths import REPO


needs_unsloth = pytest.mark.skipif(
    importlib.util.find_spec("unsloth") is None or importlib.util.find_spec("unsloth_zoo") is None,
    reason="unsloth is not installed (CI installs it in its TRL 1.15 environment: see .ci/run)",
)
SCRIPT = os.path.join(REPO, "benchmarks", "gpu_check.sh")
NO_BUDGET = "1e9"  # seconds: every selected check starts, however slow the machine
LINE = re.compile(r"^\[gpu-check\] (\S+): (PASS|FAIL|SKIP)\b(.*)$")


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", os.path.join(REPO, "benchmarks", "gpu_check.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules["gpu_check"]


# --- the runner, on stand-in checks ---------------------------------------------------------------------------------


class Clock:
    """A clock that each stand-in check advances by its own duration."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def stand_in_checks(gpu_check, clock, report):
    def passes(opts):
        clock.now += 10
        return gpu_check.Outcome("PASS", "fine")

    def reads_the_report(opts):  # the earlier check's verdict is already in the report: streamed, not kept back
        clock.now += 10
        seen = "first: PASS fine" in report.read_text()
        return gpu_check.Outcome("PASS" if seen else "FAIL", f"saw the first: {seen}")

    def raises(opts):
        clock.now += 10
        raise RuntimeError("a kernel broke")

    def never_reached(opts):
        raise AssertionError("started after the budget")

    return {"first": passes, "second": reads_the_report, "third": raises, "fourth": passes, "fifth": never_reached}


def test_checks_stream_fail_soft_and_stop_starting_at_the_budget(gpu_check, tmp_path, capsys):
    """One line per check as it ends, appended to the report at once; an exception is that check's FAIL; no check
    starts once the budget is spent (30 s here: the fourth starts at 30 s), and the verdict names what to rerun."""
    clock, report = Clock(), tmp_path / "report.md"
    opts = SimpleNamespace(budget=30.0, only=[], skip=[])
    outcomes = gpu_check.run_checks(stand_in_checks(gpu_check, clock, report), opts, str(report), clock=clock)
    assert {name: o.status for name, o in outcomes.items()} == {
        "first": "PASS", "second": "PASS", "third": "FAIL", "fourth": "SKIP", "fifth": "SKIP",
    }  # fmt: skip
    lines = [LINE.match(line) for line in capsys.readouterr().out.splitlines() if line.startswith("[gpu-check]")]
    assert [m.group(1) for m in lines if m] == ["first", "second", "third", "fourth", "fifth", "verdict"]
    assert "RuntimeError: a kernel broke" in outcomes["third"].summary
    assert "a kernel broke" in "\n".join(outcomes["third"].lines)  # the traceback's tail, in the report
    assert "budget: 30 s of --budget 30 s spent" in outcomes["fourth"].summary
    text = report.read_text()
    assert "### verdict: FAIL (2 passed, 1 failed, 2 skipped" in text
    assert "run them with `--only fourth,fifth`" in text


def test_the_budget_counts_from_the_script_start_not_from_the_first_check(gpu_check, tmp_path):
    """Setup before the first check (imports, preflight, the model's save: ~50 s on the H100) is spent budget: with
    25 s of it before a 30 s budget, only the first check (10 s) starts."""
    clock, report = Clock(), tmp_path / "report.md"
    opts = SimpleNamespace(budget=30.0, only=[], skip=[])
    clock.now = 25.0
    outcomes = gpu_check.run_checks(stand_in_checks(gpu_check, clock, report), opts, None, clock=clock, started=0.0)
    assert [name for name, o in outcomes.items() if o.status != "SKIP"] == ["first"]
    assert "budget: 35 s of --budget 30 s spent" in outcomes["second"].summary
    clock.now = 40.0  # setup alone past the budget: the first check still runs, so a call always gives a verdict
    outcomes = gpu_check.run_checks(stand_in_checks(gpu_check, clock, report), opts, None, clock=clock, started=0.0)
    assert [name for name, o in outcomes.items() if o.status != "SKIP"] == ["first"]


def test_only_and_skip_select_by_name_or_prefix(gpu_check, tmp_path):
    clock = Clock()
    checks = {"parity-grpo": None, "parity-dapo": None, "train-none": None, "cost": None}
    ran = []
    for name in checks:
        checks[name] = lambda opts, name=name: ran.append(name) or gpu_check.Outcome("PASS")
    opts = SimpleNamespace(budget=100.0, only=["parity", "cost"], skip=["parity-dapo"])
    outcomes = gpu_check.run_checks(checks, opts, None, clock=clock)
    assert ran == ["parity-grpo", "cost"]
    assert outcomes["train-none"].summary == outcomes["parity-dapo"].summary == "not selected (--only/--skip)"
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--only", "parity-nonsense"])


def test_the_cost_ratios_leave_the_warm_up_run_out(gpu_check):
    """On an H200 the first TRL build in a process read 1229 MiB above its baseline and every later one 153 MiB, so a
    ratio against that first run read 0.12 for ours: the warm-up row is shown, and enters neither ratio nor A/A."""

    def run(step_time, peak_mib, times):
        return {"step_time": step_time, "times": times, "peak_mib": peak_mib, "finite": True}

    runs = [(gpu_check.WARM_UP, run(9.0, 1229.0, [9.0, 9.0])), ("stock", run(2.0, 150.0, [2.0, 2.0])),
            ("ours (1)", run(3.0, 160.0, [3.0, 3.0])), ("stock", run(2.5, 153.0, [2.5, 2.5])),
            ("ours (2)", run(2.0, 158.0, [2.0, 2.0]))]  # fmt: skip
    lines, summary = gpu_check.cost_lines(runs, "stock")
    # ours' median step (2.5) / stock's (2.25); A/A = 2.5 / 2.0; memory: max ours 160 / max stock 153; A/A 153 / 150.
    # Paired steps (the warm-up's left out): ours/stock 3/2 twice and 2/2.5 twice; A/A 2.5/2 twice.
    logs = [math.log(1.5)] * 2 + [math.log(0.8)] * 2
    mean, half = statistics.fmean(logs), 3.182446 * statistics.stdev(logs) / 2  # t_{0.975,3}, n = 4
    paired = f"{math.exp(mean):.4f} (95% {math.exp(mean - half):.4f}–{math.exp(mean + half):.4f}, n=4)"
    aa = f"{1.25:.4f} (95% {1.25:.4f}–{1.25:.4f}, n=2)"  # two equal ratios: no spread
    assert summary == (
        f"ours/stock step time 1.111, paired steps {paired} (A/A 1.250, {aa}), peak memory 1.0458 (A/A 1.0200)"
    )
    assert lines[2].startswith(f"| {gpu_check.WARM_UP} | 9.0000 | 4.500 | 1229 | 8.1933 |")
    assert len(lines) == 2 + len(runs)


def test_kl_contribution_difference_sees_a_one_percent_change(gpu_check):
    """Relative to the KL's own contribution, not to the loss: 1.01 × the KL term is 1e-2 whatever its share."""
    import torch

    policy, kl = torch.tensor([2.0, -1.0], dtype=torch.float64), torch.tensor([1e-3, 2e-3], dtype=torch.float64)
    assert gpu_check.kl_contribution_difference(policy + 1.01 * kl, policy + kl, policy) == pytest.approx(1e-2)
    assert gpu_check.kl_contribution_difference(policy, policy + kl, policy) == pytest.approx(1.0)
    assert gpu_check.kl_contribution_difference(policy, policy, policy) == 0.0  # no KL gradient, none expected


def run_script(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, str, list[re.Match]]:
    output = tmp_path / "gpu-check.md"
    result = subprocess.run(
        ["bash", SCRIPT, *args, "--output", str(output)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=900,
    )
    lines = [LINE.match(line) for line in result.stdout.splitlines() if LINE.match(line)]
    return result, output.read_text() if output.exists() else "", lines


def test_a_failed_preflight_stops_with_its_reason(tmp_path):
    """Without `--dry-run` on a machine without a GPU (or without Unsloth): the reason, and exit status 2."""
    result, report, _ = run_script(tmp_path, "--only", "parity-dapo")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "[gpu-check] preflight: FAIL" in result.stdout and "preflight: FAIL" in report


def test_the_wheels_are_installed_only_when_asked(tmp_path):
    """A `.whl/` in the checkout is left alone unless `--wheels` is given (a test run next to a GPU session's wheels
    uses its own environment); `--wheels` with no wheel is refused, naming the command that builds them."""
    import shutil

    (tmp_path / "benchmarks").mkdir()
    shutil.copy(SCRIPT, tmp_path / "benchmarks" / "gpu_check.sh")
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "broken-0.0-py3-none-any.whl").write_text("not a wheel")
    script = str(tmp_path / "benchmarks" / "gpu_check.sh")
    env = {**os.environ, "PYTHON": sys.executable}
    plain = subprocess.run(["bash", script, "--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    assert "benchmarks/gpu_check.py" in plain.stderr and "not a wheel" not in plain.stderr.lower()  # no pip ran
    asked = subprocess.run(["bash", script, "--wheels", "--dry-run"], capture_output=True, text=True, env=env,
                           timeout=300)  # fmt: skip
    assert asked.returncode != 0 and "broken-0.0-py3-none-any.whl" in asked.stderr  # pip tried it
    (tmp_path / ".whl" / "broken-0.0-py3-none-any.whl").unlink()
    empty = subprocess.run(["bash", script, "--wheels"], capture_output=True, text=True, env=env, timeout=300)
    assert empty.returncode == 2 and ".whl/ has no wheels (run bash ../shared/gpu/wheelhouse.sh)" in empty.stderr


# --- the whole script, dry, on Unsloth's generated trainer -----------------------------------------------------------


@needs_unsloth
def test_the_gpu_check_runs_dry_on_the_cpu(tmp_path, gpu_check):
    """Every check, in float32 (where the old LoRA-gradient criterion failed on rounding), cost-trl included."""
    # No budget cut (the default 480 s is the GPU call's): on a loaded CPU the dry run passes it, and the checks after
    # it would be SKIPs; the budget's cut is tested on its own below, with 1 s
    result, report, lines = run_script(tmp_path, "--dry-run", "--skip=", "--budget", NO_BUDGET)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "- device: CPU" in report and "DRY RUN on a CPU: tiny model, float32" in report
    verdicts = {m.group(1): m.group(2) for m in lines}
    assert verdicts.pop("verdict") == "PASS"
    assert list(verdicts) == list(gpu_check.CHECKS)  # one line per check, in order
    gpu_only = {"parity-long", "4bit"}
    assert {name for name, status in verdicts.items() if status != "PASS"} == gpu_only
    assert all(f"### {name}: SKIP GPU only" in report for name in gpu_only)
    assert "Unsloth's scorer paths:" in report and "### verdict: PASS" in report
    # The criterion and the control, with their numbers, in every parity section.
    assert report.count("| gradient on the per-token log-probabilities") == len(gpu_check.LOSS_TYPES)
    assert report.count("| control: stock with β·(1 + 2^-20) against stock") == len(gpu_check.LOSS_TYPES)


def test_the_default_call_leaves_cost_trl_to_the_second(gpu_check):
    assert gpu_check.parse_args(["--dry-run"]).skip == ["cost-trl"]
    assert gpu_check.parse_args(["--dry-run", "--only", "cost-trl"]).skip == []
    assert gpu_check.parse_args(["--dry-run", "--skip="]).skip == []
    names = list(gpu_check.CHECKS)  # the priority under a budget cut: parity, one training check, then the cost
    first = len(gpu_check.LOSS_TYPES)
    assert names[first : first + 6] == ["train-none", "cost-loss", "rloo", "zero-beta", "notebook", "cost"]


@needs_unsloth
def test_parity_passes_dry_in_float64(tmp_path, gpu_check):
    result, report, lines = run_script(
        tmp_path, "--dry-run", "--dtype", "float64", "--only", "parity", "--budget", NO_BUDGET
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    verdicts = {m.group(1): m.group(2) for m in lines}
    assert all(verdicts[f"parity-{loss_type}"] == "PASS" for loss_type in gpu_check.LOSS_TYPES), verdicts
    assert verdicts["verdict"] == "PASS" and "tiny model, float64" in report


@needs_unsloth
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("perturbation", ["scale", "drop"])
def test_parity_fails_when_the_kl_term_is_scaled_or_dropped(tmp_path, perturbation, dtype):
    """Ours' KL term × 1.01 (or × 0) fails parity in either dtype, and the call exits 1; with a 1 s budget the next
    check is not started, and says so."""
    result, report, lines = run_script(
        tmp_path, "--dry-run", "--dtype", dtype, "--perturb-kl", perturbation, "--only", "parity-dapo,train-none",
        "--budget", "1",
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-5000:]
    verdicts = {m.group(1): (m.group(2), m.group(3)) for m in lines}
    assert verdicts["parity-dapo"][0] == "FAIL"
    # The log-probability criterion sees it: ×1.01 is 1e-2 of the KL contribution, a dropped term all of it.
    seen = float(re.search(r"log-prob gradients (\S+) ", verdicts["parity-dapo"][1]).group(1))
    assert seen == pytest.approx(1e-2 if perturbation == "scale" else 1.0, rel=1e-2)
    assert verdicts["train-none"][0] == "SKIP" and "budget" in verdicts["train-none"][1]
    assert "### verdict: FAIL (0 passed, 1 failed" in report
