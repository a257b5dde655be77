"""KL that costs nothing at β = 0 (`skip_zero_beta_reference`, `kl_monitor_steps`): the reference forward is skipped
exactly when β_t is 0 for every optimizer step a generation batch serves, and nothing else changes.

Each case trains the tiny model twice from the same seed, with the skip and without it (`dynamic` with `beta_min = 0`
switches β to 0 at `beta_schedule_steps`), counts the reference forwards of each optimizer step, and compares every
logged number but the KL ones, and the trained weights, bit for bit. Why bitwise: with β_t = 0 the full path adds
0·term to the loss (and 0·∇term to the gradients), and x + 0 is x in floating point for every finite x.
"""

from __future__ import annotations

import gc
import logging
import weakref

import pytest
import torch
from peft import LoraConfig
from test_forward_passes import ForwardCounter
from tiny import ZERO_BETA_RUN, assert_same_run_but_the_kl, make_trainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.kl.aggregation import LOSS_TYPES


RUN = ZERO_BETA_RUN
LORA = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")


def train(model_dir, tmp_path, name, peft_config=None, **fields):
    """Trains; returns the trainer, the per-step (policy, reference) forward counts and the training log lines."""
    fields = {**RUN, **fields}
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        model_dir,
        peft_config=peft_config,
        output_dir=str(tmp_path / name),
        **fields,
    )
    counter = ForwardCounter(trainer)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return trainer, counter.per_step, logs


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_skipped_reference_leaves_the_run_bitwise_unchanged(tiny_model_dir, tmp_path, loss_type):
    """Full fine-tuning, KL in the loss, every loss type: no reference forward from the switch on, the same run."""
    skipped = train(tiny_model_dir, tmp_path, "skip", loss_type=loss_type)
    full = train(tiny_model_dir, tmp_path, "full", loss_type=loss_type, skip_zero_beta_reference=False)
    assert [reference for _, reference in full[1]] == [1] * 5  # one scoring per generation batch
    assert [reference for _, reference in skipped[1]] == [1, 1, 0, 0, 0]
    assert [log["adaptive_kl/reference_skipped"] for log in skipped[2]] == [0, 0, 1, 1, 1]
    assert [log["adaptive_kl/reference_skipped"] for log in full[2]] == [0] * 5
    assert [log["adaptive_kl/current_beta"] for log in skipped[2]] == [0.1, 0.1, 0, 0, 0]
    assert "adaptive_kl/raw_kl" in skipped[2][1] and "adaptive_kl/raw_kl" not in skipped[2][2]
    assert_same_run_but_the_kl(skipped, full)


@pytest.mark.parametrize("placement", ["loss", "reward"])
def test_skipped_reference_with_lora(tiny_model_dir, tmp_path, placement):
    """LoRA (the reference is the base, the adapter disabled): the policy's forwards drop by the reference's."""
    fields = dict(kl_placement=placement, kl_estimator="k1" if placement == "reward" else "k3")
    skipped = train(tiny_model_dir, tmp_path, "skip", peft_config=LORA, **fields)
    full = train(tiny_model_dir, tmp_path, "full", peft_config=LORA, skip_zero_beta_reference=False, **fields)
    policy_skipped = [policy for policy, _ in skipped[1]]
    policy_full = [policy for policy, _ in full[1]]
    assert policy_skipped[:2] == policy_full[:2]
    # from the switch on, one forward fewer per batch; with KL in the reward also the sampling policy's scoring
    fewer = 2 if placement == "reward" else 1
    assert policy_skipped[2:] == [count - fewer for count in policy_full[2:]]
    assert [log["adaptive_kl/reference_skipped"] for log in skipped[2]] == [0, 0, 1, 1, 1]
    assert_same_run_but_the_kl(skipped, full)


