"""`AdaptiveKLRLOOTrainer`'s reference: resets (`ref_reset_steps`, `ref_reset_kl`, `ref_reset_optimizer`) and the
reference skipped while β is 0 (`skip_zero_beta_reference`, `kl_monitor_steps`), wired as in the GRPO trainer.

Resets, on the tiny model (full model and LoRA): right after a reset the reference is bit for bit the policy and the
next step's KL is 0; the KL trigger fires after the steps above it; Adam restarts with `ref_reset_optimizer`; a run
resumed from a checkpoint resets at the uninterrupted run's steps and measures its KL. The skip: each case trains
twice from the same seed, with and without it (`dynamic` with `beta_min = 0` switches β to 0 at
`beta_schedule_steps`), counts the reference forwards of each optimizer step, and compares every logged number but
the KL ones, and the trained weights, bit for bit (the RLOO penalty is β_t·Σ f(k) = 0 either way, and the advantages
are recomputed from the same rewards). The GRPO trainer's own tests: `test_reference_resets.py`, `test_zero_beta.py`.
"""

from __future__ import annotations

import logging
import math
import os

import pytest
import torch
from checkpoint_worker import indexed_reward
from peft import LoraConfig
from test_forward_passes import ForwardCounter
from tiny import ZERO_BETA_RUN, assert_same_run_but_the_kl, make_trainer, prompt_dataset
from transformers import TrainerCallback

from adaptive_kl import AdaptiveKLRLOOConfig, AdaptiveKLRLOOTrainer
from adaptive_kl.trainers.reference import REFERENCE_FILE
from adaptive_kl.trainers.rloo_config import GRPO_ONLY_FIELDS


LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM")
# Content-blind rewards and a high learning rate: the policy moves away from the reference at every step. k3 (>= 0 per
# token) so that "the policy has moved" reads as a KL well above 0.
RESETS_RUN = dict(beta=0.1, learning_rate=5e-2, bf16=False, max_steps=5, kl_estimator="k3")


class Snapshots(TrainerCallback):
    """The policy's trainable parameters (by name) after each optimizer step."""

    def __init__(self, trainer):
        self.trainer, self.after_step = trainer, {}

    def on_step_end(self, args, state, control, **kwargs):
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        params = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
        self.after_step[state.global_step] = params


def resets_run(model_dir, output_dir, peft_config=None, **changes):
    trainer = make_trainer(
        AdaptiveKLRLOOTrainer,
        AdaptiveKLRLOOConfig,
        model_dir,
        reward_funcs=[indexed_reward],
        peft_config=peft_config,
        output_dir=str(output_dir),
        **{**RESETS_RUN, **changes},
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


def test_the_reference_fields_are_offered():
    fields = ("ref_reset_steps", "ref_reset_kl", "ref_reset_optimizer", "skip_zero_beta_reference", "kl_monitor_steps")
    assert not set(fields) & set(GRPO_ONLY_FIELDS)
    args = AdaptiveKLRLOOConfig(output_dir="unused", use_cpu=True, report_to="none")
    defaults = (args.ref_reset_steps, args.ref_reset_kl, args.ref_reset_optimizer, args.skip_zero_beta_reference)
    assert defaults == (0, 0.0, False, True) and args.kl_monitor_steps is None


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(ref_reset_steps=-1), "ref_reset_steps must be an integer >= 0"),
        (dict(ref_reset_steps=1.5), "ref_reset_steps must be an integer >= 0"),
        (dict(ref_reset_kl=-0.1), "ref_reset_kl must be a finite number >= 0"),
        (dict(ref_reset_kl=math.inf), "ref_reset_kl must be a finite number >= 0"),
        (dict(ref_reset_optimizer=True), "ref_reset_optimizer=True clears the optimizer .* no reset is set"),
        (dict(ref_reset_optimizer="yes", ref_reset_steps=2), "ref_reset_optimizer must be True or False"),
        (dict(ref_reset_steps=2, beta=0.0), r"Reference resets \(ref_reset_steps=2.*need beta > 0"),
        (dict(ref_reset_kl=0.1, sync_ref_model=True), "sync_ref_model=True both move the reference"),
        (dict(kl_monitor_steps=-1), "kl_monitor_steps must be None"),
        (dict(kl_monitor_steps=1.5), "kl_monitor_steps must be None"),
        (dict(skip_zero_beta_reference="yes"), "skip_zero_beta_reference must be True or False"),
    ],
)
def test_bad_reference_settings_are_refused_naming_the_field(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveKLRLOOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **{"beta": 0.1, **fields})


