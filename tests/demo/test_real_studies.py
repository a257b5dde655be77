"""`scripts/run_real_studies.py`, the runner of the real-model studies, on the tiny policy: one run per variant and
seed, finished runs skipped when started again, the summary rewritten from whatever runs exist."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
from repo_paths import REPO

from adaptive_kl.demo.arguments import build
from adaptive_kl.demo.run_files import load_runs, save_runs


SCRIPT = os.path.join(REPO, "scripts", "run_real_studies.py")
TINY = {"tiny": {"variants": ["beta=0", "beta=0.1 kl_estimator=k2"], "args": ["--steps", "2", "--eval-every", "2",
                                                                             "--n-validation", "8"]}}  # fmt: skip


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("run_real_studies", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_every_real_study_is_a_valid_comparison_on_the_real_model(script, tmp_path, monkeypatch):
    monkeypatch.setattr("adaptive_kl.demo.arguments.check_model", lambda *args: None)  # no conversion needed to parse
    for name in script.STUDIES:
        for run in script.planned_runs(script.STUDIES, [name], [0]):
            settings, variants, _, _ = build(run.command(str(tmp_path), script.STUDIES)[3:])
            assert settings.model == "smollm2" and settings.task == "chat" and settings.steps == 100
            assert [v.name for v in variants] == [", ".join(run.variant.split())]
    assert len(script.STUDIES["length"]["variants"]) >= 4 and script.STUDIES["length"]["variants"][0].startswith(
        "beta=0"
    )


def test_runs_resume_without_redoing_finished_ones(script, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(script, "CHECKPOINT_EVERY", 1)  # the tiny runs' 2 steps: a checkpoint at each
    out = str(tmp_path / "studies")
    assert script.main(["--seeds", "0,1", "--out", out], studies=TINY) == 0
    runs = script.planned_runs(TINY, ["tiny"], [0, 1])
    directories = [os.path.join(out, *os.path.relpath(run.directory(out), out).split(os.sep)) for run in runs]
    assert all(os.path.isfile(os.path.join(d, "runs.json")) for d in directories)
    summary = open(os.path.join(out, "tiny", "summary.md")).read()
    assert "Seeds so far: beta=0: 2; beta=0.1, kl_estimator=k2: 2." in summary
    assert "±" in summary and "paired" in summary.lower()
    # The study records its runs' machine and threads (from their own summaries), not the summarizing process's.
    device = next(line for line in open(os.path.join(directories[0], "summary.md")) if line.startswith("- device:"))
    assert f"- devices of the runs: {device.removeprefix('- device:').strip()} (4 runs)" in summary
    # Each run recorded its own command as the runner gave it (provenance), and the summary lists their commit.
    assert script.provenance_problems(out, TINY) == []
    assert [run.provenance["seed"] for d in directories for run in load_runs(d)] == [0, 0, 1, 1]
    assert "- commits of the runs (their runs.json provenance): " in summary

    # A run killed before its report left no runs.json: only it runs again, from its latest checkpoint (here the
    # last step's), and reports what it had; the others are not touched.
    killed = directories[1]
    (finished,) = load_runs(killed)
    os.remove(os.path.join(killed, "runs.json"))
    before = {d: os.path.getmtime(os.path.join(d, "runs.json")) for d in directories if d != killed}
    capsys.readouterr()
    assert script.main(["--seeds", "0,1", "--out", out], studies=TINY) == 0
    assert "1 runs to do" in capsys.readouterr().out
    assert {d: os.path.getmtime(os.path.join(d, "runs.json")) for d in before} == before
    (rerun,) = load_runs(killed)
    assert rerun.config["beta"] == 0.1 and len(rerun.history) == 2 and rerun.resumed_at == [2]
    assert rerun.history == finished.history and rerun.evaluations == finished.evaluations

    # Summaries are rebuilt from whatever runs exist, without training.
    os.remove(os.path.join(directories[3], "runs.json"))
    assert script.main(["--summarize", "--seeds", "0,1", "--out", out], studies=TINY) == 0
    assert "beta=0.1, kl_estimator=k2: 1." in open(os.path.join(out, "tiny", "summary.md")).read()


def test_a_stop_file_lets_the_runs_in_flight_finish_and_starts_no_other(script, tmp_path, capsys, monkeypatch):
    stop = tmp_path / "stop-runner"
    executed = []

    def execute(
        argv, directory, threads, cwd=None, label="", device=None, watch=None
    ):  # the first run asks the runner to stop in flight
        executed.append(label)
        stop.touch()
        return 0

    monkeypatch.setattr("adaptive_kl.demo.sweep.execute", execute)
    monkeypatch.setattr(script, "summarize", lambda *args: None)
    out = str(tmp_path / "studies")
    assert script.main(["--seeds", "0,1", "--jobs", "1", "--out", out, "--stop-file", str(stop)], studies=TINY) == 0
    assert executed == ["tiny: beta=0, seed 0"]
    assert capsys.readouterr().out.count(f"not started ({stop} exists)") == 3
    assert not any(name == "running.pid" for _, _, names in os.walk(out) for name in names)  # no claim left


def test_the_runs_devices_are_counted_from_their_own_summaries(script, tmp_path):
    epyc, xeon = "CPU: AMD EPYC, 2 cores, torch threads 1", "CPU: Xeon, 2 cores, torch threads 1"
    for name, device in (("a", epyc), ("b", xeon), ("c", epyc), ("d", None)):
        os.makedirs(tmp_path / name)
        (tmp_path / name / "summary.md").write_text(
            f"# x\n\n- date: 2026-11-25\n- device: {device}\n" if device else ""
        )
    directories = [str(tmp_path / name) for name in "abcde"]  # e: no summary at all
    assert script.run_devices(directories) == (
        "CPU: AMD EPYC, 2 cores, torch threads 1 (2 runs); CPU: Xeon, 2 cores, torch threads 1 (1 run); "
        "not recorded (2 runs)"
    )


def test_a_run_in_flight_elsewhere_is_left_to_its_runner_and_a_dead_runners_claim_is_taken_over(script, tmp_path):
    import subprocess

    out = str(tmp_path / "studies")
    first, second = script.planned_runs(TINY, ["tiny"], [0])
    live = os.path.join(script.REPOSITORY, first.directory(out), script.CLAIM_FILE)
    os.makedirs(os.path.dirname(live))
    with open(live, "w") as f:
        f.write(str(os.getppid()))  # a live process that is not this runner
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = os.path.join(script.REPOSITORY, second.directory(out), script.CLAIM_FILE)
    os.makedirs(os.path.dirname(stale))
    with open(stale, "w") as f:
        f.write(str(dead.pid))  # a runner that was killed
    assert script.main(["--seeds", "0", "--out", out], studies=TINY) == 0
    assert not os.path.exists(os.path.join(os.path.dirname(live), "runs.json")) and os.path.isfile(live)
    assert os.path.isfile(os.path.join(os.path.dirname(stale), "runs.json")) and not os.path.exists(stale)


def test_variants_limits_the_runs_and_an_unknown_one_is_refused_naming_the_allowed(script, tmp_path, capsys):
    out = str(tmp_path / "studies")
    # Either spelling of a variant: as the study lists it or as `compare` names it.
    assert script.main(["--seeds", "0", "--variants", "beta=0.1, kl_estimator=k2", "--out", out], studies=TINY) == 0
    first, second = (
        os.path.join(script.REPOSITORY, run.directory(out)) for run in script.planned_runs(TINY, ["tiny"], [0])
    )
    assert not os.path.exists(os.path.join(first, "runs.json")) and os.path.isfile(os.path.join(second, "runs.json"))
    assert "1 runs to do" in capsys.readouterr().out

    with pytest.raises(SystemExit):
        script.main(["--variants", "beta=0.2", "--out", out], studies=TINY)
    error = capsys.readouterr().err
    assert "--variants: 'beta=0.2' is not a variant of tiny" in error
    assert "allowed: 'beta=0', 'beta=0.1 kl_estimator=k2'" in error


def test_a_run_of_another_setup_stops_the_runner_before_training(script, tmp_path, capsys):
    """The study run again with another option (its `args`) finds its finished run trained otherwise: the runner stops
    before training, naming it and the option, and touches nothing; with `--restart-changed` the run is moved aside
    (not deleted) and trained with the study's command."""
    out = str(tmp_path / "studies")
    argv = ["--seeds", "0", "--variants", "beta=0", "--out", out]
    assert script.main(argv, studies=TINY) == 0
    (run,) = script.planned_runs(TINY, ["tiny"], [0])[:1]
    finished = os.path.join(out, *os.path.relpath(run.directory(out), out).split(os.sep), "runs.json")
    before = os.path.getmtime(finished)
    changed = {"tiny": {**TINY["tiny"], "args": [*TINY["tiny"]["args"], "--steps", "3"]}}  # the last --steps wins
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        script.main(argv, studies=changed)
    assert stopped.value.code == 2 and os.path.getmtime(finished) == before
    err = capsys.readouterr().err
    assert "tiny: beta=0, seed 0 (finished run): --steps: 3 here, 2 there" in err
    assert script.main([*argv, "--restart-changed"], studies=changed) == 0
    assert load_runs(os.path.dirname(finished))[0].provenance["setup"]["--steps"] == 3
    (moved,) = [os.path.join(root, name) for root, _, names in os.walk(os.path.join(out, "replaced")) for name in names
                if name == "runs.json"]  # fmt: skip
    assert load_runs(os.path.dirname(moved))[0].provenance["setup"]["--steps"] == 2


