"""`AdaptiveKLRLOOConfig` / `AdaptiveKLRLOOTrainer`: RLOO's KL penalty in the reward, replaced by the adapted one.

At the config's defaults (method "none", `kl_estimator="k1"`) the replaced penalty is TRL's, so a training step equals
stock `RLOOTrainer`'s: logs and gradients, for each `normalize_advantages` and each option of RLOO's loss. As in
`test_parity.py` both trainers run in float64 (the model, its reference, and a float64 stand-in for TRL's fused
log-probability scorer), so the comparison is of the penalty and advantages alone, to 1e-9 on any CPU. Each method's
penalty is checked against a formula written here, β's trajectory against the rules, and a resume against the run
it continues.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import types
import warnings

import pytest
import torch
import trl.trainer.utils as trl_utils
from tiny import length_reward, make_trainer, perturb, prompt_dataset
from transformers import TrainerCallback
from trl import RLOOConfig, RLOOTrainer

import adaptive_kl
import adaptive_kl.trainers.lifecycle as lifecycle
from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLRLOOConfig, AdaptiveKLRLOOTrainer
from adaptive_kl.kl.placement import leave_one_out_advantages
from adaptive_kl.trainers.hooks import HOST_INTERNALS, host_internals
from adaptive_kl.trainers.rloo import REFERENCE_LOGPS, SAMPLING_LOGPS
from adaptive_kl.trainers.rloo_config import GRPO_ONLY_FIELDS, RLOO_ESTIMATORS
from adaptive_kl.trainers.scorer import Float64LogProbFunction, install_cpu_scorer_if_needed


BETA = 0.2
# Two groups of four per generation batch, one optimizer step each: the normalization spans groups.
RUN = dict(per_device_train_batch_size=8, num_generations=4, beta=BETA, max_steps=2)
# An adaptation that changes nothing (α(t) = γ^(t−1) = 1 at γ = 1): the package's own penalty path, whose value is
# TRL's. At the defaults the host's penalty stands (`host_penalty`), so comparing there would compare TRL with itself.
IDENTITY = dict(kl_scaling="exp", kl_scaling_rate=1.0)
RTOL = 1e-9  # float64 end to end: the summation orders differ by rounding only (~1e-15)
# With `normalize_advantages`, TRL's `nanstd` (and ours, in its arithmetic) takes Bessel's n / (n − 1) from integer
# counts in the default float32, even for float64 rewards: against an exact formula the std carries a relative
# rounding of at most eps32 / 2 in the variance, eps32 / 4 in the std (3.0e-8).
NORMALIZED_STD_ROUNDING = torch.finfo(torch.float32).eps / 4
# Logged values that are not a function of the step's numbers.
UNTIMED = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


# --- the config ------------------------------------------------------------------------------------------------------


def config(tmp_path, **fields) -> AdaptiveKLRLOOConfig:
    return AdaptiveKLRLOOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, **fields)


def test_defaults_are_stock_rloo(tmp_path):
    args = config(tmp_path)
    assert (args.beta, args.kl_estimator, args.kl_adaptation_method, args.kl_scaling, args.kl_controller) == (
        0.05,
        "k1",
        "none",
        "none",
        "fixed",
    )
    assert not args.uses_adaptive_kl and isinstance(args, RLOOConfig)
    assert "kl_placement" not in {f.name for f in dataclasses.fields(args)}


def test_fields_are_the_grpo_configs_less_the_grpo_only_ones():
    """Every KL field of the GRPO config is offered here with its default and help, or listed as GRPO-only (a field
    added there must be decided on here); `kl_estimator` alone is RLOO's own (its default is RLOO's k1)."""
    ours = {f.name: f for f in dataclasses.fields(AdaptiveKLRLOOConfig)}
    host = {f.name for f in dataclasses.fields(trl_grpo_config())}
    grpo_kl = {f.name: f for f in dataclasses.fields(AdaptiveKLGRPOConfig) if f.name not in host}
    assert set(GRPO_ONLY_FIELDS) <= set(grpo_kl)
    assert set(grpo_kl) - set(GRPO_ONLY_FIELDS) == {n for n in ours if n in grpo_kl}
    for name in set(grpo_kl) - set(GRPO_ONLY_FIELDS) - {"kl_estimator"}:
        assert (ours[name].default, ours[name].metadata) == (grpo_kl[name].default, grpo_kl[name].metadata), name
    assert ours["kl_estimator"].default == "k1" and ours["kl_estimator"].metadata["help"]


def trl_grpo_config():
    from trl import GRPOConfig

    return GRPOConfig


@pytest.mark.parametrize(
    "fields,field",
    [
        ({"kl_estimator": "k3+"}, "kl_estimator"),
        ({"kl_estimator": "k4"}, "kl_estimator"),
        ({"kl_adaptation_method": "clip+sigmoid"}, "kl_adaptation_method"),
        ({"kl_scaling": "cubic"}, "kl_scaling"),
        ({"kl_controller": "pid"}, "kl_controller"),
        ({"kl_clip_threshold": 0.0}, "kl_clip_threshold"),
        ({"beta_min": 1.0}, "beta_min"),
        ({"beta": 0.0, "kl_adaptation_method": "clip"}, "beta"),
        ({"kl_adaptation_method": "dynamic", "kl_controller": "stepwise"}, "kl_adaptation_method='dynamic'"),
        ({"resume_without_kl_state": "yes"}, "resume_without_kl_state"),
        ({"kl_controller": "adaptive", "kl_horizon": 1}, "kl_horizon"),
    ],
)
def test_bad_values_raise_naming_the_field(tmp_path, fields, field):
    with pytest.raises(ValueError, match=field):
        config(tmp_path, **fields)


def test_the_placement_is_not_offered(tmp_path):
    with pytest.raises(TypeError, match="kl_placement"):
        config(tmp_path, kl_placement="reward")


def test_an_unread_parameter_warns(tmp_path):
    with pytest.warns(UserWarning, match="kl_clip_threshold=0.5 has no effect"):
        config(tmp_path, kl_clip_threshold=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        config(tmp_path, kl_clip_threshold=0.5, kl_adaptation_method="clip")


def test_unsloth_is_refused(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "unsloth", types.ModuleType("unsloth"))
    with pytest.raises(ImportError, match="does not support Unsloth"):
        config(tmp_path)


# --- the leave-one-out advantages ------------------------------------------------------------------------------------


def independent_rloo(rewards: list[float], group: int, normalize: bool) -> list[float]:
    """RLOO's advantages written with plain floats: the reward minus the mean of the group's other scored rewards (NaN
    rewards left out, advantage 0; a lone scored completion: 0), then optionally standardized over the scored ones."""
    out = []
    for start in range(0, len(rewards), group):
        block = rewards[start : start + group]
        scored = [w for w in block if not math.isnan(w)]
        for v in block:
            lone = math.isnan(v) or len(scored) < 2
            out.append(math.nan if lone else v - (sum(scored) - v) / (len(scored) - 1))
    if normalize:
        scored = [a for a in out if not math.isnan(a)]
        mean = sum(scored) / len(scored)
        std = math.sqrt(sum((a - mean) ** 2 for a in scored) / (len(scored) - 1))
        out = [(a - mean) / (std + 1e-4) for a in out]
    return [0.0 if math.isnan(a) else a for a in out]


@pytest.mark.parametrize("normalize", [False, True])
def test_leave_one_out_advantages_against_an_independent_formula(normalize):
    rewards = [0.5, 1.0, 2.0, math.nan, 3.0, 3.0, 3.0, 3.0, math.nan, math.nan, math.nan, 1.0, -1.0, 0.0, 4.0, 2.5]
    got = leave_one_out_advantages(torch.tensor(rewards, dtype=torch.float64), 4, normalize)
    rel = NORMALIZED_STD_ROUNDING + 1e-12 if normalize else 1e-12
    assert got.tolist() == pytest.approx(independent_rloo(rewards, 4, normalize), rel=rel, abs=1e-12)


def test_one_completion_per_group_has_no_advantage():
    assert leave_one_out_advantages(torch.tensor([1.0, 2.0]), 1, True).tolist() == [0.0, 0.0]


# --- parity with stock RLOO ------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def float64_scorer(monkeypatch):
    """Every trainer here runs in float64 (`build`): TRL's fused scorer too."""
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Float64LogProbFunction)