def test_kl_monitor_steps_warns_when_nothing_skips(tmp_path):
    with pytest.warns(UserWarning, match="kl_monitor_steps=3 has no effect"):
        AdaptiveKLRLOOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", kl_monitor_steps=3)


# --- reference resets ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["full", "lora"])
def every_two_steps(request, tiny_model_dir, tmp_path_factory):
    """5 steps with `ref_reset_steps=2`: resets applied before the generation batches of steps 3 and 5."""
    peft_config = LORA if request.param == "lora" else None
    trainer, snapshots = resets_run(
        tiny_model_dir, tmp_path_factory.mktemp(request.param), peft_config, ref_reset_steps=2
    )
    trainer.train()
    return request.param, trainer, snapshots


def test_the_step_after_each_reset_measures_zero_kl(every_two_steps):
    _, trainer, _ = every_two_steps
    history = logs(trainer)
    kl = {t: history[t]["adaptive_kl/raw_kl"] for t in history}
    assert min(kl[2], kl[4]) > 1e-4  # the policy had moved away from the reference
    assert abs(kl[3]) < 1e-6 and abs(kl[5]) < 1e-6  # float noise: batch shapes differ between the two scorings
    assert abs(history[3]["kl"]) < 1e-6 and abs(history[2]["kl"]) > 1e-5  # TRL's own k1 agrees
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


def test_the_kl_trigger_resets_after_each_step_above_the_threshold(tiny_model_dir, tmp_path):
    trainer, _ = resets_run(tiny_model_dir, tmp_path, ref_reset_kl=2e-3, max_steps=6)
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
    trainer, _ = resets_run(
        tiny_model_dir, tmp_path, ref_reset_steps=2, ref_reset_optimizer=reset_optimizer, max_steps=4
    )
    trainer.train()
    steps = {state["step"].item() for state in trainer.optimizer.state.values()}
    assert steps == ({2.0} if reset_optimizer else {4.0})


@pytest.fixture(scope="module", params=["full", "lora"])
def saved_run(request, tiny_model_dir, tmp_path_factory):
    """6 steps, resets every 2 steps, a checkpoint every 2 steps: checkpoint-2 has a reset pending and none applied;
    checkpoint-4 has one applied (the policy after step 2) and one pending."""
    peft_config = LORA if request.param == "lora" else None
    output_dir = tmp_path_factory.mktemp(f"saved-{request.param}")
    fields = dict(ref_reset_steps=2, max_steps=6, save_strategy="steps", save_steps=2)
    trainer, snapshots = resets_run(tiny_model_dir, output_dir, peft_config, **fields)
    trainer.train()
    return peft_config, fields, output_dir, trainer, snapshots


@pytest.mark.parametrize("checkpoint_step", [2, 4])
def test_a_resumed_run_resets_at_the_same_steps(saved_run, tiny_model_dir, tmp_path, checkpoint_step):
    peft_config, fields, output_dir, uninterrupted, _ = saved_run
    checkpoint = output_dir / f"checkpoint-{checkpoint_step}"
    assert os.path.isfile(checkpoint / REFERENCE_FILE) == (checkpoint_step == 4)
    resumed, _ = resets_run(tiny_model_dir, tmp_path / "resumed", peft_config, **fields)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    expected, got = logs(uninterrupted, checkpoint_step + 1), logs(resumed, checkpoint_step + 1)
    assert list(got) == list(expected) == list(range(checkpoint_step + 1, 7))
    for t in got:
        for key in ("adaptive_kl/ref_resets", "adaptive_kl/ref_reset_step"):
            assert got[t][key] == expected[t][key], (t, key)
        assert got[t]["adaptive_kl/raw_kl"] == pytest.approx(expected[t]["adaptive_kl/raw_kl"], rel=1e-5, abs=1e-9)
    assert resumed.reference_resets.state_dict() == uninterrupted.reference_resets.state_dict()


