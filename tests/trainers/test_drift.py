"""The drift controller (`kl_controller="drift"`) in training on the tiny model: it measures the frontier's drift, β
follows its rule, a resumed run measures the checkpoint's texts and follows the uninterrupted run, and bad input is
refused before training. GRPO with full fine-tuning and with LoRA, and RLOO; two processes are
test_multiprocess.py's `drift`, SmolLM2 test_real_model.py's."""

from __future__ import annotations

import json
import math

import pytest
from datasets import Dataset
from peft import LoraConfig
from tiny import TRAIN_KWARGS, make_trainer, prompt_dataset, reference_drift_beta

from adaptive_kl import (
    AdaptiveKLGRPOConfig,
    AdaptiveKLGRPOTrainer,
    AdaptiveKLRLOOConfig,
    AdaptiveKLRLOOTrainer,
    RetentionCallback,
)
from adaptive_kl.trainers.callbacks import DRIFT_BATCH_SIZE


# Held-out texts of the training prompts' form: 10 rows, so that a measurement takes two forwards of DRIFT_BATCH_SIZE.
HELD_OUT = Dataset.from_dict(
    {"prompt": [f"{i}*{i % 4}=" for i in range(10)], "completion": [str(i * (i % 4)) + " ok" for i in range(10)]}
)
DRIFT = dict(
    beta=0.1, beta_max=1.0, kl_controller="drift", target_drift=0.05, drift_every=2, max_steps=6, learning_rate=5e-2
)
TRAINERS = {
    "grpo": (AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig),
    "rloo": (AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig),
}
LORA = LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules="all-linear")


def drift_trainer(model_dir, output_dir, trainer="grpo", eval_dataset=HELD_OUT, peft_config=None, **kwargs):
    cls, config_cls = TRAINERS[trainer]
    fields = {**DRIFT, **kwargs}
    return make_trainer(
        cls, config_cls, model_dir, eval_dataset=eval_dataset, peft_config=peft_config, output_dir=output_dir, **fields
    )


def logged(trainer, key) -> dict[int, float]:
    return {h["step"]: h[key] for h in trainer.state.log_history if key in h}


@pytest.mark.parametrize(("trainer", "lora"), [("grpo", False), ("grpo", True), ("rloo", False)])
def test_drift_is_the_frontier_drift_and_beta_follows_the_rule(tiny_model_dir, tmp_path, trainer, lora):
    """The logged drift is, to the bit, `RetentionCallback`'s exact KL to the policy it recorded at train begin on the
    same texts (the frontier's drift), measured after steps 2, 4 and 6; β of each step is the rule replayed here on
    those drifts; with LoRA the start is the adapter switched off (no reference model)."""
    run = drift_trainer(tiny_model_dir, str(tmp_path / "out"), trainer, peft_config=LORA if lora else None)
    retention = RetentionCallback(run, HELD_OUT, eval_steps=2, batch_size=DRIFT_BATCH_SIZE, kl_to_start=True)
    run.add_callback(retention)
    run.train()
    drifts, targets = logged(run, "adaptive_kl/drift"), logged(run, "adaptive_kl/drift_target")
    assert list(drifts) == list(targets) == [2, 4, 6]
    assert drifts == {entry["step"]: entry["retention/kl_to_start"] for entry in retention.history if entry["step"]}
    assert min(drifts.values()) > 0  # the policy moved
    assert (run.ref_model is None) is lora

    beta, expected, measured = DRIFT["beta"], {}, []
    for step in range(1, DRIFT["max_steps"] + 1):
        expected[step] = beta
        if step in drifts:
            path = DRIFT["target_drift"] * (step / DRIFT["max_steps"]) ** 0.25
            assert targets[step] == pytest.approx(path, rel=1e-12)
            measured.append((step, drifts[step]))
            beta = reference_drift_beta(
                measured,
                beta=DRIFT["beta"],
                beta_min=0.0,
                beta_max=DRIFT["beta_max"],
                target_drift=DRIFT["target_drift"],
                max_steps=DRIFT["max_steps"],
            )
    assert logged(run, "adaptive_kl/current_beta") == pytest.approx(expected, rel=1e-12)
    assert len(set(expected.values())) > 1, "β never moved: the run does not exercise the controller"
    assert run.beta_controller.drifts == [[t, drifts[t], targets[t]] for t in drifts]