class GradientRecorder(TrainerCallback):
    """The parameter gradients of each optimizer step, just before the optimizer applies them."""

    def __init__(self):
        self.steps = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})


def build(cls, config_cls, model_dir, tmp_path, **fields):
    """A float64 trainer on the tiny model whose policy was moved away from its reference (so the KL is not 0)."""
    fields = {**RUN, **fields}
    trainer = make_trainer(cls, config_cls, model_dir, output_dir=str(tmp_path / cls.__name__), **fields)
    perturb(trainer.model)
    trainer.model.double()
    if trainer.ref_model is not None:
        trainer.ref_model.double()
    return trainer


def run(trainer):
    """Trains `trainer`; its log history and the gradients of each step."""
    recorder = GradientRecorder()
    trainer.add_callback(recorder)
    torch.manual_seed(0)  # the same completions for every trainer
    trainer.train()
    return trainer.state.log_history, recorder.steps


def assert_same_run(ours, stock, rtol=RTOL):
    (our_logs, our_grads), (stock_logs, stock_grads) = ours, stock
    assert len(our_logs) == len(stock_logs) and len(our_grads) == len(stock_grads) > 0
    for mine, theirs in zip(our_logs, stock_logs):
        assert set(theirs) <= set(mine)
        for key in set(theirs) - UNTIMED:
            assert mine[key] == pytest.approx(theirs[key], rel=rtol, abs=1e-12), key
    for mine, theirs in zip(our_grads, stock_grads):
        assert mine.keys() == theirs.keys() and mine
        # Against the step's whole gradient: some entries (the key biases, which softmax ignores) are zero in exact
        # arithmetic, and only rounding is left in them.
        scale = sum(g.norm() ** 2 for g in theirs.values()).sqrt().item()
        for name in theirs:
            assert (mine[name] - theirs[name]).norm().item() <= rtol * scale, name
            assert mine[name].dtype == torch.float64


