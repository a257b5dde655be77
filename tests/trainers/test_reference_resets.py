"""Reference resets (`ref_reset_steps`, `ref_reset_kl`, `ref_reset_optimizer`): the reference becomes the policy.

Checked on the tiny model: right after a reset the reference's weights are the policy's (a full model's parameters,
or a LoRA adapter copied into the frozen `"ref"` adapter, base weights untouched) and the next step measures a KL of
0; the KL trigger fires exactly after the steps whose KL exceeded it; the optimizer's state restarts with
`ref_reset_optimizer`; the controllers go on adapting β; a resumed run resets at the same steps and measures the same
KL as an uninterrupted one (checkpoints hold the reset reference); damaged or mismatched checkpoints are refused. Two
processes: `tests/trainers/test_multiprocess.py` (config "resets").
"""

from __future__ import annotations

import os

import pytest
import torch
from checkpoint_worker import indexed_reward
from peft import LoraConfig
from tiny import make_trainer
from transformers import TrainerCallback

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.trainers.reference import REFERENCE_FILE, ReferenceResets


LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM")
# Content-blind rewards and a high learning rate: the policy moves away from the reference at every step.
RUN = dict(beta=0.1, learning_rate=5e-2, bf16=False, max_steps=5)


class Snapshots(TrainerCallback):
    """The policy's trainable parameters (by name) after each optimizer step."""

    def __init__(self, trainer):
        self.trainer, self.after_step = trainer, {}

    def on_step_end(self, args, state, control, **kwargs):
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        params = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
        self.after_step[state.global_step] = params


def run(model_dir, output_dir, peft_config=None, **changes):
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        model_dir,
        reward_funcs=[indexed_reward],
        peft_config=peft_config,
        output_dir=str(output_dir),
        **{**RUN, **changes},
    )
    snapshots = Snapshots(trainer)
    trainer.add_callback(snapshots)
    return trainer, snapshots


def logs(trainer, first: int = 1) -> dict[int, dict]:
    return {h["step"]: h for h in trainer.state.log_history if "adaptive_kl/raw_kl" in h and h["step"] >= first}