@pytest.mark.parametrize("restore_callbacks", [False, True])
def test_resumed_run_measures_the_checkpoints_texts_and_follows_the_uninterrupted_run(
    tiny_model_dir, tmp_path, restore_callbacks
):
    """Without completions the texts are the starting policy's greedy answers; a checkpoint keeps them as token ids
    with the measurements, and a run resumed from it (given other prompts) measures them, with the uninterrupted
    run's drifts and β to the bit, also where Transformers re-instantiates the state callback
    (`restore_callback_states_from_checkpoint`)."""
    common = dict(save_strategy="steps", save_steps=3, eval_dataset=prompt_dataset(6))
    full = drift_trainer(tiny_model_dir, str(tmp_path / "full"), **common)
    full.train()
    texts = full.callback_handler.callbacks[-1].state_dict()
    assert len(texts) == 6 and all(completion for _, completion in texts)
    with open(tmp_path / "full" / "checkpoint-3" / "trainer_state.json") as f:
        saved = json.load(f)["stateful_callbacks"]["AdaptiveKLStateCallback"]["attributes"]
    assert saved["drift_texts"] == texts
    assert saved["controller_state"]["drifts"] == full.beta_controller.drifts[:1]  # step 2's

    other_prompts = Dataset.from_dict({"prompt": ["9-9=", "8-1="]})
    resumed = drift_trainer(
        tiny_model_dir,
        str(tmp_path / "resumed"),
        **{**common, "eval_dataset": other_prompts},
        restore_callback_states_from_checkpoint=restore_callbacks,
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    (drift,) = [c for c in resumed.callback_handler.callbacks if type(c).__name__ == "DriftCallback"]
    assert drift.state_dict() == texts
    assert resumed.beta_controller.state_dict() == full.beta_controller.state_dict()
    for key in ("adaptive_kl/drift", "adaptive_kl/current_beta"):
        assert logged(resumed, key) == logged(full, key)


def test_a_checkpoint_without_drift_texts_is_refused(tiny_model_dir, tmp_path):
    """A checkpoint of a run steered otherwise has no drift texts: resuming it under the drift controller stops before
    training, naming them and how to go on; with `resume_without_kl_state=True` it goes on."""
    first = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        tiny_model_dir,
        output_dir=str(tmp_path / "first"),
        beta=0.1,
        kl_controller="stepwise",
        max_steps=3,
        save_strategy="steps",
        save_steps=3,
    )
    first.train()
    resumed = drift_trainer(tiny_model_dir, str(tmp_path / "resumed"))
    with pytest.raises(ValueError, match="no drift texts.*resume_without_kl_state"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "first" / "checkpoint-3"))
    # Asked for, the run goes on with the texts of its eval_dataset
    resumed = drift_trainer(tiny_model_dir, str(tmp_path / "resumed"), resume_without_kl_state=True)
    resumed.train(resume_from_checkpoint=str(tmp_path / "first" / "checkpoint-3"))
    assert list(logged(resumed, "adaptive_kl/drift")) == [4, 6]


@pytest.mark.parametrize("trainer", list(TRAINERS))
@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (dict(target_drift=None), "kl_controller='drift' needs target_drift"),
        (dict(target_drift=0.0), "target_drift must be None or a finite number > 0"),
        (dict(target_drift=math.inf), "target_drift must be None or a finite number > 0"),
        (dict(drift_every=0), "drift_every must be an integer >= 1"),
        (dict(drift_samples=1.5), "drift_samples must be an integer >= 1"),
        (dict(max_steps=-1), "kl_controller='drift' needs max_steps > 0"),
        (dict(ref_reset_steps=2), "ref_reset_steps moves away from the starting policy"),
        (dict(sync_ref_model=True), "sync_ref_model moves away from the starting policy"),
        (dict(beta=0.0, beta_max=None), "beta must be > 0"),
    ],
)
def test_bad_fields_are_refused_by_the_config(tmp_path, trainer, fields, named):
    config_cls = TRAINERS[trainer][1]
    with pytest.raises(ValueError, match=named):
        config_cls(output_dir=str(tmp_path), **{**TRAIN_KWARGS, **DRIFT, **fields})


def test_target_drift_without_the_drift_controller_warns(tmp_path):
    with pytest.warns(
        UserWarning, match="target_drift=0.1 has no effect: it is read only with .*kl_controller='drift'"
    ):
        AdaptiveKLGRPOConfig(output_dir=str(tmp_path), beta=0.1, target_drift=0.1, **TRAIN_KWARGS)


@pytest.mark.parametrize(
    ("eval_dataset", "got"),
    [(None, "got None"), (Dataset.from_dict({"text": ["1+1=2"]}), r"got a Dataset with columns \['text'\]")],
)
def test_the_trainer_needs_held_out_prompts(tiny_model_dir, tmp_path, eval_dataset, got):
    with pytest.raises(ValueError, match=f"measures the drift on held-out texts: pass eval_dataset.*{got}"):
        drift_trainer(tiny_model_dir, str(tmp_path), eval_dataset=eval_dataset)


@pytest.mark.parametrize(("engine", "stage"), [("fsdp", None), ("deepspeed", 3)])
def test_sharded_parameters_are_refused(tiny_model_dir, tmp_path, monkeypatch, engine, stage):
    """Under FSDP or ZeRO-3 the held-out texts cannot be scored with the unwrapped models: refused at construction
    (the engine stood in for: neither runs on this machine)."""
    import dataclasses

    from adaptive_kl.trainers import lifecycle

    real = lifecycle.host_models
    monkeypatch.setattr(
        lifecycle, "host_models", lambda t: dataclasses.replace(real(t), sharding_engine=engine, zero_stage=stage)
    )
    with pytest.raises(ValueError, match="kl_controller='drift' is not supported with FSDP or DeepSpeed ZeRO-3"):
        drift_trainer(tiny_model_dir, str(tmp_path))
