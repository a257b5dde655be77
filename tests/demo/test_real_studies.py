"""`scripts/run_real_studies.py`, the runner of the real-model studies, on the tiny policy: one run per variant and
seed, finished runs skipped when started again, the summary rewritten from whatever runs exist."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
from repo_paths import REPO

from adaptive_kl.demo.arguments import build
from adaptive_kl.demo.run_files import load_runs


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


def test_a_studys_last_variants_run_after_every_seed_of_the_others(script):
    studies = {"s": {"variants": ["a", "b", "c"], "last": ["b"], "seeds": "0,1", "args": []}}
    order = [(run.variant, run.seed) for run in script.planned_runs(studies, ["s"])]
    assert order == [("a", 0), ("c", 0), ("a", 1), ("c", 1), ("b", 0), ("b", 1)]
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