def reference_of(trainer) -> dict[str, torch.Tensor]:
    """The reference's parameters, keyed by the policy parameter each one mirrors."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if trainer.ref_model is not None:
        return dict(trainer.ref_model.named_parameters())
    return {name.replace(".ref.", ".default."): p for name, p in model.named_parameters() if ".ref." in name}


@pytest.fixture(scope="module", params=["full", "lora"])
def every_two_steps(request, tiny_model_dir, tmp_path_factory):
    """5 steps with `ref_reset_steps=2` (resets applied before steps 3 and 5) and the stepwise controller; the
    reference is compared with the policy after step 4, when the run stops after step 4 (+ the pending reset)."""
    peft_config = LORA if request.param == "lora" else None
    trainer, snapshots = run(
        tiny_model_dir,
        tmp_path_factory.mktemp(request.param),
        peft_config,
        ref_reset_steps=2,
        kl_controller="stepwise",
        target_kl=1e-3,
        beta_max=1.0,  # room to raise β above its start
    )
    trainer.train()
    return request.param, trainer, snapshots


def test_the_step_after_each_reset_measures_zero_kl(every_two_steps):
    _, trainer, _ = every_two_steps
    history = logs(trainer)
    kl = {t: history[t]["adaptive_kl/raw_kl"] for t in history}
    assert min(kl[2], kl[4]) > 1e-4  # the policy had moved away from the reference
    assert abs(kl[3]) < 1e-6 and abs(kl[5]) < 1e-6  # float noise: batch shapes differ between the two scorings
    assert abs(history[3]["kl"]) < 1e-6  # TRL's own metric agrees
    assert [history[t]["adaptive_kl/ref_resets"] for t in range(1, 6)] == [0, 0, 1, 1, 2]
    assert [history[t]["adaptive_kl/ref_reset_step"] for t in range(1, 6)] == [0, 0, 2, 2, 4]
    assert trainer.reference_resets.state_dict() == {"num_resets": 2, "last_reset_step": 4, "pending": False}


def test_the_reference_holds_the_policy_of_the_last_reset(every_two_steps):
    """After step 5, the reference is bit for bit the policy after step 4 (and not the one after step 5)."""
    kind, trainer, snapshots = every_two_steps
    reference = reference_of(trainer)
    policy_after_4, policy_after_5 = snapshots.after_step[4], snapshots.after_step[5]
    assert set(policy_after_4) == set(reference)
    for name, value in policy_after_4.items():
        assert torch.equal(reference[name], value), name
    assert any(not torch.equal(reference[n], policy_after_5[n]) for n in reference)
    if kind == "lora":
        model = trainer.accelerator.unwrap_model(trainer.model)
        assert "ref" in model.peft_config and model.active_adapter == "default"
        assert all(not p.requires_grad for n, p in model.named_parameters() if ".ref." in n)
        optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
        assert all(id(p) not in optimized for n, p in model.named_parameters() if ".ref." in n)


def test_the_controller_goes_on_adapting_beta(every_two_steps):
    """Stepwise, target 1e-3: × 1.5 after a step above 1.5e-3, × 0.75 after one below 5e-4 (steps 3 and 5: KL 0)."""
    _, trainer, _ = every_two_steps
    history = logs(trainer)
    beta = 0.1
    for t in range(1, 6):
        assert history[t]["adaptive_kl/current_beta"] == pytest.approx(beta, rel=1e-9), t
        kl = history[t]["adaptive_kl/raw_kl"]
        beta *= 1.5 if kl > 1.5e-3 else 0.75 if kl < 5e-4 else 1.0
    # The reset's KL of 0 at step 3 lowers β for step 4: the controller acts on the KL to the reference in use.
    assert history[4]["adaptive_kl/current_beta"] == pytest.approx(0.75 * history[3]["adaptive_kl/current_beta"])


def test_a_new_lora_adapter_keeps_the_base_as_reference_until_the_first_reset(tiny_model_dir, tmp_path):
    """The `"ref"` adapter added for resets is a copy of the new adapter (B = 0): the same KL as TRL's adapter-disabled
    base at step 2, to float precision."""
    with_resets, _ = run(tiny_model_dir, tmp_path / "resets", LORA, ref_reset_steps=5, max_steps=2)
    with_resets.train()  # before the next trainer is built: sampling draws from the global random stream
    without, _ = run(tiny_model_dir, tmp_path / "plain", LORA, max_steps=2)
    without.train()
    assert "ref" not in without.model.peft_config
    ours, theirs = logs(with_resets), logs(without)
    assert ours[2]["adaptive_kl/raw_kl"] > 1e-4
    assert ours[2]["adaptive_kl/raw_kl"] == pytest.approx(theirs[2]["adaptive_kl/raw_kl"], rel=1e-5)


def test_the_kl_trigger_resets_after_each_step_above_the_threshold(tiny_model_dir, tmp_path):
    trainer, _ = run(tiny_model_dir, tmp_path, ref_reset_kl=2e-3, max_steps=6)
    trainer.train()
    history = logs(trainer)
    expected_resets, expected_step = 0, 0
    for t in range(1, 7):
        assert history[t]["adaptive_kl/ref_resets"] == expected_resets, t
        assert history[t]["adaptive_kl/ref_reset_step"] == expected_step, t
        if history[t]["adaptive_kl/raw_kl"] > 2e-3:
            expected_resets, expected_step = expected_resets + 1, t
    assert 0 < history[6]["adaptive_kl/ref_resets"] < 5  # fired, and not after every step
    triggered = [t for t in range(1, 6) if history[t]["adaptive_kl/raw_kl"] > 2e-3]
    assert all(abs(history[t + 1]["adaptive_kl/raw_kl"]) < 1e-6 for t in triggered)


@pytest.mark.parametrize("reset_optimizer", [False, True])
def test_ref_reset_optimizer_restarts_adam(tiny_model_dir, tmp_path, reset_optimizer):
    """Reset before step 3 of 4: Adam's step counter is 4 without the optimizer reset, 2 with it."""
    trainer, _ = run(tiny_model_dir, tmp_path, ref_reset_steps=2, ref_reset_optimizer=reset_optimizer, max_steps=4)
    trainer.train()
    steps = {state["step"].item() for state in trainer.optimizer.state.values()}
    assert steps == ({2.0} if reset_optimizer else {4.0})


# --- checkpoints --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["full", "lora"])
def saved_run(request, tiny_model_dir, tmp_path_factory):
    """6 steps, resets every 2 steps, a checkpoint every 2 steps: checkpoint-2 has a reset pending and none applied;
    checkpoint-4 has one applied (the policy after step 2) and one pending."""
    peft_config = LORA if request.param == "lora" else None
    output_dir = tmp_path_factory.mktemp(f"saved-{request.param}")
    fields = dict(ref_reset_steps=2, max_steps=6, save_strategy="steps", save_steps=2)
    trainer, snapshots = run(tiny_model_dir, output_dir, peft_config, **fields)
    trainer.train()
    return peft_config, fields, output_dir, trainer, snapshots