def test_skipped_reference_with_kl_in_the_reward(tiny_model_dir, tmp_path):
    """Full fine-tuning, KL in the reward: the penalty is 0 from the switch on, the advantages the same."""
    fields = dict(kl_placement="reward", kl_estimator="k1")
    skipped = train(tiny_model_dir, tmp_path, "skip", **fields)
    full = train(tiny_model_dir, tmp_path, "full", skip_zero_beta_reference=False, **fields)
    assert [reference for _, reference in skipped[1]] == [1, 1, 0, 0, 0]
    assert [log["adaptive_kl/reward_penalty"] for log in skipped[2]][2:] == [0, 0, 0]
    assert_same_run_but_the_kl(skipped, full)


@pytest.mark.parametrize("placement", ["loss", "reward"])
def test_skipped_reference_is_bitwise_on_bf16_weights(tiny_model_dir, tmp_path, placement):
    """bf16 weights, whose log-probabilities TRL scores in float32: a skipped batch's zero penalty is in the dtype the
    full path's penalty has (`AdaptiveKLRun._kl_penalty`), so the penalized rewards, advantages, gradients and
    weights are the full path's to the bit (a zero penalty in the weights' bf16 would round the rewards)."""
    fields = dict(
        kl_placement=placement,
        kl_estimator="k1" if placement == "reward" else "k3",
        model_init_kwargs={"dtype": "bfloat16"},
    )
    skipped = train(tiny_model_dir, tmp_path, "skip", **fields)
    full = train(tiny_model_dir, tmp_path, "full", skip_zero_beta_reference=False, **fields)
    assert {p.dtype for p in skipped[0].model.parameters()} == {torch.bfloat16}
    assert [reference for _, reference in skipped[1]] == [1, 1, 0, 0, 0]
    assert_same_run_but_the_kl(skipped, full)


def test_a_batch_that_straddles_the_switch_is_scored(tiny_model_dir, tmp_path):
    """steps_per_generation = 2: the batch generated at step 1 serves steps 1 and 2, β_2 = 0 but β_1 > 0, so it is
    scored with the reference; the batches of steps 3-4 and 5 are not."""
    fields = dict(steps_per_generation=2, beta_schedule_steps=2)
    skipped = train(tiny_model_dir, tmp_path, "skip", **fields)
    full = train(tiny_model_dir, tmp_path, "full", skip_zero_beta_reference=False, **fields)
    # a batch of 2 steps is scored in 2 forwards of per_device_train_batch_size rows
    assert [reference for _, reference in full[1]] == [2, 0, 2, 0, 2]
    assert [reference for _, reference in skipped[1]] == [2, 0, 0, 0, 0]
    assert [log["adaptive_kl/reference_skipped"] for log in skipped[2]] == [0, 0, 1, 1, 1]
    assert_same_run_but_the_kl(skipped, full)


def test_the_kl_stays_visible_on_monitored_batches(tiny_model_dir, tmp_path):
    """kl_monitor_steps=None (logging_steps = 2): while β is 0, the first batch of each logging window is scored, so
    every log line carries adaptive_kl/raw_kl, from that batch; the other batches are not scored."""
    trainer, counts, logs = train(
        tiny_model_dir, tmp_path, "monitor", kl_monitor_steps=None, logging_steps=2, max_steps=8
    )
    assert [reference for _, reference in counts] == [1, 1, 1, 0, 1, 0, 1, 0]
    assert all("adaptive_kl/raw_kl" in log for log in logs) and len(logs) == 4
    assert [log["adaptive_kl/reference_skipped"] for log in logs] == [0, 0.5, 0.5, 0.5]
    assert trainer.ref_model is not None  # monitoring keeps it


def test_explicit_monitoring_interval(tiny_model_dir, tmp_path):
    """kl_monitor_steps=3: the first batch of each window of 3 steps (steps 3, 4-6, 7-9) is scored once β is 0."""
    _, counts, _ = train(tiny_model_dir, tmp_path, "monitor", kl_monitor_steps=3, max_steps=9)
    assert [reference for _, reference in counts] == [1, 1, 1, 1, 0, 0, 1, 0, 0]


