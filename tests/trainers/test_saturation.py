"""Training runs on the tiny model for issue 43's additions: `dynamic` with `dynamic_trigger="saturation"` (β decays
after each optimizer step whose fraction of zero-std groups reaches `saturation_threshold`; logged, and resumed from a
checkpoint), and `kl_scaling="exp"` (α(t) = γ^(t−1))."""

from __future__ import annotations

import pytest
from tiny import make_trainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer


BETA, DECAY, THRESHOLD = 0.1, 0.5, 0.5


def partly_saturated_reward(completions, prompts, **kwargs):
    """1 for every completion of the prompts `i+…` with i divisible by 3 (their groups' rewards all agree), the
    length reward 1/(1 + len) otherwise (which varies within a group), so that a generation batch of two groups has 0,
    1 or 2 zero-std groups depending on which prompts it drew."""
    return [1.0 if int(p.split("+")[0]) % 3 == 0 else 1.0 / (1.0 + len(c)) for p, c in zip(prompts, completions)]


SATURATION = dict(
    reward_funcs=[partly_saturated_reward],
    beta=BETA,
    kl_adaptation_method="dynamic",
    dynamic_trigger="saturation",
    saturation_threshold=THRESHOLD,
    dynamic_beta_decay=DECAY,
    per_device_train_batch_size=8,  # two groups of num_generations=4 per optimizer step: fractions 0, 1/2, 1
)


def train(model_dir, output_dir, resume=None, **kwargs):
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, model_dir, output_dir=str(output_dir), **kwargs
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def history(trainer, key, first=1):
    return {h["step"]: h[key] for h in trainer.state.log_history if key in h and h["step"] >= first}


@pytest.fixture(scope="module")
def saturation_run(tiny_model_dir, tmp_path_factory):
    return train(
        tiny_model_dir, tmp_path_factory.mktemp("saturation"), max_steps=6, save_strategy="steps", save_steps=3,
        **SATURATION,
    )  # fmt: skip


def test_beta_decays_after_each_saturated_step_and_logs_the_fraction_it_read(saturation_run):
    """β_{t+1} = β_t·decay exactly when step t's fraction of zero-std groups ≥ the threshold; the fraction logged is
    TRL's own `frac_reward_zero_std` of that step; the final β is β·decay^(number of saturated steps)."""
    fractions = history(saturation_run, "adaptive_kl/zero_std_fraction")
    assert fractions == history(saturation_run, "frac_reward_zero_std")  # TRL's computation, not ours
    assert list(fractions) == [1, 2, 3, 4, 5, 6]
    saturated = [t for t, fraction in fractions.items() if fraction >= THRESHOLD]
    assert 0 < len(saturated) < 6, fractions  # the trigger both fired and held back
    betas = history(saturation_run, "adaptive_kl/current_beta")
    expected = BETA
    for t in range(1, 7):
        assert betas[t] == pytest.approx(expected, rel=1e-12)
        expected *= DECAY if t in saturated else 1.0
    controller = saturation_run.beta_controller
    assert controller.beta_base == pytest.approx(BETA * DECAY ** len(saturated), rel=1e-12)
    assert (controller.num_decays, controller.num_skipped_updates) == (len(saturated), 0)


def test_the_reward_is_not_what_triggers_it(tiny_model_dir, tmp_path):
    """A constant reward of 1 saturates every group: β decays after every step whatever `reward_threshold` says, and
    the reward trigger with the same rewards below its threshold would not decay."""
    constant = dict(SATURATION, reward_funcs=[lambda completions, **kw: [1.0] * len(completions)], max_steps=3)
    trainer = train(tiny_model_dir, tmp_path / "saturated", **constant)
    assert history(trainer, "adaptive_kl/zero_std_fraction") == {1: 1.0, 2: 1.0, 3: 1.0}
    assert history(trainer, "adaptive_kl/current_beta") == pytest.approx({1: BETA, 2: BETA / 2, 3: BETA / 4})
    reward_triggered = dict(constant, dynamic_trigger="reward", saturation_threshold=0.5, reward_threshold=2.0)
    trainer = train(tiny_model_dir, tmp_path / "reward", **reward_triggered)
    assert history(trainer, "adaptive_kl/current_beta") == {1: BETA, 2: BETA, 3: BETA}
    assert not history(trainer, "adaptive_kl/zero_std_fraction")  # logged under the saturation trigger only


def test_a_resumed_run_follows_the_uninterrupted_saturation_trajectory(saturation_run, tiny_model_dir, tmp_path):
    """The checkpoint saves β_base (and the step and counters, all the trigger depends on); resumed from step 3, β at
    steps 4–6 and the final state are those of the uninterrupted run."""
    checkpoint = saturation_run.args.output_dir + "/checkpoint-3"
    assert history(saturation_run, "adaptive_kl/current_beta")[4] < BETA  # β decayed by then: a restart would show
    resumed = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, output_dir=str(tmp_path / "resumed"),
        max_steps=6, save_strategy="no", **SATURATION,
    )  # fmt: skip
    resumed.train(resume_from_checkpoint=checkpoint)
    uninterrupted = history(saturation_run, "adaptive_kl/current_beta")
    assert history(resumed, "adaptive_kl/current_beta", first=4) == pytest.approx(
        {t: uninterrupted[t] for t in (4, 5, 6)}, rel=1e-12
    )
    assert resumed.beta_controller.state_dict() == saturation_run.beta_controller.state_dict()


@pytest.mark.parametrize("rate", [0.9, 0.5])
def test_exp_scaling_values(tiny_model_dir, tmp_path, rate):
    """β_t = β·γ^(t−1) at every optimizer step, gradient accumulation included."""
    trainer = train(
        tiny_model_dir, tmp_path, beta=0.2, kl_scaling="exp", kl_scaling_rate=rate, gradient_accumulation_steps=2,
        max_steps=4,
    )  # fmt: skip
    expected = {t: 0.2 * rate ** (t - 1) for t in range(1, 5)}
    assert history(trainer, "adaptive_kl/current_beta") == pytest.approx(expected, rel=1e-12)
    assert history(trainer, "adaptive_kl/beta_scale") == pytest.approx({t: rate ** (t - 1) for t in expected})
