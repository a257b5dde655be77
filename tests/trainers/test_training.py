"""Short real training runs on the tiny model: β trajectories, metrics, resume and LoRA."""

from __future__ import annotations

import math
import os

import pytest
import torch
from peft import LoraConfig, PeftModel
from tiny import constant_reward, make_trainer, prompt_dataset

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.kl.metrics import METRIC_NAMES


def train(model_dir, tmp_path, resume=None, **kwargs):
    """Trains the adapted trainer on the tiny model; `kwargs` go to `make_trainer`."""
    kwargs.setdefault("output_dir", str(tmp_path / "out"))
    trainer = make_trainer(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, model_dir, **kwargs)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def history(trainer, key):
    """Per-step values of a logged metric (logging_steps=1)."""
    return {h["step"]: h[key] for h in trainer.state.log_history if key in h}


def test_dynamic_decay_with_sqrt_scaling_trajectory(tiny_model_dir, tmp_path):
    """Constant reward 1 ≥ threshold: β_base halves after every step, then drops to beta_min at step 4.

    Gradient accumulation and num_iterations > 1 must not change the per-optimizer-step rule.
    """
    trainer = train(
        tiny_model_dir,
        tmp_path,
        reward_funcs=[constant_reward],
        beta=0.1,
        kl_adaptation_method="dynamic",
        dynamic_beta_decay=0.5,
        reward_threshold=0.8,
        beta_min=0.01,
        beta_schedule_steps=4,
        kl_scaling="sqrt",
        gradient_accumulation_steps=2,
        num_iterations=2,
        max_steps=5,
    )
    base = {1: 0.1, 2: 0.05, 3: 0.025, 4: 0.01, 5: 0.01}
    expected = {t: b / math.sqrt(t) if t > 1 else b for t, b in base.items()}
    logged = history(trainer, "adaptive_kl/current_beta")
    assert logged.keys() == expected.keys()
    for t in expected:
        assert logged[t] == pytest.approx(expected[t], rel=1e-12)
    assert history(trainer, "adaptive_kl/beta_scale") == pytest.approx({t: 1 / math.sqrt(max(t, 1)) for t in base})


def test_dynamic_does_not_decay_below_threshold(tiny_model_dir, tmp_path):
    # length_reward = 1/(1+len) ≤ 0.5 < 0.8
    trainer = train(tiny_model_dir, tmp_path, beta=0.1, kl_adaptation_method="dynamic", max_steps=3)
    assert history(trainer, "adaptive_kl/current_beta") == {1: 0.1, 2: 0.1, 3: 0.1}
    assert trainer.beta_controller.num_decays == 0


@pytest.mark.parametrize(
    "scaling,alpha",
    [
        ("none", lambda t: 1.0),
        ("linear", lambda t: 1 / t),
        ("sqrt", lambda t: 1 / math.sqrt(t)),
        ("log", lambda t: 1 / math.log(t + 1)),
    ],
)
def test_step_scaling_values(tiny_model_dir, tmp_path, scaling, alpha):
    trainer = train(tiny_model_dir, tmp_path, beta=0.2, kl_scaling=scaling, gradient_accumulation_steps=2, max_steps=4)
    expected = {t: 0.2 * (alpha(t) if t > 1 else 1.0) for t in range(1, 5)}
    assert history(trainer, "adaptive_kl/current_beta") == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("controller", ["adaptive", "stepwise"])
def test_target_kl_controller_follows_its_rule(tiny_model_dir, tmp_path, controller):
    """β_{t+1} is the rule applied to β_t and the step's logged mean raw KL (logging window = one step), held where the
    step's groups all agreed (its logged `frac_reward_zero_std` is 1), within [beta_min, beta_max]; here β falls,
    is held, and rises to its ceiling."""
    target, horizon, beta_min, beta_max = 1e-3, 16, 0.05, 0.21
    trainer = train(
        tiny_model_dir,
        tmp_path,
        beta=0.2,
        kl_controller=controller,
        target_kl=target,
        kl_horizon=horizon,
        beta_min=beta_min,
        beta_max=beta_max,
        gradient_accumulation_steps=2,
        max_steps=6,
        learning_rate=5e-2,
    )
    betas, kls = history(trainer, "adaptive_kl/current_beta"), history(trainer, "adaptive_kl/raw_kl")
    agreed, held = history(trainer, "frac_reward_zero_std"), history(trainer, "adaptive_kl/held_updates")
    sequences_per_step = 4 * 2  # per-device batch × accumulation
    assert betas[1] == 0.2
    for t in range(1, 6):
        if agreed[t] == 1.0:
            nxt = betas[t]
        elif controller == "adaptive":
            error = min(max(kls[t] / target - 1, -0.2), 0.2)
            nxt = betas[t] * (1 + error * sequences_per_step / horizon)
        else:
            nxt = betas[t] * (1.5 if kls[t] > 1.5 * target else 0.75 if kls[t] < 0.5 * target else 1.0)
        assert betas[t + 1] == pytest.approx(min(max(nxt, beta_min), beta_max), rel=1e-6)
        assert held[t] == sum(agreed[s] == 1.0 for s in range(1, t + 1))  # counted up to and including step t
    assert len(set(betas.values())) > 1 and max(betas.values()) == beta_max and 0 < held[6]