def test_full_reference_is_freed_once_beta_is_zero_for_good(tiny_model_dir, checkpointed_run, tmp_path, caplog):
    """Full fine-tuning, no monitoring, no resets: the reference model is released (no reference to it is left), the
    log says so once, and the trainer refuses to train again from a step where it would be needed, but resumes from
    one past the switch."""
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, output_dir=str(tmp_path / "free"), **RUN
    )
    reference = weakref.ref(trainer.ref_model)
    with caplog.at_level(logging.WARNING, logger="adaptive_kl.trainers.grpo"):
        trainer.train()
    gc.collect()
    assert trainer.ref_model is None and reference() is None
    messages = [r.getMessage() for r in caplog.records if "memory was freed" in r.getMessage()]
    assert len(messages) == 1 and "optimizer step 3" in messages[0]
    with pytest.raises(ValueError, match="from resume_from_checkpoint=None: this trainer holds no reference model"):
        trainer.train()
    run_dir, full_logs = checkpointed_run
    trainer.train(resume_from_checkpoint=str(run_dir / "checkpoint-4"))
    assert trainer.state.log_history[-2]["loss"] == full_logs[-1]["loss"]  # the last entry is the run's summary


@pytest.mark.parametrize(
    "fields",
    [dict(kl_monitor_steps=None), dict(ref_reset_steps=100), dict(skip_zero_beta_reference=False)],
    ids=["monitored", "resets", "no-skip"],
)
def test_reference_kept_while_something_needs_it(tiny_model_dir, tmp_path, fields):
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, output_dir=str(tmp_path / "keep"),
        **{**RUN, **fields},
    )  # fmt: skip
    trainer.train()
    assert trainer.ref_model is not None


def test_kl_triggered_resets_keep_scoring_the_reference(tiny_model_dir, tmp_path):
    """ref_reset_kl reads every step's KL: no batch is skipped."""
    _, counts, logs = train(tiny_model_dir, tmp_path, "kl-resets", ref_reset_kl=100.0)
    assert [reference for _, reference in counts] == [1] * 5
    assert all(log["adaptive_kl/reference_skipped"] == 0 for log in logs)


@pytest.fixture(scope="module")
def checkpointed_run(tiny_model_dir, tmp_path_factory):
    """The full-fine-tuning run with a checkpoint after every step: its directory and its training log lines."""
    base = tmp_path_factory.mktemp("checkpointed")
    _, _, logs = train(tiny_model_dir, base, "run", save_strategy="steps", save_steps=1)
    return base / "run", logs


def resumable_trainer(model_dir, output_dir, checkpoint=None, eval_dataset=None, **fields):
    """A trainer with the checkpointed run's settings, told `args.resume_from_checkpoint=checkpoint`."""
    return make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, model_dir, eval_dataset=eval_dataset,
        output_dir=str(output_dir), resume_from_checkpoint=checkpoint, **{**RUN, **fields},
    )  # fmt: skip


@pytest.mark.parametrize("told", [False, True], ids=["told-in-train", "told-in-args"])
def test_resumed_run_past_the_switch_keeps_skipping(tiny_model_dir, checkpointed_run, tmp_path, caplog, told):
    """A run resumed from a checkpoint saved after the switch scores no reference, and its remaining steps equal the
    uninterrupted run's. Told at construction (`args.resume_from_checkpoint`, which `adaptive-kl grpo` passes on to
    `train`), the trainer does not even load the reference model; told only in `train`, it frees it."""
    run_dir, full_logs = checkpointed_run
    checkpoint = str(run_dir / "checkpoint-4")
    with caplog.at_level(logging.WARNING, logger="adaptive_kl.trainers.grpo"):
        resumed = resumable_trainer(tiny_model_dir, tmp_path, checkpoint if told else None)
        assert (resumed.ref_model is None) == told
        assert resumed.beta == resumed.args.beta == RUN["beta"]  # TRL's β, 0 only while its __init__ ran
        counter = ForwardCounter(resumed)
        resumed.train(resume_from_checkpoint=checkpoint)
    assert [reference for _, reference in counter.per_step] == [0]
    assert resumed.ref_model is None
    last = [entry for entry in resumed.state.log_history if "loss" in entry][-1]
    assert last["loss"] == full_logs[-1]["loss"] and last["adaptive_kl/reference_skipped"] == 1
    said = "the reference model is not loaded" if told else "its memory was freed"
    assert [said in record.getMessage() for record in caplog.records].count(True) == 1


