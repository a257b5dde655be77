"""`adaptive-kl frontier` end to end on the embedded policy: a sweep killed in a run's third step resumes that run from
its checkpoint without redoing the finished ones; the same sweep run again with another option trains nothing of the
other setup and says why; its summary reads the method against the line; the studies' runner finds every run of the
sweep as its own (the same commands, nothing to do) and writes the same frontier; a sweep on a user's own dataset and
reward functions; bad input is refused naming the option before any run."""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import re
import shlex
import shutil
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
# A line of two β (with the start's point, three points), so that a method is read between two of them.
SWEEP = [*ARGS, "--betas", "0,0.1", "--variant", METHOD, "--seeds", "0,1", "--save-every", "1", "--no-progress"]
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
    run again to the end: `(its directory, the finished run's runs.json mtime before the second start, a copy of the
    directory as the kill left it)`. On a quiet machine a step takes a fraction of a second and each checkpoint
    replaces the one before: the test looks often, for any checkpoint from step 2 on, and stops the group the moment
    it sees one."""
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
    as_killed = shutil.copytree(out, out + "-as-killed", ignore=shutil.ignore_patterns("running.pid"))
    again = frontier(out)
    output = again.communicate(timeout=900)[0]
    assert again.returncode == 0, output[-3000:]
    assert "6 runs, 1 finished; 5 to do" in output
    # The resumed run, which goes first, is not timed: the estimate comes from the next run's first steps from step 0
    assert "No estimate of the sweep's time yet" in output
    # In `_duration`'s units: a sweep estimated past 2 minutes (a loaded machine) is said in minutes
    duration = r"~[\d.]+ (?:s|min|h)"
    estimates = re.findall(
        rf"Estimate: {duration} a run, 5 runs 1 at a time: {duration} for the sweep \((.*?) ", output
    )
    assert estimates == ["from", "a"], output[-3000:]  # a run's first 3 steps, then a whole run from step 0
    return out, finished_at, as_killed


def test_a_killed_sweep_resumes_its_run_in_flight_and_redoes_no_finished_one(sweep):
    out, finished_at, _ = sweep
    assert os.path.getmtime(os.path.join(out, "runs", "beta_0", "seed-0", "runs.json")) == finished_at
    (resumed,) = load_runs(os.path.join(out, "runs", "beta_0.1", "seed-0"))
    assert resumed.resumed_at and resumed.resumed_at[0] >= 2 and len(resumed.history) == 4
    (uninterrupted,) = load_runs(os.path.join(out, "runs", "beta_0.1", "seed-1"))
    assert uninterrupted.resumed_at == []
    # Each run records the command that made it, its seed and its setup.
    assert resumed.provenance["command"].startswith("adaptive-kl compare --steps 4 --eval-every 2")
    assert resumed.provenance["seed"] == 0
    assert resumed.provenance["setup"] == {
        "command": "compare", "--steps": 4, "--eval-every": 2, "--n-validation": 8, "--gsm8k-path": "openai/gsm8k",
        "variant": "beta=0.1", "seed": 0,
    }  # fmt: skip


def files_of(directory: str) -> dict[str, float]:
    """Every file under `directory`, with its modification time."""
    return {
        os.path.join(root, name): os.path.getmtime(os.path.join(root, name))
        for root, _, names in os.walk(directory)
        for name in names
    }


def test_a_rerun_with_another_option_trains_nothing_of_the_other_setup_and_says_why(sweep, tmp_path):
    """The killed sweep (β = 0's seed 0 finished, β = 0.1's seed 0 killed after a checkpoint) run again with another
    `--steps` stops before training, naming both runs and the option, and leaves every file as it was; with
    `--restart-changed` (here on seed 0 of β = 0 and the method) the finished run of the other setup is moved aside,
    not deleted, and trained again with this command's setup, and the checkpoint outside the plan stays."""
    out = str(tmp_path / "tiny")
    shutil.copytree(sweep[2], out)
    before = files_of(out)
    changed = frontier(out, "--steps", "3")  # the last --steps wins
    output = changed.communicate(timeout=300)[0]
    assert changed.returncode == 2, output[-3000:]
    assert "2 runs in " in output and "were trained with another setup than this command's" in output
    assert "  - beta=0, seed 0 (finished run): --steps: 3 here, 4 there" in output
    checkpoint = re.search(r"  - beta=0\.1, seed 0 \((.*checkpoint-\d+)\): --steps: 3 here, 4 there", output)
    assert checkpoint and os.path.isdir(checkpoint[1]), output[-3000:]
    assert "--restart-changed" in output and files_of(out) == before  # nothing trained, moved or written
    again = frontier(out, "--steps", "3", "--betas", "0", "--seeds", "0", "--restart-changed")
    output = again.communicate(timeout=600)[0]
    assert again.returncode == 0, output[-3000:]
    assert "1 runs of another setup moved to" in output and "2 runs, 0 finished; 2 to do" in output
    (moved,) = glob.glob(os.path.join(out, "replaced", "*", "runs", "beta_0", "seed-0", "runs.json"))
    assert load_runs(os.path.dirname(moved))[0].provenance["setup"]["--steps"] == 4
    for directory in ("beta_0", METHOD_DIRECTORY):
        (run,) = load_runs(os.path.join(out, "runs", directory, "seed-0"))
        assert run.provenance["setup"]["--steps"] == 3 and [entry["step"] for entry in run.history] == [1, 2, 3]
    assert os.path.isdir(checkpoint[1])  # β = 0.1 is not in this plan: its checkpoint is left where it was


