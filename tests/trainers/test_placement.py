"""`kl_placement="reward"`: the penalized group advantages, their parity with TRL's, β schedules, forward passes."""

from __future__ import annotations

import math
import statistics
import warnings

import pytest
import torch
from test_forward_passes import ForwardCounter
from tiny import fabricated_inputs, loss_and_grads, make_trainer
from trl import GRPOConfig, GRPOTrainer

import adaptive_kl.trainers.lifecycle as lifecycle
from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.kl.placement import group_advantages, sequence_kl_penalty


def independent_advantages(rewards: list[float], group: int, scale: str) -> list[float]:
    """TRL's documented normalization, written with `statistics` in float64 (NaN rewards left out, advantage 0)."""

    def std(values):
        values = [v for v in values if not math.isnan(v)]
        return statistics.stdev(values) if len(values) > 1 else math.nan

    out = []
    for start in range(0, len(rewards), group):
        block = rewards[start : start + group]
        finite = [v for v in block if not math.isnan(v)]
        mean = sum(finite) / len(finite) if finite else math.nan
        spread = {"group": std(block), "batch": std(rewards), "none": None}[scale]
        for v in block:
            a = v - mean if spread is None else (v - mean) / (spread + 1e-4)
            out.append(0.0 if math.isnan(a) else a)
    return out


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_against_an_independent_formula(scale):
    rewards = [0.5, 1.0, 2.0, math.nan, 3.0, 3.0, 3.0, 3.0, math.nan, math.nan, math.nan, 1.0, -1.0, 0.0, 4.0, 2.5]
    got = group_advantages(torch.tensor(rewards, dtype=torch.float64), 4, scale)
    # Scaled as TRL's `nanstd` does, Bessel's n / (n − 1) taken in float32 (the default dtype) even for float64
    # rewards: a relative rounding of at most eps32 / 2 in the variance, eps32 / 4 in the std (3.0e-8).
    rel = 1e-12 if scale == "none" else torch.finfo(torch.float32).eps / 4 + 1e-12
    assert got.tolist() == pytest.approx(independent_advantages(rewards, 4, scale), rel=rel, abs=1e-12)


def test_group_advantages_refuses_an_unknown_scaling():
    with pytest.raises(ValueError, match="scale_rewards must be one of"):
        group_advantages(torch.zeros(4), 2, "groups")


def test_sequence_penalty_is_beta_times_the_transformed_sum_and_detached():
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -2.0, -9.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    r = (logps - ref).detach()
    k1 = 0.3 * (r * mask).sum(-1)
    penalty = sequence_kl_penalty(logps, ref, mask, beta=0.3, estimator="k1")
    assert penalty.tolist() == pytest.approx(k1.tolist())
    k3 = torch.expm1(-r) + r
    clipped = 0.3 * (k3.clamp(max=0.5) * mask).sum(-1) / mask.sum(-1)
    got = sequence_kl_penalty(
        logps, ref, mask, beta=0.3, estimator="k3", transform="clip", clip_threshold=0.5, length_normalized=True
    )
    assert got.tolist() == pytest.approx(clipped.tolist())
    assert not got.requires_grad and not penalty.requires_grad


class GenerationRecorder:
    """Wraps the trainer's `_generate_and_score_completions` and records, for each generation batch, its output, the
    total rewards and (before the optimizer changes the model) the policy's log-probabilities from a plain forward."""

    def __init__(self, trainer):
        self.trainer, self.batches = trainer, []
        original, calculate = trainer._generate_and_score_completions, trainer._calculate_rewards

        def recorded_rewards(*args):
            rewards_per_func = calculate(*args)  # (N, K), no reward function returns None here
            self.rewards = (rewards_per_func * trainer.reward_weights).sum(dim=1)
            return rewards_per_func

        def recorded(inputs):
            output = original(inputs)
            self.batches.append(
                {
                    "output": {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in output.items()},
                    "rewards": self.rewards,
                    "logps": self.policy_logps(output),
                    "beta": trainer.beta_controller.beta(trainer.state.global_step + 1),
                    "step": trainer.state.global_step + 1,
                }
            )
            return output

        trainer._generate_and_score_completions = recorded
        trainer._calculate_rewards = recorded_rewards

    def policy_logps(self, output):
        """log π(y_t) from one full forward and a float64 log-softmax: independent of TRL's chunked computation."""
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        with torch.no_grad():
            logits = self.trainer.model(input_ids=ids, attention_mask=attention).logits.double()
        n = output["completion_ids"].size(1)
        logps = (logits[:, -n - 1 : -1] / self.trainer.temperature).log_softmax(-1)
        return logps.gather(-1, output["completion_ids"].unsqueeze(-1)).squeeze(-1)


