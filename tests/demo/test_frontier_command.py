"""`adaptive-kl frontier` end to end on the embedded policy: a sweep killed in a run's third step resumes that run from
its checkpoint without redoing the finished ones; its summary reads the method against the line; the studies' runner
finds every run of the sweep as its own (the same commands, nothing to do) and writes the same frontier; bad input is
refused naming the option before any run."""

from __future__ import annotations

import glob
import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest
from repo_paths import REPO

from adaptive_kl.demo.frontier_command import main
from adaptive_kl.demo.run_files import load_runs


ARGS = ["--steps", "4", "--eval-every", "2", "--n-validation", "8"]
METHOD = "beta=0.1 kl_adaptation_method=clip"
SWEEP = [*ARGS, "--betas", "0,0.1", "--variant", METHOD, "--seeds", "0,1", "--save-every", "1", "--no-progress"]


def frontier(out: str, *extra: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "adaptive_kl", "frontier", *SWEEP, "--out", out, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        **popen,
    )


def past_step_one(run: str) -> bool:
    """Whether the run in `run` has saved a checkpoint of step 2 or later."""
    states = glob.glob(os.path.join(run, "runs", "*", "checkpoint-*", "trainer_state.json"))
    return any(int(state.split("checkpoint-")[-1].split(os.sep)[0]) >= 2 for state in states)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep killed (SIGKILL, the whole process group) once the second run has a checkpoint of step 2 or later, then
    run again to the end: `(its directory, the finished run's runs.json mtime before the second start)`. On a quiet
    machine a step takes a fraction of a second and each checkpoint replaces the one before: the test looks often,
    for any checkpoint from step 2 on, and stops the group the moment it sees one."""
    out = str(tmp_path_factory.mktemp("frontier") / "tiny")
    killed = frontier(out, start_new_session=True)
    second = os.path.join(out, "runs", "beta_0.1", "seed-0")
    deadline = time.monotonic() + 600
    while not past_step_one(second):
        assert killed.poll() is None and time.monotonic() < deadline, killed.communicate()[0][-3000:]
        time.sleep(0.02)
    os.killpg(killed.pid, signal.SIGSTOP)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    first = os.path.join(out, "runs", "beta_0", "seed-0", "runs.json")
    assert os.path.isfile(first) and not os.path.exists(os.path.join(second, "runs.json"))
    finished_at = os.path.getmtime(first)
    again = frontier(out)
    output = again.communicate(timeout=900)[0]
    assert again.returncode == 0, output[-3000:]
    assert "6 runs, 1 finished; 5 to do" in output
    return out, finished_at


def test_a_killed_sweep_resumes_its_run_in_flight_and_redoes_no_finished_one(sweep):
    out, finished_at = sweep
    assert os.path.getmtime(os.path.join(out, "runs", "beta_0", "seed-0", "runs.json")) == finished_at
    (resumed,) = load_runs(os.path.join(out, "runs", "beta_0.1", "seed-0"))
    assert resumed.resumed_at and resumed.resumed_at[0] >= 2 and len(resumed.history) == 4
    (uninterrupted,) = load_runs(os.path.join(out, "runs", "beta_0.1", "seed-1"))
    assert uninterrupted.resumed_at == []
    # Each run records the command that made it, and its seed.
    assert resumed.provenance["command"].startswith("adaptive-kl compare --steps 4 --eval-every 2")
    assert resumed.provenance["seed"] == 0


def test_the_summary_reads_the_method_against_the_line_of_its_own_seeds(sweep):
    out, _ = sweep
    summary = open(os.path.join(out, "summary.md")).read()
    assert "Seeds so far: beta=0: 2; beta=0.1: 2; beta=0.1, kl_adaptation_method=clip: 2." in summary
    assert "| start | 2 | 0.0000 ± 0.0000 |" in summary  # the start's point on the line
    assert "- for a held-out KL to start (final) under" in summary  # what each β kept the drift under
    methods = summary[summary.index("## Methods against the frontier") :]
    row = next(line for line in methods.splitlines() if line.startswith("| beta=0.1, kl_adaptation_method=clip | 2 |"))
    assert "the frontier" in row.split("|")[-2]  # its reading: on, above or below it
    assert os.path.isfile(os.path.join(out, "frontier.png"))
    # Run again: nothing to do, the summary rewritten from the same runs.
    again = frontier(out)
    assert "6 runs, 6 finished; 0 to do" in again.communicate(timeout=300)[0] and again.returncode == 0


def test_the_studies_runner_finds_the_sweeps_runs_as_its_own_and_writes_the_same_frontier(sweep, monkeypatch):
    """One implementation: a study with the sweep's arguments, variants, seeds and frontier has nothing to do in the
    sweep's directory (every run is where it would put it, made by the command it would run: no provenance problem),
    and its summary's frontier sections and picture are the sweep's."""
    out, _ = sweep
    spec = importlib.util.spec_from_file_location(
        "run_real_studies", os.path.join(REPO, "scripts", "run_real_studies.py")
    )
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "CHECKPOINT_EVERY", 1)  # the sweep's --save-every
    studies = {
        "tiny": {
            "variants": ["beta=0", "beta=0.1", METHOD],
            "args": ARGS,
            "seeds": "0,1",
            "frontier": {
                "line": ["beta=0", "beta=0.1"],
                "x": "final_kl_to_start",
                "y": "late_reward",
                "secondary": ["final_accuracy", "length_drift", "delta_retention"],
                "start_steps": 1,  # the command's: at most a quarter of the 4 steps
            },
        }
    }
    root = os.path.dirname(out)
    before = open(os.path.join(out, "summary.md")).read()
    picture = open(os.path.join(out, "frontier.png"), "rb").read()
    assert script.provenance_problems(root, studies) == []
    assert script.main(["--only", "tiny", "--out", root], studies=studies) == 0
    after = open(os.path.join(out, "summary.md")).read()
    section = "## Constant β's frontier"
    assert after[after.index(section) :] == before[before.index(section) :]
    assert open(os.path.join(out, "frontier.png"), "rb").read() == picture


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--betas", "0,x"], "--betas expects comma-separated floats, got '0,x'"),
        (["--betas", "0,-0.1"], "--betas must be >= 0, got '0,-0.1'"),
        (["--seeds", "0,0"], "--seeds repeats a value: '0,0'"),
        (["--variant", "kl_adaptation_method=clip"], "sets no beta: a method starts from its own β"),
        (["--variant", "beta=0.1"], "--variant 'beta=0.1' is a point of the line (--betas)"),
        (["--set", "beta=0.3"], "--set beta=... would fix every run's β"),
        (["--variant", "beta=0.1 kl_estimater=k1"], "Did you mean kl_estimator?"),
        (["--jobs", "0"], "--jobs must be at least 1, got 0"),
        (["--set", "learning_rate=-1"], "learning_rate must be a finite number > 0"),
    ],
)
def test_bad_input_is_refused_naming_the_option_before_any_run(extra, message, tmp_path, capsys):
    out = str(tmp_path / "sweep")
    argv = ["frontier", *ARGS, "--betas", "0,0.1", "--seeds", "0", "--out", out, *extra]
    # The last of two --betas/--seeds wins, as argparse reads them.
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not glob.glob(os.path.join(out, "runs", "*", "*", "runs.json"))