def gradient_difference(a, b) -> float:
    """Relative norm of the difference between two runs' gradients."""
    diff = sum((a[s][n] - b[s][n]).norm() ** 2 for s in range(len(a)) for n in a[s]) ** 0.5
    return (diff / sum(g.norm() ** 2 for step in b for g in step.values()) ** 0.5).item()


# RLOO's options: the batch normalization, and each option of its loss (clipping range, several iterations per
# generation batch, reward clipping before the penalty).
LOSS_OPTIONS = {
    "default": {},
    "epsilon": {"epsilon": 0.05, "epsilon_high": 0.1},
    "iterations": {"num_iterations": 2},
    "reward_clip": {"reward_clip_range": (0.0, 0.105)},
}
PARITY_CASES = [(normalize, option) for normalize in (False, True) for option in LOSS_OPTIONS]


@pytest.mark.parametrize("normalize,option", PARITY_CASES, ids=[f"{n}-{o}" for n, o in PARITY_CASES])
def test_our_penalty_matches_stock_rloo(tiny_model_dir, tmp_path, normalize, option):
    """k1 summed, through the package's penalty path (`IDENTITY`): our penalty replaces TRL's and the advantages are
    recomputed, yet the logs and gradients are stock RLOO's with the same β."""
    fields = {"normalize_advantages": normalize, **LOSS_OPTIONS[option]}
    stock = run(build(RLOOTrainer, RLOOConfig, tiny_model_dir, tmp_path, **fields))
    ours = build(AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, **fields, **IDENTITY)
    explicit = ours.args.kl_adaptation_method == "none" and ours.args.kl_estimator == "k1"
    ours_run = run(ours)
    assert explicit and not ours.host_penalty and "adaptive_kl/reward_penalty" in ours_run[0][0]  # ours ran
    assert_same_run(ours_run, stock, RTOL)


@pytest.mark.parametrize("normalize", [False, True])
def test_at_the_defaults_the_hosts_penalty_and_logs_stand(tiny_model_dir, tmp_path, normalize):
    """Every new field at its default: the host's penalty, advantages and logs are stock RLOO's, bit for bit, and the
    package only adds its `adaptive_kl/*` measurements, the penalty the host subtracted among them."""
    fields = {"normalize_advantages": normalize}
    (stock_logs, stock_grads) = run(build(RLOOTrainer, RLOOConfig, tiny_model_dir, tmp_path, **fields))
    ours = build(AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, **fields)
    (our_logs, our_grads) = run(ours)
    assert ours.host_penalty
    for mine, theirs in zip(our_logs, stock_logs, strict=True):
        assert {k: v for k, v in mine.items() if not k.startswith("adaptive_kl/") and k not in UNTIMED} == {
            k: v for k, v in theirs.items() if k not in UNTIMED
        }
    steps = [log for log in our_logs if "adaptive_kl/raw_kl" in log]
    assert steps
    for log in steps:  # the mean penalty β·Σ_t k1 of the host's, measured: β · (per-token k1) · (mean length)
        expected = ours.beta * log["adaptive_kl/raw_kl"] * log["completions/mean_length"]
        assert log["adaptive_kl/reward_penalty"] == pytest.approx(expected, rel=1e-5)
    for mine, theirs in zip(our_grads, stock_grads, strict=True):
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[n], theirs[n]) for n in theirs)