def test_all_metrics_logged_in_train_and_eval(tiny_model_dir, tmp_path):
    trainer = train(
        tiny_model_dir,
        tmp_path,
        beta=0.1,
        kl_adaptation_method="clip",
        kl_clip_threshold=1e-4,
        max_steps=3,
        learning_rate=5e-2,
        eval_strategy="steps",
        eval_steps=3,
        per_device_eval_batch_size=4,
        eval_dataset=prompt_dataset(4),
    )
    logs = trainer.state.log_history
    for name in (*METRIC_NAMES, "kl"):
        values = [h[name] for h in logs if name in h]
        assert len(values) == 3 and all(math.isfinite(v) for v in values), name
        assert any(f"eval_{name}" in h for h in logs), name
    raw, adapted = history(trainer, "adaptive_kl/raw_kl"), history(trainer, "adaptive_kl/adapted_kl")
    assert history(trainer, "kl") == pytest.approx(raw, rel=1e-9)  # k3: TRL's `kl` is the raw KL
    assert raw[3] > 1e-4 and adapted[3] <= 1e-4 + 1e-12 < raw[3]
    assert 0 < history(trainer, "adaptive_kl/clip_fraction")[3] <= 1


def test_resume_gives_the_uninterrupted_trajectory(tiny_model_dir, tmp_path):
    common = dict(
        beta=0.2,
        kl_controller="adaptive",
        target_kl=1e-3,
        kl_horizon=16,
        kl_scaling="log",
        max_steps=6,
        learning_rate=5e-2,
        save_strategy="steps",
        save_steps=3,
        gradient_accumulation_steps=2,
    )
    full = train(tiny_model_dir, tmp_path, output_dir=str(tmp_path / "full"), **common)
    checkpoint = tmp_path / "full" / "checkpoint-3"
    assert os.path.isfile(checkpoint / "trainer_state.json")
    resumed = train(tiny_model_dir, tmp_path, output_dir=str(tmp_path / "resumed"), resume=str(checkpoint), **common)
    assert resumed.beta_controller.last_step == full.beta_controller.last_step == 6
    assert resumed.beta_controller.beta_base == pytest.approx(full.beta_controller.beta_base, rel=1e-9)
    for key in ("adaptive_kl/current_beta", "adaptive_kl/raw_kl", "adaptive_kl/seq_kl", "kl"):
        full_values, resumed_values = history(full, key), history(resumed, key)
        # the resumed history holds the checkpoint's steps 1–3, then the steps it trained
        assert sorted(resumed_values) == [1, 2, 3, 4, 5, 6]
        assert {t: resumed_values[t] for t in (4, 5, 6)} == pytest.approx(
            {t: full_values[t] for t in (4, 5, 6)}, rel=1e-5, abs=1e-9
        ), key
    assert len(set(history(full, "adaptive_kl/current_beta").values())) == 6  # β moved at every step


def test_a_second_train_without_resume_starts_beta_afresh(tiny_model_dir, tmp_path):
    """`train()` again without resuming restarts at step 1 with a new optimizer: β restarts at `beta` and decays by
    the same rule (the controller's `last_step` from the first run must not swallow the new run's updates)."""
    trainer = train(
        tiny_model_dir,
        tmp_path,
        reward_funcs=[constant_reward],
        beta=0.1,
        kl_adaptation_method="dynamic",
        dynamic_beta_decay=0.5,
        reward_threshold=0.5,
        max_steps=3,
    )
    first = history(trainer, "adaptive_kl/current_beta")
    assert first == pytest.approx({1: 0.1, 2: 0.05, 3: 0.025})
    trainer.train()
    assert history(trainer, "adaptive_kl/current_beta") == pytest.approx(first)
    assert trainer.beta_controller.state_dict() == {
        "beta_base": 0.0125,
        "last_step": 3,
        "num_decays": 3,
        "num_skipped_updates": 0,
        "num_held_updates": 0,
    }


def test_resume_restores_state_with_transformers_callback_restore(tiny_model_dir, tmp_path):
    common = dict(
        beta=0.1,
        kl_adaptation_method="dynamic",
        reward_threshold=0.0,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
    )
    train(tiny_model_dir, tmp_path, output_dir=str(tmp_path / "a"), **common)
    resumed = train(
        tiny_model_dir,
        tmp_path,
        output_dir=str(tmp_path / "b"),
        resume=str(tmp_path / "a" / "checkpoint-2"),
        restore_callback_states_from_checkpoint=True,
        **common,
    )
    betas = history(resumed, "adaptive_kl/current_beta")
    assert {t: betas[t] for t in (3, 4)} == pytest.approx({3: 0.1 * 0.9**2, 4: 0.1 * 0.9**3})


def test_lora_reference_is_the_adapter_disabled_model(tiny_model_dir, tmp_path):
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = train(
        tiny_model_dir,
        tmp_path,
        peft_config=lora,
        beta=0.1,
        kl_adaptation_method="dynamic+length_normalized",
        max_steps=3,
        learning_rate=5e-2,
    )
    assert isinstance(trainer.model, PeftModel) and trainer.ref_model is None
    raw = history(trainer, "adaptive_kl/raw_kl")
    assert raw[1] == 0.0  # LoRA starts as the identity: the policy is its reference
    assert raw[3] > 0.0
    lora_b = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # the adapter trained
    base = [p for n, p in trainer.model.named_parameters() if "lora_" not in n]
    assert all(not p.requires_grad for p in base)


def test_beta_zero_is_stock_trl(tiny_model_dir, tmp_path):
    trainer = train(tiny_model_dir, tmp_path, beta=0.0, max_steps=2)
    assert trainer.ref_model is None
    assert not any(name in h for h in trainer.state.log_history for name in METRIC_NAMES)
    assert torch.isfinite(torch.tensor([h["loss"] for h in trainer.state.log_history if "loss" in h])).all()