@pytest.mark.parametrize(
    "checkpoint,fields",
    [
        ("checkpoint-1", {}),
        ("checkpoint-4", dict(kl_monitor_steps=None)),
        ("checkpoint-4", dict(ref_reset_steps=100)),
        ("checkpoint-4", dict(skip_zero_beta_reference=False)),
    ],
    ids=["before-the-switch", "monitored", "resets", "no-skip"],
)
def test_a_resume_loads_the_reference_where_it_may_be_scored(
    tiny_model_dir, checkpointed_run, tmp_path, checkpoint, fields
):
    run_dir, _ = checkpointed_run
    trainer = resumable_trainer(tiny_model_dir, tmp_path, str(run_dir / checkpoint), **fields)
    assert trainer.ref_model is not None


def test_a_trainer_without_reference_refuses_what_needs_it(tiny_model_dir, checkpointed_run, tmp_path):
    """Built for a resume from step 2 (β is 0 from step 3 on: the first checkpoint past the switch), the trainer
    holds no reference, and refuses clearly to train or evaluate where β is not 0."""
    from tiny import prompt_dataset

    run_dir, _ = checkpointed_run
    trainer = resumable_trainer(
        tiny_model_dir, tmp_path, str(run_dir / "checkpoint-2"), eval_dataset=prompt_dataset(8),
        per_device_eval_batch_size=4,
    )  # fmt: skip
    assert trainer.ref_model is None
    with pytest.raises(ValueError, match="Optimizer step 1 needs the reference model .* but this trainer holds no"):
        trainer.evaluate()
    for resume in (None, str(run_dir / "checkpoint-1")):
        with pytest.raises(ValueError, match="Cannot train from resume_from_checkpoint=.*saved at step 2 or later"):
            trainer.train(resume_from_checkpoint=resume)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(kl_monitor_steps=-1), "kl_monitor_steps must be None"),
        (dict(kl_monitor_steps=1.5), "kl_monitor_steps must be None"),
        (dict(skip_zero_beta_reference="yes"), "skip_zero_beta_reference must be True or False"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveKLGRPOConfig(output_dir=str(tmp_path), beta=0.1, **fields)


@pytest.mark.parametrize("monitor,expected", [(0, (0, 1.0)), (None, (1, 7 / 8))], ids=["unmonitored", "monitored"])
def test_evaluation_after_the_switch(tiny_model_dir, tmp_path, monitor, expected):
    """Evaluation decides for itself, at the step it would precede: after the switch its batches are not scored with
    the reference, but the first batch of each evaluation (of 8: 8 prompts × 4 completions in batches of 4) when
    the KL is monitored."""
    from tiny import prompt_dataset

    trainer = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, output_dir=str(tmp_path / "eval"),
        eval_dataset=prompt_dataset(8), per_device_eval_batch_size=4, **{**RUN, "kl_monitor_steps": monitor},
    )  # fmt: skip
    trainer.train()
    counter = ForwardCounter(trainer)
    for _ in range(2):  # each evaluation decides afresh
        metrics = trainer.evaluate()
        assert counter.calls["reference"] == expected[0]
        assert metrics["eval_adaptive_kl/reference_skipped"] == expected[1]
        counter.calls["reference"] = 0