@pytest.mark.parametrize("normalize", [False, True])
def test_our_penalty_is_stock_rloo_bit_for_bit_in_float32(tiny_model_dir, tmp_path, normalize, monkeypatch):
    """In float32, TRL's own scorer (or, where it cannot run on a CPU, the float32 stand-in both trainers share): our
    penalty (`IDENTITY`), leave-one-out baseline and normalization are TRL's arithmetic, so every logged value and
    every gradient of a run is stock RLOO's to the bit."""
    monkeypatch.undo()  # not the float64 scorer of this module's other tests
    install_cpu_scorer_if_needed("cpu")
    runs = []
    for cls, config_cls in ((RLOOTrainer, RLOOConfig), (AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig)):
        ours = IDENTITY if cls is AdaptiveKLRLOOTrainer else {}
        trainer = make_trainer(
            cls, config_cls, tiny_model_dir, output_dir=str(tmp_path / cls.__name__), normalize_advantages=normalize,
            **{**RUN, "max_steps": 8}, **ours,  # 8 normalizations: (v·n)/(n − 1) would differ in the last bit on one
        )  # fmt: skip
        perturb(trainer.model)
        assert next(trainer.model.parameters()).dtype == torch.float32
        runs.append(run(trainer))
    (stock_logs, stock_grads), (our_logs, our_grads) = runs
    assert "adaptive_kl/reward_penalty" in our_logs[0]  # our penalty ran
    for mine, theirs in zip(our_logs, stock_logs, strict=True):
        assert {key: mine[key] for key in set(theirs) - UNTIMED} == {key: theirs[key] for key in set(theirs) - UNTIMED}
    for mine, theirs in zip(our_grads, stock_grads, strict=True):
        assert mine.keys() == theirs.keys() and mine
        assert all(torch.equal(mine[name], theirs[name]) for name in theirs), normalize


def test_our_penalty_matches_stock_rloo_past_log_ratios_of_20(tiny_model_dir, tmp_path):
    """A reference far from the policy (its output embedding scaled by 50, so it puts almost no mass on most of the
    tokens the policy samples: log-ratios past 20): our penalty (`IDENTITY`) applies no clamp that TRL does not
    apply, so the run is stock RLOO's (k1 in the penalty)."""
    runs = []
    for cls, config_cls in ((RLOOTrainer, RLOOConfig), (AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig)):
        trainer = build(
            cls, config_cls, tiny_model_dir, tmp_path, **(IDENTITY if cls is AdaptiveKLRLOOTrainer else {})
        )
        with torch.no_grad():
            trainer.ref_model.get_output_embeddings().weight.mul_(50.0)
        recorder = Recorder(trainer) if cls is AdaptiveKLRLOOTrainer else None
        runs.append(run(trainer))
    far = [
        ((batch[SAMPLING_LOGPS] - batch[REFERENCE_LOGPS]) * batch["completion_mask"]).abs().max().item()
        for batch in recorder.batches
    ]
    assert max(far) > 20  # the premise: log-ratios past where the former clamp was
    assert_same_run(runs[1], runs[0])


def test_the_penalty_is_ours_and_matters(tiny_model_dir, tmp_path):
    """The parity above is not vacuous: stock RLOO without its penalty trains differently, and so does ours with
    another estimator (the host's penalty is replaced, not added to)."""
    stock = run(build(RLOOTrainer, RLOOConfig, tiny_model_dir, tmp_path))
    no_penalty = run(build(RLOOTrainer, RLOOConfig, tiny_model_dir, tmp_path / "zero", beta=0.0))
    k3 = run(build(AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path / "k3", kl_estimator="k3"))
    assert gradient_difference(no_penalty[1], stock[1]) > 1e-3
    assert gradient_difference(k3[1], stock[1]) > 1e-3


def test_beta_zero_is_stock_rloo(tiny_model_dir, tmp_path):
    stock = run(build(RLOOTrainer, RLOOConfig, tiny_model_dir, tmp_path, beta=0.0))
    ours = build(AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, beta=0.0)
    assert ours.ref_model is None
    ours_run = run(ours)
    assert not any(key.startswith("adaptive_kl/") for log in ours_run[0] for key in log)
    assert_same_run(ours_run, stock)


# A token the reference finds e^25 times less likely than the policy does: beyond any clamp of the log-ratio.
FAR_LOG_RATIO = 25.0


