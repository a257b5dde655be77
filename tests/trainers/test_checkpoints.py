"""Checkpoints never silently lose β: real killed runs resume on the uninterrupted trajectory; damaged checkpoints and
stock TRL checkpoints are refused naming the file, or, with `resume_without_kl_state=True`, resumed with β started
afresh; and every save after such a resume is complete.

The killed run is a separate process (`tests/checkpoint_worker.py`) that SIGKILLs itself inside step 4, after
checkpoint-3 was written.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import warnings

import pytest
from checkpoint_worker import RUN, agreeing_reward
from repo_paths import TESTS
from tiny import make_trainer
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer


WORKER = os.path.join(TESTS, "checkpoint_worker.py")
STATE_KEY = "AdaptiveKLStateCallback"


def build(model_dir, output_dir, cls=AdaptiveKLGRPOTrainer, config_cls=AdaptiveKLGRPOConfig, **changes):
    """The worker's run (for stock TRL, its fields that `GRPOConfig` has) with `changes`."""
    fields = {k: v for k, v in {**RUN, **changes}.items() if k in config_cls.__dataclass_fields__}
    return make_trainer(
        cls, config_cls, model_dir, reward_funcs=[agreeing_reward], output_dir=str(output_dir), **fields
    )


def betas(trainer, first: int = 1) -> dict[int, float]:
    """The logged β of the steps from `first` on (a resumed run's history starts with the checkpoint's)."""
    logs = [h for h in trainer.state.log_history if "loss" in h and h["step"] >= first]
    return {h["step"]: h["adaptive_kl/current_beta"] for h in logs}


def trainer_state(checkpoint) -> dict:
    with open(os.path.join(checkpoint, "trainer_state.json")) as f:
        return json.load(f)


def checkpoints(output_dir) -> list[str]:
    return sorted((d for d in os.listdir(output_dir) if d.startswith("checkpoint-")), key=lambda d: int(d[11:]))