# The committed runs that recorded their command (the others were made before runs recorded one)
COMPARED_RUNS = 89


def test_the_runner_reuses_every_committed_run_as_its_own(script):
    """Every committed run of the studies, finished before runs recorded their setup, has the setup of the command the
    runner gives it (read from its recorded command; runs made before provenance are taken as they are): the runner's
    check, which refuses another setup, finds nothing to refuse."""
    from adaptive_kl.demo.arguments import command_setup
    from adaptive_kl.demo.sweep import recorded_setup, setup_conflicts

    out, studies = script.STUDIES_DIR, script.STUDIES
    runs = []
    for name in studies:
        seeds = sorted(set(script.study_seeds(studies, name)) | script.found_seeds(name, out, studies))
        runs += [script.source_run(run, studies) for run in script.planned_runs(studies, [name], seeds)]
    checked = [
        (script.label(run), os.path.join(REPO, run.directory(out)), script.execute_argv(run, out, studies)[3:])
        for run in dict.fromkeys(runs)
    ]
    assert sum(os.path.isfile(os.path.join(directory, "runs.json")) for _, directory, _ in checked) >= 138
    assert setup_conflicts(checked, unrecorded_ok=True) == []
    recorded = [recorded_setup(directory, command_setup(argv)["variant"]) for _, directory, argv in checked]
    assert sum(found is not None and found[1] is not None for found in recorded) == COMPARED_RUNS