@pytest.mark.parametrize("checkpoint_step", [2, 4])
def test_a_resumed_run_resets_at_the_same_steps(saved_run, tiny_model_dir, tmp_path, checkpoint_step):
    peft_config, fields, output_dir, uninterrupted, _ = saved_run
    checkpoint = output_dir / f"checkpoint-{checkpoint_step}"
    assert os.path.isfile(checkpoint / REFERENCE_FILE) == (checkpoint_step == 4)
    resumed, _ = run(tiny_model_dir, tmp_path / "resumed", peft_config, **fields)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    expected, got = logs(uninterrupted, checkpoint_step + 1), logs(resumed, checkpoint_step + 1)
    assert list(got) == list(expected) == list(range(checkpoint_step + 1, 7))
    for t in got:
        for key in ("adaptive_kl/ref_resets", "adaptive_kl/ref_reset_step"):
            assert got[t][key] == expected[t][key], (t, key)
        assert got[t]["adaptive_kl/raw_kl"] == pytest.approx(expected[t]["adaptive_kl/raw_kl"], rel=1e-5, abs=1e-9)
    assert resumed.reference_resets.state_dict() == uninterrupted.reference_resets.state_dict()
    if peft_config is not None:  # the trained adapter loaded again, and `"ref"` still frozen
        model = resumed.accelerator.unwrap_model(resumed.model)
        assert all(p.requires_grad != (".ref." in n) for n, p in model.named_parameters() if "lora_" in n)


def test_the_saved_reference_is_the_policy_of_the_last_reset(saved_run):
    """checkpoint-6 holds the reference in use at step 6: the policy after step 4."""
    from safetensors.torch import load_file

    peft_config, _, output_dir, trainer, snapshots = saved_run
    saved = load_file(output_dir / "checkpoint-6" / REFERENCE_FILE)
    if peft_config is not None:
        saved = {name.replace(".ref.", ".default."): value for name, value in saved.items()}
    assert set(saved) == set(snapshots.after_step[4])
    for name, value in snapshots.after_step[4].items():
        assert torch.equal(saved[name], value), name


def test_a_checkpoint_without_the_reference_file_is_refused(saved_run, tiny_model_dir, tmp_path):
    import shutil

    peft_config, fields, output_dir, _, _ = saved_run
    checkpoint = shutil.copytree(output_dir / "checkpoint-4", tmp_path / "checkpoint-4")
    os.remove(checkpoint / REFERENCE_FILE)
    resumed, _ = run(tiny_model_dir, tmp_path / "resumed", peft_config, **fields)
    with pytest.raises(ValueError, match=f"{REFERENCE_FILE} is missing"):
        resumed.train(resume_from_checkpoint=str(checkpoint))


def test_a_damaged_reset_state_is_refused_naming_the_file(saved_run, tiny_model_dir, tmp_path):
    import json
    import shutil

    peft_config, fields, output_dir, _, _ = saved_run
    checkpoint = shutil.copytree(output_dir / "checkpoint-4", tmp_path / "checkpoint-4")
    path = checkpoint / "trainer_state.json"
    state = json.loads(path.read_text())
    state["stateful_callbacks"]["AdaptiveKLStateCallback"]["attributes"]["reference_reset_state"]["num_resets"] = -1
    path.write_text(json.dumps(state))
    resumed, _ = run(tiny_model_dir, tmp_path / "resumed", peft_config, **fields)
    with pytest.raises(ValueError, match=r"trainer_state.json.*is damaged.*num_resets=-1"):
        resumed.train(resume_from_checkpoint=str(checkpoint))


def test_resuming_a_reset_run_without_resets_is_refused(saved_run, tiny_model_dir, tmp_path):
    peft_config, fields, output_dir, _, _ = saved_run
    resumed, _ = run(tiny_model_dir, tmp_path / "resumed", peft_config, **{**fields, "ref_reset_steps": 0})
    with pytest.raises(ValueError, match=r"after 1 reference reset\(s\).*ref_reset_steps"):
        resumed.train(resume_from_checkpoint=str(output_dir / "checkpoint-4"))


# --- the state ------------------------------------------------------------------------------------------------------


def test_reset_state_round_trips_and_damage_is_named():
    resets = ReferenceResets(every_steps=3)
    resets.end_of_step(2, mean_kl=float("nan"))
    assert not resets.pending
    resets.end_of_step(3, mean_kl=0.0)
    resets.applied(3)
    copy = ReferenceResets(every_steps=3)
    copy.load_state_dict(resets.state_dict())
    assert copy == resets
    for entry, value in [("num_resets", -1), ("last_reset_step", 1.5), ("pending", "yes")]:
        with pytest.raises(ValueError, match=entry):
            copy.load_state_dict({**resets.state_dict(), entry: value})
    assert copy == resets  # unchanged by a refused load