def test_the_summary_reads_the_method_against_the_line_of_its_own_seeds(sweep):
    out, *_ = sweep
    summary = open(os.path.join(out, "summary.md")).read()
    assert "Seeds so far: beta=0: 2; beta=0.1: 2; beta=0.1, kl_adaptation_method=clip: 2." in summary
    table = summary[summary.index("## Constant β's frontier") :]
    assert "| start | 2 | 0.0000 ± 0.0000 |" in table and "| 0 | 2 |" in table  # the start's point, then β = 0's
    assert "| 0.1 | 2 |" in table
    assert "- for a held-out KL to start (final) under" in summary  # what each β kept the drift under
    methods = summary[summary.index("## Methods against the frontier") :]
    row = next(line for line in methods.splitlines() if line.startswith("| beta=0.1, kl_adaptation_method=clip | 2 |"))
    reading = row.split("|")[-2]  # above or below the line, or what D's interval still allows
    assert "the frontier" in reading or "no difference detected with 2 seeds: the interval allows D from" in reading
    assert os.path.isfile(os.path.join(out, "frontier.png"))
    # Run again: nothing to do, the summary rewritten from the same runs.
    again = frontier(out)
    assert "6 runs, 6 finished; 0 to do" in again.communicate(timeout=300)[0] and again.returncode == 0


def test_the_studies_runner_finds_the_sweeps_runs_as_its_own_and_writes_the_same_frontier(sweep, monkeypatch):
    """One implementation: a study with the sweep's arguments, variants, seeds and frontier has nothing to do in the
    sweep's directory (every run is where it would put it, made by the command it would run: no provenance problem),
    and its summary's frontier sections and picture are the sweep's."""
    out, *_ = sweep
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


def test_a_sweep_on_your_own_dataset_and_reward_functions(tmp_path, monkeypatch):
    """`--dataset` and `--reward-funcs`, a user's reward module beside the data: each run trains on the user's
    functions, holds out the train split's last rows (no test split), scores their greedy answers with the same
    functions and weights (`val_reward`, recomputed here from what the policy wrote) and measures the drift on the
    starting policy's own answers to them; the summary reads the held-out reward at matched drift. The method is the
    drift controller, which measures on the same answers: its drift is the frontier's, to the bit."""
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
    argv += ["--steps", "2", "--eval-every", "2", "--n-validation", "4", "--betas", "0,0.1", "--seeds", "0"]
    argv += ["--set", "reward_weights=[1.0, 2.0]"]  # weighted as the trainer weights them
    method = "beta=0.1 kl_controller=drift target_drift=0.05 beta_max=1 drift_every=1"
    assert main([*argv, "--variant", method, "--out", out, "--no-progress"]) == 0
    held_out = train["prompt"][36:]
    method_directory = "beta_0.1__kl_controller_drift__target_drift_0.05__beta_max_1__drift_every_1"
    for variant in ("beta_0", "beta_0.1", method_directory):
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
    drifts = [h["adaptive_kl/drift"] for h in run.history if "adaptive_kl/drift" in h]  # the method's run
    assert drifts[-1] == run.retention[-1]["retention/kl_to_start"] and len(drifts) == 2
    summary = open(os.path.join(out, "summary.md")).read()
    secondary = summary[summary.index("## Secondary endpoints at matched drift") :]
    assert f"| {method.replace(' ', ', ')} | held-out reward (final) | 1 |" in secondary
    assert f"| {method.replace(' ', ', ')} | 0 | 0.05 | {drifts[-1]:.4f} |" in summary  # where it landed
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