def test_a_reused_variant_is_the_same_command_as_the_run_it_reuses(script, tmp_path, monkeypatch):
    """The methods study's `none`, β = 0 and k1 per token are the length study's runs, not rerun: both commands give
    the same settings (steps, evaluations, model, task) and build the same trainer config."""
    import dataclasses

    from adaptive_kl.demo.runner import make_config

    monkeypatch.setattr("adaptive_kl.demo.arguments.check_model", lambda *args: None)
    reused = [
        (name, variant, source)
        for name, s in script.STUDIES.items()
        for variant, source in s.get("reused", {}).items()
    ]
    assert len(reused) >= 3
    for name, variant, (study, source_variant) in reused:
        built_runs = []
        for run in (script.Run(name, variant, 1), script.Run(study, source_variant, 1)):
            settings, (built,), _, _ = build(run.command(str(tmp_path), script.STUDIES)[3:])
            config = make_config(built, settings, str(tmp_path / "out")).to_dict()
            settings = {k: v for k, v in dataclasses.asdict(settings).items() if k != "out"}
            built_runs.append((settings, {k: v for k, v in config.items() if k not in ("logging_dir", "run_name")}))
        assert built_runs[0] == built_runs[1], (name, variant)


def test_a_study_with_a_different_command_is_not_reused(script, tmp_path, monkeypatch):
    """The check above can fail: the methods study's `clip` does not build the length study's β = 0.2 config, and
    the same variant at 64 tokens (the β study's budget) gives other settings."""
    import dataclasses

    from adaptive_kl.demo.runner import make_config

    monkeypatch.setattr("adaptive_kl.demo.arguments.check_model", lambda *args: None)

    def built(run):
        settings, (variant,), _, _ = build(run.command(str(tmp_path), script.STUDIES)[3:])
        config = make_config(variant, settings, str(tmp_path / "out")).to_dict()
        return {k: v for k, v in dataclasses.asdict(settings).items() if k != "out"}, config

    clip = built(script.Run("methods", f"{script.METHODS_BASE} kl_adaptation_method=clip", 1))
    none = built(script.Run("length", script.METHODS_BASE, 1))
    assert clip[1]["kl_adaptation_method"] == "clip" != none[1]["kl_adaptation_method"]
    at_64 = built(script.Run("beta", "beta=0.2", 1))
    assert at_64[1]["max_completion_length"] != none[1]["max_completion_length"]


