"""`adaptive-kl frontier` end to end on the embedded policy: a sweep killed in a run's third step resumes that run from
its checkpoint without redoing the finished ones; its summary reads the method against the line; the studies' runner
finds every run of the sweep as its own (the same commands, nothing to do) and writes the same frontier; a sweep on a
user's own dataset and reward functions; bad input is refused naming the option before any run."""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from repo_paths import REPO

from adaptive_kl.demo.frontier_command import add_frontier_parser, main, plan
from adaptive_kl.demo.run_files import load_runs


ARGS = ["--steps", "4", "--eval-every", "2", "--n-validation", "8"]
METHOD = "beta=0.1 kl_adaptation_method=clip"
# A line of one β (with the start's point, two points) is enough to read the method against: each run is a process of
# its own, most of whose time is spent starting.
SWEEP = [*ARGS, "--betas", "0", "--variant", METHOD, "--seeds", "0,1", "--save-every", "1", "--no-progress"]
METHOD_DIRECTORY = "beta_0.1__kl_adaptation_method_clip"  # the method's runs, as `SweepRun.directory` names them


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
    second = os.path.join(out, "runs", METHOD_DIRECTORY, "seed-0")
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
    assert "4 runs, 1 finished; 3 to do" in output
    return out, finished_at


def test_a_killed_sweep_resumes_its_run_in_flight_and_redoes_no_finished_one(sweep):
    out, finished_at = sweep
    assert os.path.getmtime(os.path.join(out, "runs", "beta_0", "seed-0", "runs.json")) == finished_at
    (resumed,) = load_runs(os.path.join(out, "runs", METHOD_DIRECTORY, "seed-0"))
    assert resumed.resumed_at and resumed.resumed_at[0] >= 2 and len(resumed.history) == 4
    (uninterrupted,) = load_runs(os.path.join(out, "runs", METHOD_DIRECTORY, "seed-1"))
    assert uninterrupted.resumed_at == []
    # Each run records the command that made it, and its seed.
    assert resumed.provenance["command"].startswith("adaptive-kl compare --steps 4 --eval-every 2")
    assert resumed.provenance["seed"] == 0


