"""`scripts/run_studies.py`, the one command behind `docs/studies/`: every study it lists is a valid `adaptive-kl
compare` (the variants it names, baseline first), finished studies are skipped, and one study runs end to end."""

from __future__ import annotations

import importlib.util
import os

import pytest
from repo_paths import REPO

from adaptive_kl.demo.arguments import build


SCRIPT = os.path.join(REPO, "scripts", "run_studies.py")


@pytest.fixture(scope="module")
def studies():
    spec = importlib.util.spec_from_file_location("run_studies", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Study → (its variants without the seed, baseline first; steps per run).
EXPECTED = {
    "length": (
        [
            "loss_type=grpo",
            "loss_type=dr_grpo",
            "loss_type=grpo, kl_adaptation_method=length_normalized",
            "loss_type=grpo, kl_adaptation_method=clip",
            "loss_type=grpo, kl_placement=reward, kl_estimator=k1",
            "loss_type=grpo, kl_placement=reward, kl_estimator=k1, kl_adaptation_method=length_normalized",
        ],
        250,
    ),
    "beta": (["beta=0", "beta=0.001", "beta=0.01", "beta=0.1"], 200),
    "methods": (
        [f"kl_adaptation_method={m}" for m in ("none", "clip", "sigmoid", "length_normalized", "dynamic")],
        200,
    ),
    "scaling": ([f"kl_scaling={s}" for s in ("none", "linear", "sqrt", "log")], 200),
    "placement": (
        [
            "beta=0",
            "kl_placement=reward, kl_estimator=k1",
            "kl_placement=loss, kl_estimator=k3",
            "kl_placement=loss, kl_estimator=k2",
        ],
        200,
    ),
}


def test_every_study_is_a_valid_comparison_over_five_seeds(studies, tmp_path):
    assert list(studies.STUDIES) == list(EXPECTED)
    for name, (variants, steps) in EXPECTED.items():
        argv = studies.command(name, "0,1,2,3,4", str(tmp_path))[3:]  # after `python -m adaptive_kl`
        settings, runs, _, _ = build(argv)
        assert settings.steps == steps and settings.eval_every == 50
        assert [run.name for run in runs] == [f"{v}, seed={s}" for v in variants for s in range(5)]
    settings, runs, _, _ = build(studies.command("length", "0,1,2,3,4", str(tmp_path))[3:])
    assert settings.fixed == {"reward_weights": [1.0, 0.0], "beta": 0.3, "max_completion_length": 64}


def test_finished_studies_are_skipped(studies, tmp_path, capsys):
    for name in studies.STUDIES:
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.md").write_text("done")
    assert studies.main(["--out", str(tmp_path)]) == 0
    assert "Every study is done" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        studies.main(["--jobs", "0"])
    with pytest.raises(SystemExit):
        studies.main(["--only", "no-such-study"])


def test_a_study_runs_end_to_end(studies, tmp_path, monkeypatch):
    """The beta study on two seeds at a smoke budget: its summary records the command, versions and wall time."""
    monkeypatch.setitem(studies.STUDIES, "beta", ["--beta", "0,0.1", "--quick", "--steps", "2", "--n-validation", "8"])
    monkeypatch.setattr(studies, "SHARED", ["--eval-every", "2"])
    assert studies.main(["--only", "beta", "--seeds", "0,1", "--jobs", "1", "--out", str(tmp_path)]) == 0
    summary = (tmp_path / "beta" / "summary.md").read_text()
    assert "| beta=0.1 | 2 |" in summary and "Paired differences from beta=0" in summary
    assert "- command: `adaptive-kl compare --beta 0,0.1 --quick" in summary and "- wall time: " in summary
    assert (tmp_path / "beta" / "run.log").exists()