def test_a_runs_setup_is_what_its_command_trains(tmp_path):
    """A run's setup leaves out how it is executed and the order of its `--set`s, reads the last of a repeated option
    and a `--variant`'s own `seed=` as `compare` does; a grid of one field, whose variants are named by value alone,
    records the field; a run in flight in another live sweep (its claim) is not read."""
    import json

    from adaptive_kl.demo.arguments import _parser, command_setup, setup_differences, shared_setup
    from adaptive_kl.demo.sweep import CLAIM_FILE, setup_conflicts

    first = ["compare", "--steps", "3", "--steps", "4", "--set", "kl-estimator=k2", "--set", "kl_scaling=log"]
    again = ["compare", "--set", "kl_scaling=log", "--set", "kl_estimator=k2", "--steps", "4", "--out", "elsewhere"]
    variant = ["--variant", "beta=0.1 seed=3", "--seed", "0"]
    setup = command_setup([*first, *variant, "--out", "o", "--save-every", "2", "--resume", "--no-progress"])
    assert setup == command_setup([*again, *variant])
    assert setup["seed"] == 3 and setup["variant"] == "beta=0.1, seed=3" and setup["--steps"] == 4
    assert setup_differences(setup, {**setup, "--steps": 5}) == ["--steps: 4 here, 5 there"]
    assert setup_differences({**setup, "--lora": True}, setup) == ["--lora: given here, not given there"]
    scaling, method = (_parser().parse_known_args(["compare", f"--{field}", "none,sqrt"]) for field in
                       ("kl_scaling", "kl_adaptation_method"))  # fmt: skip
    assert shared_setup(*scaling)["varied"] == ["kl_scaling"] and shared_setup(*method)["varied"] == [
        "kl_adaptation_method"
    ]
    directory = tmp_path / "runs" / "beta_0.1__seed_3" / "seed-0"
    directory.mkdir(parents=True)
    run = dict(name="beta=0.1, seed=3", config={}, history=[], evaluations=[], wall_time=1.0,
               provenance={"setup": {**setup, "--steps": 5}})  # fmt: skip
    (directory / "runs.json").write_text(json.dumps([run]))
    argv = [*first, *variant]
    assert [why for _, why in setup_conflicts([("r", str(directory), argv)])] == [
        "r (finished run): --steps: 4 here, 5 there"
    ]
    (directory / CLAIM_FILE).write_text(str(os.getpid()))  # a live process has it
    assert setup_conflicts([("r", str(directory), argv)]) == []