def test_the_summary_reads_the_method_against_the_line_of_its_own_seeds(sweep):
    out, _ = sweep
    summary = open(os.path.join(out, "summary.md")).read()
    assert "Seeds so far: beta=0: 2; beta=0.1, kl_adaptation_method=clip: 2." in summary
    assert "| start | 2 | 0.0000 ± 0.0000 |" in summary  # the start's point on the line
    assert "- for a held-out KL to start (final) under" in summary  # what each β kept the drift under
    methods = summary[summary.index("## Methods against the frontier") :]
    row = next(line for line in methods.splitlines() if line.startswith("| beta=0.1, kl_adaptation_method=clip | 2 |"))
    assert "the frontier" in row.split("|")[-2]  # its reading: on, above or below it
    assert os.path.isfile(os.path.join(out, "frontier.png"))
    # Run again: nothing to do, the summary rewritten from the same runs.
    again = frontier(out)
    assert "4 runs, 4 finished; 0 to do" in again.communicate(timeout=300)[0] and again.returncode == 0


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
            "variants": ["beta=0", METHOD],
            "args": ARGS,
            "seeds": "0,1",
            "frontier": {
                "line": ["beta=0"],
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


def test_a_sweep_on_your_own_dataset_and_reward_functions(tmp_path, monkeypatch):
    """`--dataset` and `--reward-funcs`, a user's reward module beside the data: each run trains on the user's
    functions, holds out the train split's last rows (no test split), scores their greedy answers with the same
    functions and weights (`val_reward`, recomputed here from what the policy wrote) and measures the drift on the
    starting policy's own answers to them; the summary reads the held-out reward at matched drift."""
    from adaptive_kl.demo.embedded import embedded_datasets
    from adaptive_kl.tasks.answers import has_answer_format

    train, _ = embedded_datasets(40, 8, seed=0)
    train.select_columns(["prompt", "answer"]).to_json(str(tmp_path / "mine.jsonl"))
    monkeypatch.delitem(sys.modules, "sweep_rewards", raising=False)  # a module of that name imported before
    (tmp_path / "sweep_rewards.py").write_text(
        "def brief(completions, answer, **kwargs):\n    return [1.0 if len(c) < 12 else 0.0 for c in completions]\n"
    )
    monkeypatch.chdir(tmp_path)  # as a user runs it: the module imported from the working directory
    out = str(tmp_path / "sweep")
    argv = ["frontier", "--dataset", "mine.jsonl", "--reward-funcs", "format_reward", "sweep_rewards:brief"]
    argv += ["--steps", "2", "--eval-every", "2", "--n-validation", "4", "--betas", "0", "--seeds", "0"]
    argv += ["--set", "reward_weights=[1.0, 2.0]"]  # weighted as the trainer weights them
    assert main([*argv, "--variant", METHOD, "--out", out, "--no-progress"]) == 0
    held_out = train["prompt"][36:]
    for variant in ("beta_0", METHOD_DIRECTORY):
        (run,) = load_runs(os.path.join(out, "runs", variant, "seed-0"))
        assert all("rewards/format_reward/mean" in h and "rewards/brief/mean" in h for h in run.history)
        assert [e["step"] for e in run.evaluations] == [0, 2] and [e["step"] for e in run.retention] == [0, 2]
        for evaluation in run.evaluations:
            samples = [sample for sample in run.samples if sample["step"] == evaluation["step"]]
            assert [sample["prompt"] for sample in samples] == held_out
            greedy = [sample["greedy"] for sample in samples]
            expected = [float(has_answer_format(text)) + 2.0 * float(len(text) < 12) for text in greedy]
            assert evaluation["val_reward"] == pytest.approx(sum(expected) / 4, abs=1e-12)
        assert run.retention[0]["retention/kl_to_start"] == pytest.approx(0.0, abs=1e-6)  # the start against itself
        assert "--dataset mine.jsonl --reward-funcs format_reward sweep_rewards:brief" in run.provenance["command"]
    summary = open(os.path.join(out, "summary.md")).read()
    secondary = summary[summary.index("## Secondary endpoints at matched drift") :]
    assert f"| {METHOD.replace(' ', ', ')} | held-out reward (final) | 1 |" in secondary
    assert "the step-0 evaluation's held-out reward" in summary


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
        (["--reward-funcs", "format_reward"], "--reward-funcs is for --dataset (the built-in tasks have their own)"),
        (["--dataset", "./mine.jsonl"], "--dataset needs --reward-funcs"),
        (["--dataset", "./mine.jsonl", "--reward-funcs", "format_rewrd"], "(did you mean 'format_reward' or"),
        (["--dataset", "./mine.jsonl", "--reward-funcs", "format_reward"], "--dataset ./mine.jsonl: no such file"),
        (["--task", "chat", "--dataset", "./d.jsonl", "--reward-funcs", "format_reward"], "drop --task chat"),
    ],
)
def test_bad_input_is_refused_naming_the_option_before_any_run(extra, message, tmp_path, capsys):
    out = str(tmp_path / "sweep")
    argv = ["frontier", *ARGS, "--betas", "0,0.1", "--seeds", "0", "--out", out, *extra]
    # The last of two --betas/--seeds wins, as argparse reads them.
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not glob.glob(os.path.join(out, "runs", "*", "*", "runs.json"))


def test_the_page_names_every_option_and_its_commands_parse():
    """docs/frontier.md: every option of the command is named on it, and each `adaptive-kl frontier` command it shows
    parses, with a plan (`plan`) the command accepts."""
    page = open(os.path.join(REPO, "docs", "frontier.md")).read()
    parser = argparse.ArgumentParser(prog="adaptive-kl", allow_abbrev=False)
    commands = parser.add_subparsers(dest="command")
    add_frontier_parser(commands)
    options = [o for action in commands.choices["frontier"]._actions for o in action.option_strings if o != "--help"]
    assert "--dataset" in options and [o for o in options if o.startswith("--") and f"`{o}" not in page] == []
    shown = re.findall(r"^adaptive-kl frontier .*?(?<!\\)$", page.replace("\\\n", " "), flags=re.M)
    assert len(shown) == 3
    for command in shown:
        line, _, seeds = plan(parser.parse_args(shlex.split(command.split("#")[0])[1:]))
        assert line and seeds