@pytest.fixture
def a_far_token(monkeypatch):
    """The reference's log-probability of one completion token of every generation batch lowered by FAR_LOG_RATIO:
    for stock RLOO and ours alike (the host's own scoring, which both call)."""
    original = RLOOTrainer._get_per_token_logps_and_entropies

    def scoring(self, model, *args, **kwargs):
        logps, *rest = original(self, model, *args, **kwargs)
        if self.ref_model is not None and model is self.ref_model:
            logps = logps.clone()
            logps[0, 0] -= FAR_LOG_RATIO
        return (logps, *rest)

    monkeypatch.setattr(RLOOTrainer, "_get_per_token_logps_and_entropies", scoring)


def test_a_token_far_from_the_reference_is_penalized_as_stock(tiny_model_dir, tmp_path, a_far_token):
    """k1 is not clamped: one token with r ≈ 25 is penalized by β·25 as in TRL (a clamp to ±20 would give β·20,
    and a gradient off by a whole group's worth of advantage)."""
    stock = run(build(RLOOTrainer, RLOOConfig, tiny_model_dir, tmp_path))
    ours = build(AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path)
    recorder = Recorder(ours)
    ours_run = run(ours)
    batch = recorder.batches[0]
    log_ratio = batch[SAMPLING_LOGPS][0, 0] - batch[REFERENCE_LOGPS][0, 0]
    assert log_ratio.item() > 20  # the far token is in the batch the penalty saw
    assert_same_run(ours_run, stock)


def tied_reward(completions, **kwargs):
    """The same reward for every completion: every group's task rewards tie."""
    return [0.5 for _ in completions]


def test_tied_rewards_log_stocks_zero_std_fraction(tiny_model_dir, tmp_path):
    """With tied task rewards TRL logs the zero-std groups of the rewards it penalized; ours logs those of the rewards
    its advantages use, which at the defaults are the same: the whole run is stock's."""
    fields = dict(reward_funcs=[tied_reward])
    stock = run(build(RLOOTrainer, RLOOConfig, tiny_model_dir, tmp_path, **fields))
    ours = run(build(AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, **fields))
    assert_same_run(ours, stock)
    assert [log["frac_reward_zero_std"] for log in stock[0] if "frac_reward_zero_std" in log] == [0.0, 0.0]


def zero_std_run(model_dir, tmp_path, name, **fields):
    """Tied task rewards; from step 2 on β is 0 (`dynamic`, `beta_schedule_steps=2`, `beta_min=0`)."""
    trainer = build(
        AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, model_dir, tmp_path / name, reward_funcs=[tied_reward],
        kl_adaptation_method="dynamic", beta_schedule_steps=2, kl_monitor_steps=0, max_steps=3, **fields,
    )  # fmt: skip
    logs, _ = run(trainer)
    return [log["frac_reward_zero_std"] for log in logs if "frac_reward_zero_std" in log]


def test_the_zero_std_fraction_is_that_of_the_rewards_the_advantages_use_on_every_path(tiny_model_dir, tmp_path):
    """Once β is 0 the penalty is 0 and tied task rewards stay tied: every group has zero std, whether the reference
    is skipped (the host then scores with β = 0) or scored (the host would penalize with its own β and log 0)."""
    skipped = zero_std_run(tiny_model_dir, tmp_path, "skip")
    scored = zero_std_run(tiny_model_dir, tmp_path, "scored", skip_zero_beta_reference=False)
    assert skipped == scored == [0.0, 1.0, 1.0]


def test_another_penalty_logs_the_zero_std_fraction_of_its_own_rewards(tiny_model_dir, tmp_path):
    """With a transform the penalty is ours, not the host's: the logged fraction is computed from the rewards minus
    our penalty (here a clip that caps every token, so that two completions of equal length tie)."""
    trainer = build(
        AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, reward_funcs=[tied_reward],
        kl_estimator="k3", kl_adaptation_method="clip", kl_clip_threshold=1e-12,
    )  # fmt: skip
    recorder = Recorder(trainer)
    logs, _ = run(trainer)
    logged = [log["frac_reward_zero_std"] for log in logs if "frac_reward_zero_std" in log]
    for batch, rewards, fraction in zip(recorder.batches, recorder.rewards, logged):
        lengths = batch["completion_mask"].sum(-1)
        penalized = [r - BETA * 1e-12 * n for r, n in zip(rewards[:, 0].tolist(), lengths.tolist())]
        groups = [penalized[i : i + 4] for i in range(0, len(penalized), 4)]
        tied = sum(max(g) - min(g) <= 1e-8 for g in groups)  # isclose(std, 0) with TRL's atol 1e-8
        assert fraction == pytest.approx(tied / len(groups))
    assert logged == [1.0, 1.0]  # capped at 1e-12 per token: every group ties to 1e-8, unlike stock's k1 penalty