def test_a_studys_phases_run_after_every_seed_of_the_variants_before_them(script):
    studies = {"s": {"variants": ["a", "b", "c", "d"], "phases": [["b"], ["d"]], "seeds": "0,1", "args": []}}
    order = [(run.variant, run.seed) for run in script.planned_runs(studies, ["s"])]
    assert order == [("a", 0), ("c", 0), ("a", 1), ("c", 1), ("b", 0), ("b", 1), ("d", 0), ("d", 1)]
    methods = script.planned_runs(script.STUDIES, ["methods"])
    new = [run for run in methods if script.source_run(run, script.STUDIES) == run]
    assert [run.seed for run in new[:9]] == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # seeds 0-2 of clip, sigmoid, dynamic first
    assert {run.variant for run in new[-5:]} == {script.METHODS_SATURATION}


# A study that reuses one variant of another's: its runs are made (once) in that study, and its summary counts them.
REUSING = {
    **TINY,
    "reusing": {
        "variants": ["beta=0.1 kl_estimator=k2", "beta=0.1 kl_estimator=k3"],
        "reused": {"beta=0.1 kl_estimator=k2": ("tiny", "beta=0.1 kl_estimator=k2")},
        "args": TINY["tiny"]["args"],
    },
}


def test_a_reused_variant_is_run_once_in_its_own_study_and_summarized_in_both(script, tmp_path, capsys):
    out = str(tmp_path / "studies")
    assert script.main(["--only", "reusing", "--seeds", "0", "--out", out], studies=REUSING) == 0
    assert "2 runs to do" in capsys.readouterr().out
    reused, own = script.planned_runs(REUSING, ["reusing"], [0])
    assert not os.path.exists(os.path.join(script.REPOSITORY, reused.directory(out)))
    assert script.finished(script.source_run(reused, REUSING), out) and script.finished(own, out)
    summary = open(os.path.join(out, "reusing", "summary.md")).read()
    assert "Seeds so far: beta=0.1, kl_estimator=k2: 1; beta=0.1, kl_estimator=k3: 1." in summary
    assert "Reused, not rerun: beta=0.1, kl_estimator=k2 is the `tiny` study's beta=0.1, kl_estimator=k2" in summary
    # Started again, by either study: nothing is redone.
    assert script.main(["--seeds", "0", "--variants", "beta=0.1 kl_estimator=k2", "--out", out], studies=REUSING) == 0
    assert "0 runs to do" in capsys.readouterr().out


# A frontier study on fabricated runs (no training): constant β at 0 and 0.1, one method, 3 seeds.
FRONTIER = {
    "front": {
        "variants": ["beta=0", "beta=0.1", "beta=0.1 kl_adaptation_method=clip"],
        "frontier": {"line": ["beta=0", "beta=0.1"], "x": "final_kl_to_start", "y": "late_reward",
                     "secondary": ["delta_retention"]},
        "args": TINY["tiny"]["args"],
        "seeds": "0,1,2",
    }
}  # fmt: skip