def test_the_saved_reference_is_the_policy_of_the_last_reset(saved_run):
    """checkpoint-6 holds the reference in use at step 6: the policy after step 4."""
    from safetensors.torch import load_file

    peft_config, _, output_dir, _, snapshots = saved_run
    saved = load_file(output_dir / "checkpoint-6" / REFERENCE_FILE)
    if peft_config is not None:
        saved = {name.replace(".ref.", ".default."): value for name, value in saved.items()}
    assert set(saved) == set(snapshots.after_step[4])
    for name, value in snapshots.after_step[4].items():
        assert torch.equal(saved[name], value), name


def test_resuming_a_reset_run_without_resets_is_refused(saved_run, tiny_model_dir, tmp_path):
    peft_config, fields, output_dir, _, _ = saved_run
    resumed, _ = resets_run(tiny_model_dir, tmp_path / "resumed", peft_config, **{**fields, "ref_reset_steps": 0})
    with pytest.raises(ValueError, match=r"after 1 reference reset\(s\).*ref_reset_steps"):
        resumed.train(resume_from_checkpoint=str(output_dir / "checkpoint-4"))


# --- the reference skipped at β = 0 ----------------------------------------------------------------------------------


ZERO_RUN = ZERO_BETA_RUN


def zero_beta_run(model_dir, tmp_path, name, peft_config=None, **fields):
    """Trains; returns the trainer, the per-step (policy, reference) forward counts and the training log lines."""
    trainer = make_trainer(
        AdaptiveKLRLOOTrainer,
        AdaptiveKLRLOOConfig,
        model_dir,
        peft_config=peft_config,
        output_dir=str(tmp_path / name),
        **{**ZERO_RUN, **fields},
    )
    counter = ForwardCounter(trainer)
    trainer.train()
    return trainer, counter.per_step, [entry for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
def test_skipped_reference_leaves_the_run_bitwise_unchanged(tiny_model_dir, tmp_path, normalize):
    """Full fine-tuning: no reference forward from the switch on, a penalty of exactly 0, the same run; the
    reference model is freed (nothing else reads it). For each `normalize_advantages` (the leave-one-out advantages
    are recomputed, with a penalty of 0, on the skipped batches as on the others)."""
    skipped = zero_beta_run(tiny_model_dir, tmp_path, "skip", normalize_advantages=normalize)
    full = zero_beta_run(
        tiny_model_dir, tmp_path, "full", skip_zero_beta_reference=False, normalize_advantages=normalize
    )
    assert [reference for _, reference in full[1]] == [1] * 5  # one scoring per generation batch
    assert [reference for _, reference in skipped[1]] == [1, 1, 0, 0, 0]
    assert [log["adaptive_kl/reference_skipped"] for log in skipped[2]] == [0, 0, 1, 1, 1]
    assert [log["adaptive_kl/reference_skipped"] for log in full[2]] == [0] * 5
    assert [log["adaptive_kl/current_beta"] for log in skipped[2]] == [0.1, 0.1, 0, 0, 0]
    assert [log["adaptive_kl/reward_penalty"] for log in skipped[2]][2:] == [0, 0, 0]
    assert skipped[2][1]["adaptive_kl/reward_penalty"] != 0  # before the switch the penalty bites
    assert "kl" in skipped[2][1] and "kl" not in skipped[2][2]  # the host scored without its reference
    assert "adaptive_kl/raw_kl" in skipped[2][1] and "adaptive_kl/raw_kl" not in skipped[2][2]
    assert_same_run_but_the_kl(skipped, full)
    assert skipped[0].ref_model is None and full[0].ref_model is not None


@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
def test_skipped_reference_is_bitwise_on_bf16_weights(tiny_model_dir, tmp_path, normalize):
    """bf16 weights, whose log-probabilities TRL scores in float32: a skipped batch's zero penalty is in the dtype the
    full path's has (`AdaptiveKLRun._kl_penalty`), so the advantages, gradients and weights are its to the bit."""
    fields = dict(normalize_advantages=normalize, model_init_kwargs={"dtype": "bfloat16"})
    skipped = zero_beta_run(tiny_model_dir, tmp_path, "skip", **fields)
    full = zero_beta_run(tiny_model_dir, tmp_path, "full", skip_zero_beta_reference=False, **fields)
    assert {p.dtype for p in skipped[0].model.parameters()} == {torch.bfloat16}
    assert [reference for _, reference in skipped[1]] == [1, 1, 0, 0, 0]
    assert_same_run_but_the_kl(skipped, full)


def test_skipped_reference_with_lora(tiny_model_dir, tmp_path):
    """LoRA (the reference is the base, the adapter disabled): the policy's forwards drop by the reference's."""
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    skipped = zero_beta_run(tiny_model_dir, tmp_path, "skip", peft_config=lora)
    full = zero_beta_run(tiny_model_dir, tmp_path, "full", peft_config=lora, skip_zero_beta_reference=False)
    policy_skipped = [policy for policy, _ in skipped[1]]
    policy_full = [policy for policy, _ in full[1]]
    assert policy_skipped[:2] == policy_full[:2]
    assert policy_skipped[2:] == [count - 1 for count in policy_full[2:]]
    assert [log["adaptive_kl/reference_skipped"] for log in skipped[2]] == [0, 0, 1, 1, 1]
    assert_same_run_but_the_kl(skipped, full)


def test_the_kl_stays_visible_on_monitored_batches(tiny_model_dir, tmp_path):
    """kl_monitor_steps=None (logging_steps = 2): while β is 0, the first batch of each logging window is scored, so
    every log line carries adaptive_kl/raw_kl; the reference model is kept."""
    trainer, counts, logs_ = zero_beta_run(
        tiny_model_dir, tmp_path, "monitor", kl_monitor_steps=None, logging_steps=2, max_steps=8
    )
    assert [reference for _, reference in counts] == [1, 1, 1, 0, 1, 0, 1, 0]
    assert all("adaptive_kl/raw_kl" in log for log in logs_) and len(logs_) == 4
    assert [log["adaptive_kl/reference_skipped"] for log in logs_] == [0, 0.5, 0.5, 0.5]
    assert trainer.ref_model is not None


def test_kl_triggered_resets_keep_scoring_the_reference(tiny_model_dir, tmp_path):
    """ref_reset_kl reads every step's KL: no batch is skipped."""
    _, counts, logs_ = zero_beta_run(tiny_model_dir, tmp_path, "kl-resets", ref_reset_kl=100.0)
    assert [reference for _, reference in counts] == [1] * 5
    assert all(log["adaptive_kl/reference_skipped"] == 0 for log in logs_)


def test_resumed_run_past_the_switch_loads_no_reference(tiny_model_dir, tmp_path, caplog):
    """Told at construction that it resumes past the switch (`args.resume_from_checkpoint`), the trainer does not load
    the reference model, scores none, and its remaining steps equal the uninterrupted run's; where β is not 0 it
    refuses to train."""
    _, _, full_logs = zero_beta_run(tiny_model_dir, tmp_path, "run", save_strategy="steps", save_steps=2)
    checkpoint = str(tmp_path / "run" / "checkpoint-4")
    with caplog.at_level(logging.WARNING, logger="adaptive_kl.trainers.grpo"):
        resumed = make_trainer(
            AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, output_dir=str(tmp_path / "resumed"),
            resume_from_checkpoint=checkpoint, **ZERO_RUN,
        )  # fmt: skip
    assert resumed.ref_model is None and resumed.beta == resumed.args.beta == ZERO_RUN["beta"]
    assert any("the reference model is not loaded" in record.getMessage() for record in caplog.records)
    counter = ForwardCounter(resumed)
    resumed.train(resume_from_checkpoint=checkpoint)
    assert [reference for _, reference in counter.per_step] == [0]
    last = [entry for entry in resumed.state.log_history if "loss" in entry][-1]
    assert last["loss"] == full_logs[-1]["loss"] and last["adaptive_kl/reference_skipped"] == 1
    with pytest.raises(ValueError, match="Cannot train from resume_from_checkpoint=None"):
        resumed.train()


def test_evaluation_after_the_switch_skips_the_reference(tiny_model_dir, tmp_path):
    """After the switch an evaluation (8 prompts × 4 completions in batches of 4: 8 batches) scores no reference when
    the KL is not monitored, its first batch when it is."""
    for monitor, expected in ((0, (0, 1.0)), (None, (1, 7 / 8))):
        trainer = make_trainer(
            AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, output_dir=str(tmp_path / f"eval-{monitor}"),
            eval_dataset=prompt_dataset(8), per_device_eval_batch_size=4, **{**ZERO_RUN, "kl_monitor_steps": monitor},
        )  # fmt: skip
        trainer.train()
        counter = ForwardCounter(trainer)
        metrics = trainer.evaluate()
        assert counter.calls["reference"] == expected[0], monitor
        assert metrics["eval_adaptive_kl/reference_skipped"] == expected[1], monitor
