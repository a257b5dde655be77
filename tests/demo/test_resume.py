"""`adaptive-kl compare --save-every N --resume`: a comparison killed mid-run and resumed reports what the same
command uninterrupted reports, and a checkpoint it cannot resume from is refused before any run starts.

The killed run is a separate process (`tests/compare_worker.py`) that saves a checkpoint every 3 steps and SIGKILLs
itself at the end of step 4, after the model update and before any report: what it leaves behind is checkpoint-3,
between two evaluations (at 2 and 4), so the resumed run must neither repeat nor lose one. The uninterrupted run saves
no checkpoint, so the comparison also shows that saving them changes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from repo_paths import TESTS

from adaptive_kl.console import main
from adaptive_kl.demo.run_files import load_runs


# An adaptive β (moved from each step's KL) so that only a restored controller gives the uninterrupted trajectory;
# 4 steps, evaluated (validation, retention, KL to the start) at 0, 2 and 4.
ARGV = ["compare", "--steps", "4", "--eval-every", "2", "--n-validation", "16", "--seed", "0", "--no-progress",
        "--variant", "kl_controller=adaptive target_kl=0.001 beta_max=0.2"]  # fmt: skip
# Wall-clock times: the only values a resumed run may differ in.
TIMES = ("step_time", "wall_time")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(uninterrupted run, killed run's directory, resumed run)."""
    root = tmp_path_factory.mktemp("resume")
    uninterrupted, killed = str(root / "uninterrupted"), str(root / "killed")
    assert main([*ARGV, "--out", uninterrupted]) == 0
    worker = subprocess.run(
        [sys.executable, os.path.join(TESTS, "compare_worker.py"), *ARGV, "--save-every", "3", "--out", killed],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "KILL_AT_STEP": "4"},
        timeout=600,
    )
    assert worker.returncode == -signal.SIGKILL, worker.stderr[-4000:]
    (variant_dir,) = os.listdir(os.path.join(killed, "runs"))
    left = sorted(name for name in os.listdir(os.path.join(killed, "runs", variant_dir)) if "checkpoint" in name)
    assert left == ["checkpoint-3"] and not os.path.exists(os.path.join(killed, "runs.json"))
    assert main([*ARGV, "--save-every", "3", "--resume", "--out", killed]) == 0
    (first,), (resumed,) = load_runs(uninterrupted), load_runs(killed)
    return first, killed, resumed


def without_times(entries: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if k not in TIMES} for entry in entries]


def test_a_resumed_run_logs_every_step_as_the_uninterrupted_one(runs):
    first, _, resumed = runs
    assert [entry["step"] for entry in resumed.history] == [1, 2, 3, 4]
    assert without_times(resumed.history) == without_times(first.history)  # losses, rewards, KL, β: exactly
    betas = [entry["adaptive_kl/current_beta"] for entry in first.history]
    assert len(set(betas)) == len(betas)  # β moved at every step: a controller restarted at `beta` would show


def test_a_resumed_run_keeps_what_was_recorded_before_the_checkpoint(runs):
    first, _, resumed = runs
    assert [e["step"] for e in resumed.evaluations] == [0, 2, 4] and resumed.evaluations == first.evaluations
    assert resumed.samples == first.samples  # greedy and sampled texts at each evaluation
    # Retention at 0, 2 and 4, with the KL to the policy at step 0: not to the resumed one
    assert [e["step"] for e in resumed.retention] == [0, 2, 4] and resumed.retention == first.retention
    assert resumed.retention[-1]["retention/kl_to_start"] > 0
    assert resumed.kl_warnings == first.kl_warnings
    assert first.resumed_at == [] and resumed.resumed_at == [3]
    assert 0 < resumed.wall_time


def test_the_report_says_where_it_resumed(runs):
    _, killed, _ = runs
    with open(os.path.join(killed, "summary.md")) as f:
        summary = f.read()
    assert "resumed from checkpoints (kl_controller=adaptive, target_kl=0.001, beta_max=0.2 at step 3)" in summary


def copied_checkpoint(killed: str, out, edit) -> str:
    """The killed run's checkpoint where a command writing to `out` finds it, its `trainer_state.json` alone, as
    `edit` (given the state's `RunRecord` entry) leaves it; its path."""
    (variant_dir,) = os.listdir(os.path.join(killed, "runs"))
    (checkpoint,) = [n for n in os.listdir(os.path.join(killed, "runs", variant_dir)) if "checkpoint" in n]
    copied = out / "runs" / variant_dir / checkpoint
    copied.mkdir(parents=True)
    with open(os.path.join(killed, "runs", variant_dir, checkpoint, "trainer_state.json")) as f:
        state = json.load(f)
    edit(state["stateful_callbacks"])
    (copied / "trainer_state.json").write_text(json.dumps(state))
    return str(copied)


def test_a_checkpoint_without_the_record_is_refused_before_any_run(runs, capsys, tmp_path):
    _, killed, _ = runs
    copied_checkpoint(killed, tmp_path, lambda callbacks: callbacks.pop("RunRecord"))
    assert main([*ARGV, "--resume", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "trainer_state.json has no complete record of the run" in err and "drop --resume" in err
    assert not os.path.exists(tmp_path / "runs.json")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--steps", "5"], "trained with another setup (--steps: 5 here, 4 there)"),
        (["--seed", "1"], "trained with another setup (seed: 1 here, 0 there)"),
        (["--set", "kl_estimator=k2"], "trained with another setup (--set kl_estimator: k2 here, not given there)"),
        ([], "saved before checkpoints recorded the setup of their run"),  # a checkpoint of an earlier version
    ],
    ids=["steps", "seed", "set", "unrecorded"],
)
def test_a_checkpoint_of_another_setup_is_refused_before_any_run(runs, capsys, tmp_path, extra, message):
    """The killed run's checkpoint resumed by a command that would train otherwise (another option, seed or field;
    the last --steps and --seed win) is refused before any run, naming what differs; so is one saved before runs
    recorded their setup. Nothing is written."""
    _, killed, _ = runs

    def edit(callbacks):
        recorded = callbacks["RunRecord"]["attributes"]
        assert recorded["setup"]["--steps"] == 4
        if not extra:
            del recorded["setup"]

    copied = copied_checkpoint(killed, tmp_path, edit)
    assert main([*ARGV, *extra, "--save-every", "3", "--resume", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and copied in err
    assert sorted(os.listdir(tmp_path)) == ["runs"] and os.listdir(copied) == ["trainer_state.json"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--save-every", "0"], "--save-every must be at least 1"),
        (["--set", "save_steps=3"], "save_steps is set by the command; use --save-every"),
        (["--set", "save_strategy=steps"], "save_strategy is set by the command; use --save-every"),
        (["--set", "restore_callback_states_from_checkpoint=true"], "is set by the command; use --resume"),
    ],
)
def test_checkpoint_fields_belong_to_the_command(capsys, tmp_path, extra, message):
    assert main([*ARGV, *extra, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