def reward_trainer(model_dir, tmp_path, **fields):
    fields = {
        "beta": 0.2,
        "kl_placement": "reward",
        "kl_estimator": "k1",
        "bf16": False,
        "max_steps": 2,
        "output_dir": str(tmp_path / "out"),
        **fields,
    }
    return make_trainer(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, model_dir, **fields)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_reward_placement_advantages_equal_an_independent_computation(tiny_model_dir, tmp_path, scale):
    trainer = reward_trainer(tiny_model_dir, tmp_path, scale_rewards=scale)
    recorder = GenerationRecorder(trainer)
    trainer.train()
    assert len(recorder.batches) == 2
    moved = False
    for batch in recorder.batches:
        out = batch["output"]
        mask = out["completion_mask"].double()
        log_ratio = batch["logps"] - out["ref_per_token_logps"].double()
        penalty = 0.2 * (log_ratio * mask).sum(-1)  # β · Σ_t k1; β = 0.2 fixed
        rewards = batch["rewards"].double()  # the task rewards, before the penalty
        expected = independent_advantages((rewards - penalty).tolist(), trainer.num_generations, scale)
        assert out["advantages"].tolist() == pytest.approx(expected, rel=1e-4, abs=1e-5)
        unpenalized = independent_advantages(rewards.tolist(), trainer.num_generations, scale)
        moved |= max(abs(a - b) for a, b in zip(expected, unpenalized)) > 1e-3
    assert moved, "the penalty never changed an advantage: the test would not see a missing penalty"
    last = recorder.batches[-1]["output"]["advantages"].tolist()  # one process: the whole batch
    assert list(trainer._logs["advantages"])[-len(last) :] == pytest.approx(last)  # the completions table's column
    penalties = [
        h["adaptive_kl/reward_penalty"] for h in trainer.state.log_history if "adaptive_kl/reward_penalty" in h
    ]
    assert len(penalties) == 2 and all(math.isfinite(p) for p in penalties)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_our_group_advantages_equal_trls_on_its_own_rewards(tiny_model_dir, tmp_path, scale):
    """With the KL in the loss, TRL computes the advantages: `group_advantages` of the same rewards must equal them
    (NaN rewards included), so the reward placement changes nothing but the penalty."""

    def sometimes_unscored(completions, **kwargs):
        return [None if i % 5 == 0 else 1.0 / (1.0 + len(c)) for i, c in enumerate(completions)]

    trainer = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        tiny_model_dir,
        reward_funcs=[sometimes_unscored],
        beta=0.1,
        bf16=False,
        max_steps=2,
        scale_rewards=scale,
        output_dir=str(tmp_path / "out"),
    )
    recorder = GenerationRecorder(trainer)
    trainer.train()
    logged = [h["reward"] for h in trainer.state.log_history if "reward" in h and "loss" in h]
    assert len(logged) == len(recorder.batches) == 2
    for batch, reward in zip(recorder.batches, logged):
        assert batch["rewards"].isnan().any()
        ours = group_advantages(batch["rewards"], trainer.num_generations, scale)
        torch.testing.assert_close(ours, batch["output"]["advantages"], rtol=0, atol=0)
        # `total_rewards` (what `batch["rewards"]` is) is TRL's total: its mean is the `reward` TRL logged, to the bit
        assert torch.nanmean(batch["rewards"]).item() == reward


def test_reward_placement_loss_has_no_kl_term(tiny_model_dir, tmp_path):
    trainer = reward_trainer(tiny_model_dir, tmp_path)
    inputs = fabricated_inputs(trainer)
    loss, grads = loss_and_grads(trainer, inputs)
    trainer.beta = 0.0
    host_loss, host_grads = loss_and_grads(trainer, inputs)
    assert loss.item() == host_loss.item()
    assert grads.keys() == host_grads.keys() and all(torch.equal(grads[k], host_grads[k]) for k in grads)
    assert trainer.kl_monitor.log_sums["train"]  # the KL is still measured: metrics and controllers