def test_the_logged_beta_is_the_one_the_advantages_used(tiny_model_dir, tmp_path, monkeypatch):
    """One generation batch serves two optimizer steps (`steps_per_generation=2`) while `dynamic` decays β after each:
    the second step trains on advantages penalized with the first step's β, and logs that β."""
    monkeypatch.setattr("adaptive_kl.kl.controller.BetaController.update", decay_every_step, raising=True)
    trainer = build(
        AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, per_device_train_batch_size=4,
        num_generations=4, steps_per_generation=2, max_steps=4, kl_adaptation_method="dynamic",
    )  # fmt: skip
    recorder = Recorder(trainer)
    logs, _ = run(trainer)
    betas = [log["adaptive_kl/current_beta"] for log in logs if "adaptive_kl/current_beta" in log]
    assert len(recorder.batches) == 2  # 4 steps, 2 a generation batch
    assert betas == pytest.approx([BETA, BETA, BETA * 0.25, BETA * 0.25])  # decayed at steps 1, 2, 3: 0.5 each


def decay_every_step(self, step, **kwargs):
    """β_base halves after every optimizer step (a stand-in for `dynamic`'s rule, whatever the rewards)."""
    self.beta_base *= 0.5


# --- each method's penalty -------------------------------------------------------------------------------------------


class Recorder:
    """Records each generation batch's output and the rewards the host computed for it."""

    def __init__(self, trainer):
        self.batches, self.rewards = [], []
        original, calculate = trainer._generate_and_score_completions, trainer._calculate_rewards

        def recorded_rewards(*args):
            self.rewards.append(calculate(*args).clone())
            return self.rewards[-1]

        def recorded(inputs):
            output = original(inputs)
            self.batches.append({key: value for key, value in output.items() if torch.is_tensor(value)})
            return output

        trainer._calculate_rewards, trainer._generate_and_score_completions = recorded_rewards, recorded


def independent_penalty(sampling, reference, mask, beta, fields) -> list[float]:
    """β·Σ_t f(k) (or its mean over the completion with length_normalized), with plain floats."""
    methods = fields.get("kl_adaptation_method", "none").split("+")
    estimator = fields.get("kl_estimator", "k1")
    out = []
    for s_row, r_row, m_row in zip(sampling.tolist(), reference.tolist(), mask.tolist()):
        total, length = 0.0, 0
        for s, r, m in zip(s_row, r_row, m_row):
            if not m:
                continue
            x = s - r
            k = {"k1": x, "k2": x * x / 2, "k3": math.exp(-x) + x - 1}[estimator]
            if "clip" in methods:
                k = min(k, fields["kl_clip_threshold"])
            if "sigmoid" in methods:
                k = k / (1 + math.exp(-(k - fields["kl_target"])))
            total, length = total + k, length + 1
        out.append(beta * (total / max(length, 1) if "length_normalized" in methods else total))
    return out


METHODS = [
    {},
    {"kl_estimator": "k2"},
    {"kl_estimator": "k3"},
    {"kl_adaptation_method": "clip", "kl_clip_threshold": 0.02},
    {"kl_adaptation_method": "sigmoid", "kl_target": 0.02},
    {"kl_adaptation_method": "length_normalized"},
    {"kl_adaptation_method": "clip+length_normalized", "kl_clip_threshold": 0.02, "kl_estimator": "k3"},
    {"kl_adaptation_method": "dynamic+sigmoid", "kl_target": 0.02},
    {"kl_scaling": "sqrt"},
]


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("fields", METHODS, ids=lambda f: "-".join(map(str, f.values())) or "none")
def test_each_method_penalizes_as_its_formula(tiny_model_dir, tmp_path, fields, normalize):
    trainer = build(
        AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, normalize_advantages=normalize,
        **fields,
    )  # fmt: skip
    recorder = Recorder(trainer)
    run(trainer)
    for step, (batch, rewards) in enumerate(zip(recorder.batches, recorder.rewards), start=1):
        sampling, reference, mask = batch[SAMPLING_LOGPS], batch[REFERENCE_LOGPS], batch["completion_mask"]
        # The captured scorings are the host's: the sampling policy's sums to TRL's `old_logps`.
        assert (sampling * mask).sum(-1).tolist() == pytest.approx(batch["old_logps"].tolist(), rel=1e-12)
        beta = BETA * (1 / math.sqrt(step) if fields.get("kl_scaling") == "sqrt" and step > 1 else 1)
        penalty = independent_penalty(sampling, reference, mask, beta, fields)
        penalized = [r - p for r, p in zip(rewards[:, 0].tolist(), penalty)]
        expected = independent_rloo(penalized, 4, normalize)
        rel = NORMALIZED_STD_ROUNDING + 1e-9 if normalize else 1e-9
        assert batch["advantages"].tolist() == pytest.approx(expected, rel=rel, abs=1e-12)
        assert max(abs(p) for p in penalty) > 1e-6  # the policy is away from its reference: a real penalty