def test_unsloth_is_imported_before_anything_imports_trl():
    """`frontier --unsloth` imports Unsloth (`usage.import_unsloth`, replaced here by a check in a fresh interpreter)
    before any module that loads TRL, as Unsloth requires: the sweep's modules load TRL, so they come after it."""
    code = (
        "import sys\n"
        "from adaptive_kl.demo import frontier_command\n"
        "from adaptive_kl.usage import UsageError\n"
        "def check(option='--unsloth'):\n"
        "    raise UsageError('TRL came first' if 'trl' in sys.modules else 'Unsloth first')\n"
        "frontier_command.import_unsloth = check\n"
        "sys.exit(frontier_command.main(['frontier', '--unsloth', '--model', 'm', '--out', 'o']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 2 and "adaptive-kl: error: Unsloth first" in result.stderr, result.stderr[-2000:]


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
    assert len(shown) == 4
    for command in shown:
        line, _, seeds = plan(parser.parse_args(shlex.split(command.split("#")[0])[1:]))
        assert line and seeds


def test_with_several_gpus_each_job_runs_on_its_own_and_stacking_is_refused_unless_asked(
    tmp_path, monkeypatch, capsys
):
    """With 4 GPUs visible (torch's count mocked), `--jobs 2` runs every run with one GPU of its own
    (`CUDA_VISIBLE_DEVICES`), no two runs at once on the same one; `--jobs 5` is refused before any run, unless
    `--share-gpus`, which deals the 4 out to the 5 jobs; `CUDA_VISIBLE_DEVICES` names the GPUs where set."""
    import threading

    import torch

    from adaptive_kl.demo import sweep

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spans, lock = [], threading.Lock()

    def execute(argv, directory, threads, cwd, label, device, watch):  # a run that holds its device for a while
        start = time.monotonic()
        time.sleep(0.3)
        with lock:
            spans.append((device, start, time.monotonic()))
        return 0

    monkeypatch.setattr(sweep, "execute", execute)
    argv = ["frontier", *ARGS, "--betas", "0,0.1,0.2", "--seeds", "0,1", "--no-progress"]
    assert main([*argv, "--jobs", "2", "--out", str(tmp_path / "a")]) == 0
    assert len(spans) == 6 and {device for device, _, _ in spans} <= {"0", "1", "2", "3"}
    overlapping = [(a, b) for a in spans for b in spans if a is not b and a[1] < b[2] and b[1] < a[2]]
    assert overlapping and all(a[0] != b[0] for a, b in overlapping)  # runs side by side, each on its own GPU
    assert main([*argv, "--jobs", "5", "--out", str(tmp_path / "b")]) == 2
    assert "--jobs 5 would stack runs on 4 visible GPUs" in capsys.readouterr().err and len(spans) == 6
    from adaptive_kl.demo.frontier_command import job_devices

    assert job_devices(5, share=True) == ["0", "1", "2", "3", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    assert job_devices(2, share=False) == ["3", "5"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert job_devices(2, share=False) is None  # no GPU: the jobs share the cores


def test_the_sweep_s_time_is_estimated_from_clean_runs_only(capsys):
    """No number from a run resumed from a checkpoint (its first step is not step 1: here one resumed at 198 of 200
    steps, which ends at once), nor from a run that fails (after 3.5 s), whichever goes first; it says so until there
    is one. A run from step 0 that reached its step 1 after 30 s and its step 3 after 34 s: 30 + 99 × 2 s = 228 s a
    run; 7 runs, 2 at a time, in 4 turns: 912 s. Its success at 250 s: 1000 s. Another run's lines change nothing."""
    from adaptive_kl.demo.frontier_command import SweepClock

    clock = SweepClock(runs=7, jobs=2, eval_every=20)
    clock.start()
    clock.watch("beta=0.2, seed 1", "step 199/200\n", 20.0)
    clock.watch("beta=0.2, seed 1", "step 200/200\n", 22.0)
    clock.watch("beta=0.2, seed 1", None, 25.0, 0)
    clock.watch("beta=0.1, seed 1", "step 1/100\n", 3.0)
    clock.watch("beta=0.1, seed 1", None, 3.5, 1)
    assert clock.estimates == []
    clock.watch("beta=0, seed 0", "Loading the model\n", 5.0)
    clock.watch("beta=0, seed 0", "step 1/100\n", 30.0)
    clock.watch("beta=0.1, seed 0", "step 1/100\n", 31.0)
    clock.watch("beta=0.1, seed 0", "step 2/100\n", 60.0)
    clock.watch("beta=0, seed 0", "step 2/100\n", 32.0)
    assert clock.estimates == []
    clock.watch("beta=0, seed 0", "step 3/100\n", 34.0)
    assert clock.estimates == [pytest.approx(912.0)]
    clock.watch("beta=0.1, seed 0", "step 3/100\n", 90.0)
    clock.watch("beta=0, seed 0", "step 4/100\n", 36.0)
    clock.watch("beta=0, seed 0", None, 250.0, 0)
    clock.watch("beta=0.1, seed 0", None, 400.0, 0)
    assert clock.estimates == [pytest.approx(912.0), pytest.approx(1000.0)]
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "No estimate of the sweep's time yet: it comes once a run that starts at step 0 has logged 3 steps.",
        "Estimate: ~4 min a run, 7 runs 2 at a time: ~15 min for the sweep (from a run's first 3 steps: 30 s to its "
        "step 1 (loading, the step-0 evaluation), then 2.0 s a step; evaluations every 20 steps come on top).",
        "Estimate: ~4 min a run, 7 runs 2 at a time: ~17 min for the sweep (a whole run from step 0 took 4 min).",
    ]


def test_the_gpu_example_trains_the_settings_the_page_states(monkeypatch):
    """docs/frontier.md's 0.5B example: every run a LoRA of rank 16, alpha 32 on the attention projections at learning
    rate 2e-05, 2 prompts × 8 completions a step of at most 256 tokens, 200 validation problems every 50 steps, 200
    steps; 18 runs (the hub id and GSM8K are not loaded here)."""
    from adaptive_kl.demo.arguments import build
    from adaptive_kl.demo.runner import make_config
    from adaptive_kl.demo.sweep import SweepRun

    page = open(os.path.join(REPO, "docs", "frontier.md")).read().replace("\\\n", " ")
    (command,) = [
        c for c in re.findall(r"^adaptive-kl frontier .*$", page, flags=re.M) if "Qwen2.5-0.5B" in c and "--lora" in c
    ]
    monkeypatch.setattr("adaptive_kl.demo.arguments.check_model", lambda *args: None)
    monkeypatch.setattr("adaptive_kl.demo.arguments._check_task", lambda settings: None)
    parser = argparse.ArgumentParser(prog="adaptive-kl", allow_abbrev=False)
    add_frontier_parser(parser.add_subparsers(dest="command"))
    opts = parser.parse_args(shlex.split(command)[1:])
    line, methods, seeds = plan(opts)
    runs = [SweepRun(variant, seed) for seed in seeds for variant in [*line, *methods]]
    assert len(runs) == 18 and "**18 runs of 200 steps**" in page
    from adaptive_kl.demo.frontier_command import run_arguments

    settings, (variant,), _, _ = build(runs[-1].command(run_arguments(opts), "unused")[3:])
    config = make_config(variant, settings, "unused")
    assert settings.adapter == {"r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    assert "rank 16, alpha 32 on `q_proj k_proj v_proj o_proj` at learning rate 2e-05" in " ".join(page.split())
    assert (config.learning_rate, config.max_steps, config.max_completion_length) == (2e-05, 200, 256)
    completions = config.per_device_train_batch_size * config.gradient_accumulation_steps
    assert (completions // config.num_generations, config.num_generations) == (2, 8)  # 2 prompts × 8 completions
    assert (settings.n_validation, settings.eval_every, settings.task) == (200, 50, "gsm8k")
    assert f"{len(runs) * config.max_steps * completions:,} sampled completions" in page


def test_the_cpu_times_the_page_quotes_are_the_studies_runs():
    """docs/frontier.md's times of a SmolLM2 LoRA run on a CPU: the range and median of `wall_time` over the studies'
    runs never resumed (a resumed run's time holds what its kill lost), at 64 tokens (the β study and the second
    frontier) and at 128 (the first frontier)."""
    import json
    import statistics

    page = " ".join(open(os.path.join(REPO, "docs", "frontier.md")).read().split())
    for studies, tokens in ((("beta", "frontier_sum"), 64), (("frontier",), 128)):
        minutes = []
        for study in studies:
            for path in glob.glob(
                os.path.join(REPO, "docs", "studies", "real", study, "runs", "*", "seed-*", "runs.json")
            ):
                minutes += [run["wall_time"] / 60 for run in json.load(open(path)) if not run.get("resumed_at")]
        low, high, median = min(minutes), max(minutes), statistics.median(minutes)
        assert (
            f"{low:.0f}–{high:.0f} minutes at {tokens} tokens" in page or f"{low:.0f}–{high:.0f} at {tokens}" in page
        )
        assert f"(median {median:.0f}; {len(minutes)} runs:" in page