@pytest.mark.parametrize(
    "fields",
    [{"kl_scaling": "linear"}, {"kl_controller": "stepwise", "target_kl": 1e-6, "beta_max": 1.0}],
    ids=["linear", "stepwise"],
)
def test_beta_schedules_and_controllers_set_the_penalty(tiny_model_dir, tmp_path, fields, monkeypatch):
    used = []
    original = lifecycle.sequence_kl_penalty

    def spy(*args, beta, **kwargs):
        used.append(beta)
        return original(*args, beta=beta, **kwargs)

    monkeypatch.setattr(lifecycle, "sequence_kl_penalty", spy)
    trainer = reward_trainer(tiny_model_dir, tmp_path, max_steps=4, learning_rate=5e-2, **fields)
    recorder = GenerationRecorder(trainer)
    trainer.train()
    logged = {
        h["step"]: h["adaptive_kl/current_beta"] for h in trainer.state.log_history if "adaptive_kl/current_beta" in h
    }
    assert used == [logged[b["step"]] for b in recorder.batches]
    if "kl_scaling" in fields:
        assert used == pytest.approx([0.2, 0.2 / 2, 0.2 / 3, 0.2 / 4])
    else:  # the stepwise rule applied to the KL measured in each step
        kl = {h["step"]: h["adaptive_kl/raw_kl"] for h in trainer.state.log_history if "adaptive_kl/raw_kl" in h}
        agreed = {h["step"]: h["frac_reward_zero_std"] for h in trainer.state.log_history if "loss" in h}
        for t in range(1, 4):
            factor = 1.5 if kl[t] > 1.5e-6 else 0.75 if kl[t] < 0.5e-6 else 1.0
            held = agreed[t] == 1.0  # every group agreed: the controller holds β
            assert used[t] == pytest.approx(used[t - 1] * (1.0 if held else factor))
        assert len(set(used)) > 1


def test_the_logged_beta_is_the_one_the_penalty_used(tiny_model_dir, tmp_path, monkeypatch):
    """`steps_per_generation=2`: a generation batch serves two optimizer steps while β halves after each (a stand-in
    for `dynamic`); both log the β its penalty was computed with, the first step's."""
    used = []
    original = lifecycle.sequence_kl_penalty

    def spy(*args, beta, **kwargs):
        used.append(beta)
        return original(*args, beta=beta, **kwargs)

    def halve(self, step, **kwargs):
        self.beta_base *= 0.5

    monkeypatch.setattr(lifecycle, "sequence_kl_penalty", spy)
    monkeypatch.setattr("adaptive_kl.kl.controller.BetaController.update", halve)
    trainer = reward_trainer(
        tiny_model_dir, tmp_path, max_steps=4, steps_per_generation=2, kl_adaptation_method="dynamic"
    )
    trainer.train()
    logged = [h["adaptive_kl/current_beta"] for h in trainer.state.log_history if "adaptive_kl/current_beta" in h]
    assert used == pytest.approx([0.2, 0.05])  # generated at steps 1 and 3
    assert logged == pytest.approx([0.2, 0.2, 0.05, 0.05])


def test_no_extra_forward_when_trl_computes_old_logps(tiny_model_dir):
    host = dict(beta=0.04, max_steps=2, gradient_accumulation_steps=2, num_iterations=2, max_completion_length=6,
                generation_kwargs={"min_new_tokens": 6})  # fmt: skip
    counts = {}
    for name, (cls, config_cls, fields) in {
        "stock": (GRPOTrainer, GRPOConfig, {}),
        "reward": (AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, {"kl_placement": "reward", "kl_estimator": "k1"}),
    }.items():
        trainer = make_trainer(cls, config_cls, tiny_model_dir, **host, **fields)
        counter = ForwardCounter(trainer)
        trainer.train()
        counts[name] = counter.per_step
    assert counts["reward"] == counts["stock"]


def test_on_policy_costs_one_policy_forward_per_generation_batch(tiny_model_dir):
    host = dict(beta=0.04, max_steps=2, max_completion_length=6, generation_kwargs={"min_new_tokens": 6})
    counts = {}
    for placement in ("loss", "reward"):
        trainer = make_trainer(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, kl_placement=placement,
                               kl_estimator="k1" if placement == "reward" else "k3", **host)  # fmt: skip
        counter = ForwardCounter(trainer)
        trainer.train()
        counts[placement] = counter.per_step
    assert [(p + 1, r) for p, r in counts["loss"]] == counts["reward"]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"kl_placement": "rewards"}, r"kl_placement must be one of \('loss', 'reward'\)"),
        ({"kl_placement": "reward", "beta": 0.0}, "beta must be > 0"),
        ({"kl_placement": "reward", "multi_objective_aggregation": "normalize_then_sum"}, "sum_then_normalize"),
    ],
)
def test_ill_posed_placements_are_refused_at_config_time(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveKLGRPOConfig(output_dir=str(tmp_path), **{"beta": 0.1, **fields})


def test_k1_warns_in_the_loss_only(tmp_path):
    with pytest.warns(UserWarning, match="zero expected gradient"):
        AdaptiveKLGRPOConfig(output_dir=str(tmp_path), beta=0.1, kl_estimator="k1", bf16=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        AdaptiveKLGRPOConfig(output_dir=str(tmp_path), beta=0.1, kl_estimator="k1", kl_placement="reward", bf16=False)