def test_the_clip_threshold_bites(tiny_model_dir, tmp_path):
    """The tests above are sensitive to the transform: its threshold does bite on this batch."""
    logs = {}
    for method, fields in (("none", IDENTITY), ("clip", {"kl_clip_threshold": 0.02})):
        trainer = build(
            AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path / method, max_steps=1,
            kl_adaptation_method=method, **fields,
        )  # fmt: skip
        logs[method] = run(trainer)[0][0]
    assert logs["clip"]["adaptive_kl/clip_fraction"] > 0
    assert logs["clip"]["adaptive_kl/reward_penalty"] != pytest.approx(logs["none"]["adaptive_kl/reward_penalty"])


# --- β's trajectory --------------------------------------------------------------------------------------------------


def penalty_betas(monkeypatch) -> list[float]:
    """The β of each penalty the trainer computes, in order."""
    betas = []
    original = lifecycle.sequence_kl_penalty

    def spy(*args, beta, **kwargs):
        betas.append(beta)
        return original(*args, beta=beta, **kwargs)

    monkeypatch.setattr(lifecycle, "sequence_kl_penalty", spy)
    return betas


def test_dynamic_beta_decays_and_reaches_beta_min(tiny_model_dir, tmp_path, monkeypatch):
    """`dynamic` with a threshold every step reaches: β halves after each step, and from `beta_schedule_steps` on it
    is `beta_min`; each generation batch is penalized with the β of the step it serves, which is logged."""
    betas = penalty_betas(monkeypatch)
    trainer = build(
        AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, max_steps=4,
        kl_adaptation_method="dynamic", reward_threshold=-1.0, dynamic_beta_decay=0.5, beta_schedule_steps=4,
        beta_min=0.01,
    )  # fmt: skip
    logs, _ = run(trainer)
    expected = [BETA, BETA / 2, BETA / 4, 0.01]
    assert betas == pytest.approx(expected)
    assert [log["adaptive_kl/current_beta"] for log in logs[:-1]] == pytest.approx(expected)


def test_stepwise_controller_follows_the_measured_kl(tiny_model_dir, tmp_path, monkeypatch):
    """A target far below the measured KL: the stepwise controller raises β by 1.5 after each step, up to its
    ceiling."""
    betas = penalty_betas(monkeypatch)
    trainer = build(
        AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, max_steps=3, kl_controller="stepwise",
        target_kl=1e-9, beta_max=2 * BETA,
    )  # fmt: skip
    logs, _ = run(trainer)
    assert betas == pytest.approx([BETA, 1.5 * BETA, 2 * BETA])  # ×1.5 again would be 2.25 β
    assert all(log["adaptive_kl/raw_kl"] == pytest.approx(log["kl"]) for log in logs[:-1])


def test_resume_restores_beta(tiny_model_dir, tmp_path, monkeypatch):
    """A run resumed from its step-2 checkpoint penalizes step 3 with the decayed β of the uninterrupted run."""
    fields = dict(
        max_steps=3, kl_adaptation_method="dynamic", reward_threshold=-1.0, dynamic_beta_decay=0.5,
        save_strategy="steps", save_steps=2,
    )  # fmt: skip
    first = build(AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, **fields)
    run(first)
    betas = penalty_betas(monkeypatch)
    resumed = build(AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, **fields)
    torch.manual_seed(0)
    resumed.train(resume_from_checkpoint=str(tmp_path / "AdaptiveKLRLOOTrainer" / "checkpoint-2"))
    assert betas == pytest.approx([BETA / 4])
    assert resumed.beta_controller.state_dict() == first.beta_controller.state_dict()


def test_resume_from_a_stock_checkpoint_is_refused_when_beta_adapts(tiny_model_dir, tmp_path):
    stock = build(RLOOTrainer, RLOOConfig, tiny_model_dir, tmp_path, save_strategy="steps", save_steps=2)
    run(stock)
    ours = build(AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, kl_controller="stepwise")
    with pytest.raises(ValueError, match="resume_without_kl_state=True"):
        ours.train(resume_from_checkpoint=str(tmp_path / "RLOOTrainer" / "checkpoint-2"))