@pytest.fixture(scope="module")
def killed_run(tiny_model_dir, tmp_path_factory):
    """The output directory of a run killed (SIGKILL) inside step 4, with checkpoints 1–3."""
    output_dir = tmp_path_factory.mktemp("killed") / "run"
    result = subprocess.run(
        [sys.executable, WORKER, tiny_model_dir, str(output_dir), "4"],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert checkpoints(output_dir) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    return output_dir


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    trainer = build(tiny_model_dir, tmp_path_factory.mktemp("uninterrupted"))
    trainer.train()
    return trainer


@pytest.fixture
def checkpoint(killed_run, tmp_path):
    """A private copy of the killed run's last checkpoint, to damage."""
    return str(shutil.copytree(killed_run / "checkpoint-3", tmp_path / "checkpoint-3"))


def edit_state(checkpoint, edit) -> None:
    state = trainer_state(checkpoint)
    edit(state)
    with open(os.path.join(checkpoint, "trainer_state.json"), "w") as f:
        json.dump(state, f)  # NaN and Infinity as Python writes them


# --- a killed run ---------------------------------------------------------------------------------------------------


def test_a_killed_run_resumes_on_the_uninterrupted_trajectory(killed_run, uninterrupted, tiny_model_dir, tmp_path):
    """Resumed from the killed run's checkpoint-3, β at steps 4–6 and the final controller state are bitwise those of
    a run that was never interrupted: the adaptive controller moved β from the measured KL, held it after the step
    whose groups all agreed and stopped it at its ceiling, and the resumed run goes on from where it held."""
    saved = trainer_state(killed_run / "checkpoint-3")["stateful_callbacks"][STATE_KEY]["attributes"]
    assert saved["controller_state"]["last_step"] == 3
    assert saved["controller_state"]["num_held_updates"] == 1
    assert saved["controller_state"]["beta_base"] != RUN["beta"]  # β moved: a restart at beta would show
    resumed = build(tiny_model_dir, tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(killed_run / "checkpoint-3"))
    expected = betas(uninterrupted)
    move = 0.2 * 4 / RUN["kl_horizon"]  # the clipped error × 4 sequences a step / H: 5%
    fallen = RUN["beta"] * (1 - move)  # step 1's KL is 0
    assert expected == pytest.approx(
        {
            1: RUN["beta"],
            2: fallen,
            3: fallen,
            4: fallen * (1 + move),
            5: fallen * (1 + move) ** 2,
            6: RUN["beta_max"],
        },
        rel=1e-12,
    )
    assert betas(resumed, first=4) == {t: expected[t] for t in (4, 5, 6)}
    assert resumed.beta_controller.state_dict() == uninterrupted.beta_controller.state_dict()
    assert uninterrupted.beta_controller.state_dict()["num_held_updates"] == 1


def test_resume_true_finds_the_last_checkpoint_of_the_killed_run(killed_run, uninterrupted, tiny_model_dir, tmp_path):
    output_dir = shutil.copytree(killed_run, tmp_path / "run")
    resumed = build(tiny_model_dir, output_dir)
    resumed.train(resume_from_checkpoint=True)
    assert betas(resumed, first=4) == pytest.approx({t: betas(uninterrupted)[t] for t in (4, 5, 6)}, rel=1e-9)


# --- damaged checkpoints ---------------------------------------------------------------------------------------------


def test_a_checkpoint_without_our_state_is_refused_before_training(checkpoint, tiny_model_dir, tmp_path):
    edit_state(checkpoint, lambda state: state["stateful_callbacks"].pop(STATE_KEY))
    trainer = build(tiny_model_dir, tmp_path / "out")
    with pytest.raises(ValueError) as error:
        trainer.train(resume_from_checkpoint=checkpoint)
    message = str(error.value)
    assert os.path.join(checkpoint, "trainer_state.json") in message
    assert "has no adaptive-KL controller state" in message and "resume_without_kl_state=True" in message
    assert f"beta={RUN['beta']}" in message
    assert trainer.state.global_step == 0 and checkpoints(tmp_path / "out") == []  # refused before anything ran


def test_a_checkpoint_without_trainer_state_is_refused(checkpoint, tiny_model_dir, tmp_path):
    os.remove(os.path.join(checkpoint, "trainer_state.json"))
    with pytest.raises(ValueError, match=r"trainer_state\.json does not exist.*resume_without_kl_state=True"):
        build(tiny_model_dir, tmp_path / "out").train(resume_from_checkpoint=checkpoint)


def test_a_checkpoint_whose_state_is_not_json_is_refused(checkpoint, tiny_model_dir, tmp_path):
    path = os.path.join(checkpoint, "trainer_state.json")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text[: len(text) // 2])  # cut off mid-write
    with pytest.raises(ValueError, match=f"Cannot read the checkpoint state {path}"):
        build(tiny_model_dir, tmp_path / "out").train(resume_from_checkpoint=checkpoint)


@pytest.mark.parametrize(
    "entry,value",
    [
        ("beta_base", math.nan),
        ("beta_base", math.inf),
        ("beta_base", -0.5),
        ("beta_base", "0.2"),
        ("beta_base", None),
        ("last_step", -1),
        ("last_step", 2.5),
        ("num_decays", -3),
        ("num_skipped_updates", math.inf),
        ("num_skipped_updates", True),
    ],
)
def test_damaged_saved_values_are_refused_naming_the_file(checkpoint, tiny_model_dir, tmp_path, entry, value):
    def damage(state):
        state["stateful_callbacks"][STATE_KEY]["attributes"]["controller_state"][entry] = value

    edit_state(checkpoint, damage)
    trainer = build(tiny_model_dir, tmp_path / "out", resume_without_kl_state=True)  # no opt-in for a damaged state
    with pytest.raises(ValueError) as error:
        trainer.train(resume_from_checkpoint=checkpoint)
    message = str(error.value)
    assert message.startswith(os.path.join(checkpoint, "trainer_state.json")), message
    assert f"{entry}={value!r}" in message and "is damaged" in message
    assert trainer.state.global_step == 0


def test_an_empty_saved_state_is_refused(checkpoint, tiny_model_dir, tmp_path):
    edit_state(checkpoint, lambda s: s["stateful_callbacks"][STATE_KEY]["attributes"]["controller_state"].clear())
    with pytest.raises(ValueError, match="is damaged: .*beta_base=None"):
        build(tiny_model_dir, tmp_path / "out").train(resume_from_checkpoint=checkpoint)


@pytest.mark.parametrize("value", [-1, 2.5, "3", True])
def test_a_damaged_global_step_is_refused_naming_the_file(checkpoint, tiny_model_dir, tmp_path, value):
    """The step β's trajectory resumes from (and whether β is 0 for good there) is read from `global_step`."""
    edit_state(checkpoint, lambda state: state.update(global_step=value))
    message = rf"trainer_state\.json: global_step is {re.escape(repr(value))}, not a whole number"
    with pytest.raises(ValueError, match=message):
        build(tiny_model_dir, tmp_path / "out").train(resume_from_checkpoint=checkpoint)


# --- opting in: β afresh, and complete saves -------------------------------------------------------------------------


def test_opting_in_starts_beta_afresh_and_every_later_save_is_complete(checkpoint, tiny_model_dir, tmp_path):
    """`resume_without_kl_state=True` on a checkpoint without our state: a warning, β restarts at `beta` at step 4,
    and checkpoints 4–6 each carry trainer_state.json with the controller state (the bug was a KeyError at the first
    save, which left a checkpoint without trainer_state.json). Resuming from one of them needs no opt-in and continues
    the trajectory."""
    edit_state(checkpoint, lambda state: state["stateful_callbacks"].pop(STATE_KEY))
    fresh = build(tiny_model_dir, tmp_path / "fresh", resume_without_kl_state=True)
    with pytest.warns(UserWarning, match=r"β starts afresh at beta=0\.2"):
        fresh.train(resume_from_checkpoint=checkpoint)
    assert betas(fresh, first=4)[4] == RUN["beta"]
    assert checkpoints(tmp_path / "fresh") == ["checkpoint-4", "checkpoint-5", "checkpoint-6"]
    for name in checkpoints(tmp_path / "fresh"):
        saved = trainer_state(tmp_path / "fresh" / name)["stateful_callbacks"][STATE_KEY]
        assert saved["attributes"]["controller_state"]["last_step"] == int(name[11:])
    again = build(tiny_model_dir, tmp_path / "again")
    again.train(resume_from_checkpoint=str(tmp_path / "fresh" / "checkpoint-5"))
    assert betas(again)[6] == pytest.approx(betas(fresh)[6], rel=1e-9)


# --- stock TRL checkpoints -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stock_checkpoint(tiny_model_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("stock")
    stock = build(tiny_model_dir, output_dir, GRPOTrainer, GRPOConfig, beta=0.2, max_steps=2)
    stock.train()
    assert STATE_KEY not in trainer_state(output_dir / "checkpoint-2")["stateful_callbacks"]
    return str(output_dir / "checkpoint-2")


def test_a_stock_trl_checkpoint_is_refused_when_beta_adapts(stock_checkpoint, tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="saved by stock TRL's GRPOTrainer, or is damaged"):
        build(tiny_model_dir, tmp_path / "out").train(resume_from_checkpoint=stock_checkpoint)
    ours = build(tiny_model_dir, tmp_path / "opt-in", resume_without_kl_state=True)
    with pytest.warns(UserWarning, match="β starts afresh"):
        ours.train(resume_from_checkpoint=stock_checkpoint)
    assert betas(ours, first=3)[3] == RUN["beta"] and sorted(betas(ours, first=3)) == [3, 4, 5, 6]
    for name in checkpoints(tmp_path / "opt-in"):
        assert STATE_KEY in trainer_state(tmp_path / "opt-in" / name)["stateful_callbacks"], name


def test_a_stock_trl_checkpoint_resumes_when_beta_is_fixed(stock_checkpoint, tiny_model_dir, tmp_path):
    """A fixed β is a function of the step: nothing can be lost, so a stock checkpoint resumes without opt-in or
    warning, with β_t of the step schedule, and the saves that follow are complete."""
    fixed = dict(kl_controller="fixed", kl_adaptation_method="clip", kl_scaling="sqrt")
    ours = build(tiny_model_dir, tmp_path / "fixed", **fixed)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*afresh", category=UserWarning)
        ours.train(resume_from_checkpoint=stock_checkpoint)
    assert betas(ours, first=3) == pytest.approx({t: RUN["beta"] / math.sqrt(t) for t in (3, 4, 5, 6)}, rel=1e-12)
    assert checkpoints(tmp_path / "fixed") == [f"checkpoint-{t}" for t in (3, 4, 5, 6)]
    for name in checkpoints(tmp_path / "fixed"):
        assert STATE_KEY in trainer_state(tmp_path / "fixed" / name)["stateful_callbacks"], name