def test_a_frontier_study_summary_reads_its_methods_against_the_line_and_lists_its_commits(script, tmp_path):
    pytest.importorskip("matplotlib")
    from test_frontier import fake

    out = str(tmp_path / "studies")
    points = {"beta=0": (1.0, 1.0), "beta=0.1": (0.2, 0.6), "beta=0.1 kl_adaptation_method=clip": (0.6, 0.9)}
    # Where each run's code came from: commit a on most, b on one, a modified source on one, none recorded on two.
    commits = {0: "a" * 40, 1: "a" * 40, 2: "b" * 40}
    for run in script.planned_runs(FRONTIER, ["front"]):
        kl, reward = points[run.variant]
        trained = fake(run.variant, run.seed, kl, reward + 0.01 * run.seed)
        if run.variant != "beta=0":
            trained.provenance = {"seed": run.seed, "commit": commits[run.seed], "source_modified": run.seed == 1}
        directory = os.path.join(script.REPOSITORY, run.directory(out))
        os.makedirs(directory)
        save_runs([trained], directory)
    summary_path = script.summarize("front", out, FRONTIER)
    summary = open(summary_path).read()
    assert os.path.isfile(os.path.join(out, "front", script.FRONTIER_PLOT))
    assert "](frontier.png)" in summary and "## Constant β's frontier" in summary
    assert "## Methods against the frontier (primary endpoint)" in summary
    assert "## Secondary endpoints at matched drift" in summary
    # F at 0.6, halfway from (0.2, 0.6 + 0.01s) to (1.0, 1.0 + 0.01s), is 0.8 + 0.01s: D = 0.1 on every seed.
    section = summary[summary.index("## Methods against the frontier") :]
    row = next(line for line in section.splitlines() if line.startswith("| beta=0.1, kl_adaptation_method=clip |"))
    assert "+0.100 (0), +0.100 (1), +0.100 (2)" in row and "above the frontier" in row
    assert (
        "- commits of the runs (their runs.json provenance): not recorded (made before provenance was recorded) "
        "(3 runs); `aaaaaaaaaa` (4 runs); `bbbbbbbbbb` (2 runs)"
    ) in summary
    assert "- warning: the runs were made at 2 different commits (aaaaaaaaaa, bbbbbbbbbb)" in summary
    assert "- warning: 2 runs were made from source that differed from its commit (source_modified)" in summary
    # Runs all at one commit get no warning; a study without a frontier entry, no frontier section.
    assert script.provenance_lines([{"commit": "c" * 40, "source_modified": False}] * 2) == [
        "- commits of the runs (their runs.json provenance): `cccccccccc` (2 runs)"
    ]
    plain = {"front": {key: value for key, value in FRONTIER["front"].items() if key != "frontier"}}
    assert "## Constant β's frontier" not in open(script.summarize("front", out, plain)).read()