# --- the seam and the exports ----------------------------------------------------------------------------------------


def test_the_rloo_entries_of_the_table_exist_in_the_installed_host(tiny_model_dir, tmp_path):
    trainer = make_trainer(AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, output_dir=str(tmp_path))
    entries = host_internals("rloo")
    assert {i.name for i in entries} >= {
        "normalize_advantages",
        "reward_clip_range",
        "_generate_and_score_completions",
        "ref_model",  # reference resets and the zero-β skip
        "_models",
        "optimizer",
    }
    assert not {i.name for i in entries} & {"loss_type", "scale_rewards", "importance_sampling_level"}
    owners = {"method": RLOOTrainer, "class attribute": RLOOTrainer, "accelerator attribute": trainer.accelerator}
    for internal in entries:
        assert hasattr(owners.get(internal.kind, trainer), internal.name), internal
    assert set(host_internals("grpo")) == {i for i in HOST_INTERNALS if "grpo" in i.hosts}
    assert {i.name for i in HOST_INTERNALS if "grpo" not in i.hosts} == {"normalize_advantages", "reward_clip_range"}
    assert all(i.owner == "trl.RLOOTrainer" for i in HOST_INTERNALS if i.hosts == ("rloo",))


def test_signature_and_exports():
    assert inspect.signature(AdaptiveKLRLOOTrainer.__init__) == inspect.signature(RLOOTrainer.__init__)
    assert adaptive_kl.AdaptiveKLRLOOTrainer is AdaptiveKLRLOOTrainer
    assert {"AdaptiveKLRLOOConfig", "AdaptiveKLRLOOTrainer"} <= set(adaptive_kl.__all__)
    assert set(RLOO_ESTIMATORS) == {"k1", "k2", "k3"}


def test_a_plain_rloo_config_is_refused(tiny_model_dir, tmp_path):
    args = RLOOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with pytest.raises(TypeError, match=r"replace RLOOConfig\(...\) by AdaptiveKLRLOOConfig"):
        AdaptiveKLRLOOTrainer(tiny_model_dir, [length_reward], args)


# --- evaluation, LoRA, the config's round trips ----------------------------------------------------------------------


def test_evaluation_logs_the_penalty_and_its_metrics(tiny_model_dir, tmp_path):
    trainer = build(
        AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path, max_steps=1, eval_strategy="steps",
        eval_steps=1, per_device_eval_batch_size=8, kl_adaptation_method="clip", eval_dataset=prompt_dataset(2),
    )  # fmt: skip
    logs, _ = run(trainer)
    evaluation = next(log for log in logs if "eval_loss" in log)
    assert evaluation["eval_adaptive_kl/raw_kl"] == pytest.approx(evaluation["eval_kl"]) and evaluation["eval_kl"] > 0
    assert "eval_adaptive_kl/reward_penalty" in evaluation


def test_a_lora_policy_is_penalized_against_its_base(tiny_model_dir, tmp_path):
    """With PEFT the host scores the reference with the adapter disabled: still the second scoring we take."""
    from peft import LoraConfig

    trainer = make_trainer(
        AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, output_dir=str(tmp_path), max_steps=3, beta=BETA,
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]), learning_rate=0.1,
    )  # fmt: skip
    trainer.train()
    logs = trainer.state.log_history[:-1]
    assert logs[0]["adaptive_kl/raw_kl"] == 0.0  # the adapter starts as the identity
    assert logs[-1]["adaptive_kl/raw_kl"] == pytest.approx(logs[-1]["kl"]) and logs[-1]["kl"] != 0


def test_the_config_survives_its_round_trips(tmp_path):
    import copy
    import pickle

    args = config(tmp_path, kl_adaptation_method="dynamic+sigmoid", kl_estimator="k3", beta_min=0.01)
    # TRL derives steps_per_generation from generation_batch_size and refuses both back (its own configs too).
    rebuilt = AdaptiveKLRLOOConfig(**{k: v for k, v in args.to_dict().items() if k != "steps_per_generation"})
    for twin in (pickle.loads(pickle.dumps(args)), copy.deepcopy(args), rebuilt):
        assert (twin.kl_adaptation_method, twin.kl_estimator, twin.beta_min) == ("dynamic+sigmoid", "k3", 0.01)
    with pytest.raises(ValueError, match="kl_estimator"):
        dataclasses.replace(args, kl_estimator="k1+", steps_per_generation=None)