def test_a_study_beside_another_draws_both_frontiers_side_by_side(script, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image
    from test_demo import check_png
    from test_frontier import fake

    out = str(tmp_path / "studies")
    studies = {
        "front": {**FRONTIER["front"], "setting": "the first setting"},
        "second": {**FRONTIER["front"], "setting": "the second setting", "beside": "front"},
    }
    points = {"beta=0": (1.0, 1.0), "beta=0.1": (0.2, 0.6), "beta=0.1 kl_adaptation_method=clip": (0.6, 0.9)}
    for run in script.planned_runs(studies, ["front", "second"]):
        kl, reward = points[run.variant]
        directory = os.path.join(script.REPOSITORY, run.directory(out))
        os.makedirs(directory)
        save_runs([fake(run.variant, run.seed, kl, reward + 0.01 * run.seed)], directory)
    first = open(script.summarize("front", out, studies)).read()
    second = open(script.summarize("second", out, studies)).read()
    assert "## Both frontiers" not in first and not os.path.exists(os.path.join(out, "front", script.FRONTIERS_PLOT))
    assert "The `front` study's frontier (left) and this one's (right)" in second
    assert f"![Both frontiers]({script.FRONTIERS_PLOT})" in second
    # Two panels, each as wide as the study's own picture.
    single, both = (os.path.join(out, "second", plot) for plot in (script.FRONTIER_PLOT, script.FRONTIERS_PLOT))
    check_png(single)
    check_png(both)
    assert matplotlib.image.imread(both).shape[1] > 1.8 * matplotlib.image.imread(single).shape[1]


def test_every_committed_runs_provenance_is_the_command_the_runner_gives_it(script):
    """Each committed run that recorded its provenance recorded the command `execute` builds for it (the study's
    arguments, its variant, seed and directory, with checkpointing) and its seed; every run the frontier study makes
    itself recorded it."""
    assert script.provenance_problems(script.STUDIES_DIR, script.STUDIES) == []


def test_a_recorded_command_or_seed_that_is_not_the_runs_own_is_found(script, tmp_path):
    """The check above can fail: a copy of a committed run given the provenance `execute` records passes, and the
    same copy with another command (50 steps), another seed, or a frontier run of its own without provenance, or a
    directory no run has, is reported."""
    out = str(tmp_path / "real")
    run = script.Run("length", "beta=0 loss_type=grpo", 0)
    committed = os.path.join(script.REPOSITORY, run.directory(script.STUDIES_DIR))
    (trained,) = load_runs(committed)
    target = os.path.join(script.REPOSITORY, run.directory(out))
    os.makedirs(target)
    command = script.recorded_command(run, out, script.STUDIES)
    assert command.startswith("adaptive-kl compare --model smollm2 --steps 100 ") and command.endswith(
        f"--seed 0 --out {target} --no-progress --save-every 25 --resume"
    )

    def record(**changes) -> list[str]:
        trained.provenance = {"seed": 0, "command": command, "commit": "a" * 40, "source_modified": False, **changes}
        save_runs([trained], target)
        return script.provenance_problems(out, script.STUDIES)

    assert record() == []
    (problem,) = record(command=command.replace("--steps 100", "--steps 50"))
    assert (
        problem.startswith(f"{os.path.relpath(target, script.REPOSITORY)}: recorded command ")
        and "--steps 50" in problem
    )
    (problem,) = record(seed=1)
    assert problem.endswith("recorded seed 1, not 0")
    assert len(record(command="adaptive-kl compare", seed=3)) == 2
    assert record() == []

    # A run the frontier study makes itself must have provenance; a reused one (made before it existed) need not.
    own = script.Run("frontier", "beta=0.02 loss_type=grpo", 0)
    assert script.source_run(own, script.STUDIES) == own
    directory = os.path.join(script.REPOSITORY, own.directory(out))
    os.makedirs(directory)
    trained.provenance = {}
    save_runs([trained], directory)
    (problem,) = script.provenance_problems(out, script.STUDIES)
    assert (
        problem == f"{os.path.relpath(directory, script.REPOSITORY)}: no provenance in runs.json (made by `frontier`)"
    )
    os.remove(os.path.join(directory, "runs.json"))

    stray = os.path.join(out, "length", "runs", "beta_0.3__loss_type_grpo", "seed-0")
    os.makedirs(stray)
    save_runs([trained], stray)
    (problem,) = script.provenance_problems(out, script.STUDIES)
    assert problem.endswith("beta_0.3__loss_type_grpo/seed-0: no run of the studies has this directory")


def test_the_stepwise_arms_target_is_the_stated_rule_on_the_committed_runs(script):
    """Step 2's controller target, stated before its runs: the mean `adaptive_kl/raw_kl` over every logged step of
    β = 0.05's seeds 0-2, to 3 significant digits, recomputed from the committed runs; both step-2 arms run after
    every seed of step 1."""
    values = []
    for seed in (0, 1, 2):
        run = script.Run("frontier", "beta=0.05 loss_type=grpo", seed)
        (trained,) = load_runs(os.path.join(script.REPOSITORY, run.directory(script.STUDIES_DIR)))
        values += [entry["adaptive_kl/raw_kl"] for entry in trained.history if "adaptive_kl/raw_kl" in entry]
    assert len(values) == 300
    assert script.FRONTIER_TARGET_KL == f"{sum(values) / len(values):.3g}"
    frontier = script.STUDIES["frontier"]
    assert f"target_kl={script.FRONTIER_TARGET_KL}" in script.FRONTIER_STEPWISE
    assert frontier["phases"][0] == script.FRONTIER_STEP_2 == frontier["variants"][-4:-2]


def test_the_second_frontiers_controller_target_and_order_are_the_stated_ones(script):
    """The second frontier's target-KL rule, stated before its runs: the mean `adaptive_kl/raw_kl` over every logged
    step of β = 0.04's seeds 0-2 (the β study's runs, reused), to 3 significant digits; its line runs before its
    methods, every β's seeds 0-2 before seeds 3-4, and the methods before `sigmoid`."""
    values = []
    for seed in (0, 1, 2):
        run = script.source_run(script.Run("frontier_sum", "beta=0.04", seed), script.STUDIES)
        assert run.study == "beta"
        (trained,) = load_runs(os.path.join(script.REPOSITORY, run.directory(script.STUDIES_DIR)))
        values += [entry["adaptive_kl/raw_kl"] for entry in trained.history if "adaptive_kl/raw_kl" in entry]
    assert len(values) == 300
    assert script.SUM_TARGET_KL == f"{sum(values) / len(values):.3g}"
    order = [(run.variant, run.seed) for run in script.planned_runs(script.STUDIES, ["frontier_sum"])]
    line = [(variant, seed) for seed in range(5) for variant in script.SUM_LINE]
    assert order[: len(line)] == line
    assert {variant for variant, _ in order[len(line) : len(line) + 20]} == set(script.SUM_METHODS)
    assert f"target_kl={script.SUM_TARGET_KL}" in script.SUM_STEPWISE
    assert {variant for variant, _ in order[-5:]} == {script.SUM_SIGMOID}
    settings = script.STUDIES["frontier_sum"]
    assert settings["args"] == script.STUDIES["beta"]["args"] and settings["frontier"]["line"] == script.SUM_LINE


def test_the_bounded_controllers_arms_are_new_commands_at_the_stated_horizon(script, tmp_path, monkeypatch):
    """Step 3's arms run after every seed of step 2's; the bounded stepwise is not step 2's command (its ceiling is
    written out), and `adaptive`'s horizon is the one the config names for 100 steps of this run's 8 sequences (where
    a horizon that cannot move β warns), at which the config does not warn that β cannot move."""
    import dataclasses
    import warnings

    monkeypatch.setattr("adaptive_kl.demo.arguments.check_model", lambda *args: None)
    frontier = script.STUDIES["frontier"]
    assert frontier["phases"][-1] == script.FRONTIER_STEP_3 == frontier["variants"][-2:]
    assert script.FRONTIER_BOUNDED_STEPWISE != script.FRONTIER_STEPWISE
    run = script.Run("frontier", script.FRONTIER_BOUNDED_ADAPTIVE, 0)
    settings, (variant,), _, _ = build(run.command(str(tmp_path), script.STUDIES)[3:])
    from adaptive_kl.demo.runner import make_config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = make_config(variant, settings, str(tmp_path))
    sequences = config.per_device_train_batch_size * config.gradient_accumulation_steps * config.world_size
    assert (config.kl_controller, config.kl_horizon, config.beta_max, config.max_steps) == ("adaptive", 35, 0.2, 100)
    assert not [w for w in caught if "kl_horizon" in str(w.message)]
    slow = dataclasses.replace(variant, overrides={**variant.overrides, "kl_horizon": 10_000})
    assert sequences == 8
    with pytest.warns(UserWarning, match=r"kl_horizon=10000 with 8 sequences .* kl_horizon=35 lets it move beta"):
        make_config(slow, settings, str(tmp_path))


def test_a_study_that_summarizes_its_own_seeds_leaves_out_runs_made_there_for_another(script, tmp_path):
    from test_frontier import fake

    out = str(tmp_path / "studies")
    study = {"front": {**FRONTIER["front"], "seeds": "0,1"}}
    for run in script.planned_runs(study, ["front"], [0, 1, 2]):  # seed 2: made for a study that reuses it
        directory = os.path.join(script.REPOSITORY, run.directory(out))
        os.makedirs(directory)
        save_runs([fake(run.variant, run.seed, 0.5, 0.5)], directory)
    counted = "Seeds so far: beta=0: {n}; beta=0.1: {n}; beta=0.1, kl_adaptation_method=clip: {n}."
    assert counted.format(n=3) in open(script.summarize("front", out, study)).read()
    own = {"front": {**study["front"], "summarizes_own_seeds_only": True}}
    assert counted.format(n=2) in open(script.summarize("front", out, own)).read()
    assert [run.seed for run in script.finished_runs("front", out, own)[0]] == [0, 1, 0, 1, 0, 1]
