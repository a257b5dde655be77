"""Hostile inputs in short real training runs on the tiny model: the loss, every logged metric and β stay finite.

Each run trains `AdaptiveKLGRPOTrainer` for a few optimizer steps under a degenerate input: rewards that are missing
(None, TRL's convention, or NaN), infinite or constant; completions that are empty (EOS first) or never end (rows
masked by `mask_truncated_completions`); a reward function that raises. Where TRL itself defines what happens (it logs
`None` for a metric with no valid value, its loss becomes inf/NaN, it raises), the same run of stock `trl.GRPOTrainer`
is the reference: our trainer must log the same kind of value (finite / None / NaN / ±inf) for every key TRL logs,
the same values at step 1 (the policy still equals its reference there, so our KL term adds exactly 0), and raise the
same exception. In every case the β controller's state (`beta_controller.state_dict()`, recorded after every
optimizer step) and the logged `adaptive_kl/current_beta` stay finite, and non-finite statistics are counted as
skipped updates. Runs use `logging_nan_inf_filter=False`, so a NaN or inf loss is logged as such, not hidden.

The last test feeds log-ratios of ±100 (float32 and bfloat16) through `compute_loss` for every method.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from tiny import fabricated_inputs, loss_and_grads, make_trainer
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.kl.metrics import METRIC_NAMES


# Keys whose values are wall-clock times: never compared.
TIMING_KEYS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


class ControllerRecorder(TrainerCallback):
    """Records `beta_controller.state_dict()` at the end of every optimizer step."""

    def __init__(self, controller):
        self.controller = controller
        self.states: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.states.append(dict(self.controller.state_dict()))


def build(model_dir, out, reward_funcs, adaptive=None, **kwargs):
    """Our trainer with the KL fields `adaptive` (controller state recorded), or stock TRL if `adaptive` is None."""
    ours = adaptive is not None
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer if ours else GRPOTrainer,
        AdaptiveKLGRPOConfig if ours else GRPOConfig,
        model_dir,
        reward_funcs=reward_funcs,
        output_dir=str(out),
        logging_nan_inf_filter=False,  # a NaN/inf loss must show in the logs, not be replaced by a past average
        **kwargs,
        **(adaptive or {}),
    )
    if ours:
        trainer.recorder = ControllerRecorder(trainer.beta_controller)
        trainer.add_callback(trainer.recorder)
    return trainer


def train_both(model_dir, tmp_path, reward_funcs, adaptive, **kwargs):
    """Trains our trainer and stock TRL under the same inputs; returns (ours, stock). The warnings our run gave are
    in `ours.warnings` (messages)."""
    ours = build(model_dir, tmp_path / "ours", reward_funcs, adaptive, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours.train()
    ours.warnings = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    stock = build(model_dir, tmp_path / "stock", reward_funcs, **kwargs)
    stock.train()
    return ours, stock


def step_logs(trainer) -> dict[int, dict]:
    """The per-step log entries (logging_steps=1)."""
    return {h["step"]: h for h in trainer.state.log_history if "loss" in h}


def history(trainer, key) -> dict[int, float]:
    return {step: log[key] for step, log in step_logs(trainer).items()}


def kind(value) -> str:
    if value is None:
        return "None"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return "finite"


def assert_matches_trl(ours, stock, *, same_values_at=(1,), same_kinds_at=None):
    """For every key stock TRL logs: same kind of value (finite/None/nan/±inf) at `same_kinds_at` (default: every
    step), and the same value at `same_values_at`."""
    ours_logs, stock_logs = step_logs(ours), step_logs(stock)
    assert ours_logs.keys() == stock_logs.keys()
    for step in stock_logs if same_kinds_at is None else same_kinds_at:
        keys = stock_logs[step].keys() - TIMING_KEYS
        assert keys <= ours_logs[step].keys(), keys - ours_logs[step].keys()
        kinds = {key: kind(ours_logs[step][key]) for key in keys}
        assert kinds == {key: kind(stock_logs[step][key]) for key in keys}, f"step {step}"
    for step in same_values_at:
        for key in stock_logs[step].keys() - TIMING_KEYS:
            mine, theirs = ours_logs[step][key], stock_logs[step][key]
            if kind(theirs) == "finite":
                assert mine == pytest.approx(theirs, rel=1e-5, abs=1e-7), f"step {step}: {key}"
            else:
                assert kind(mine) == kind(theirs), f"step {step}: {key}"


def assert_finite_run(trainer, steps):
    """Loss, grad norm, every `adaptive_kl/*` metric, the parameters and the recorded controller states are finite."""
    logs = step_logs(trainer)
    assert sorted(logs) == list(range(1, steps + 1))
    for step, log in logs.items():
        for key in ("loss", "grad_norm", "kl", *METRIC_NAMES):
            assert log[key] is not None and math.isfinite(log[key]), f"step {step}: {key}={log[key]}"
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert_controller_finite(trainer, steps)


def assert_controller_finite(trainer, steps):
    """The controller state after every optimizer step and every logged β are finite; β_base ≥ 0."""
    states = trainer.recorder.states
    assert len(states) == steps
    for state in [*states, trainer.beta_controller.state_dict()]:
        assert all(math.isfinite(float(v)) for v in state.values()), state
        assert state["beta_base"] >= 0
    assert [s["last_step"] for s in states] == list(range(1, steps + 1))
    for step, beta in history(trainer, "adaptive_kl/current_beta").items():
        assert beta is not None and math.isfinite(beta), f"step {step}: current_beta={beta}"


def assert_controller_rule(trainer, rule, *, target, horizon=None, sequences):
    """β_{t+1} = rule(β_t, logged raw KL of step t): the KL-driven controllers followed their rule at every step."""
    betas, kls = history(trainer, "adaptive_kl/current_beta"), history(trainer, "adaptive_kl/raw_kl")
    for t in range(1, max(betas)):
        if rule == "adaptive":
            error = min(max(kls[t] / target - 1, -0.2), 0.2)
            expected = betas[t] * (1 + error * sequences / horizon)
        else:
            expected = betas[t] * (1.5 if kls[t] > 1.5 * target else 0.75 if kls[t] < 0.5 * target else 1.0)
        assert betas[t + 1] == pytest.approx(expected, rel=1e-9), f"step {t + 1}"


def warned(trainer, fragment: str) -> list[str]:
    """Our warnings that contain `fragment`."""
    return [message for message in trainer.warnings if fragment in message]


def by_index(values):
    """A reward function that scores completion i of the batch with values[i % len(values)] (content-blind, so
    stock TRL and our trainer see the same rewards even after their policies diverge)."""

    def indexed_reward(completions, **kwargs):
        return [values[i % len(values)] for i in range(len(completions))]

    return indexed_reward


# --- 1. missing rewards ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", [None, float("nan")], ids=["None", "nan"])
def test_missing_rewards_skip_the_dynamic_update_and_log_like_trl(tiny_model_dir, tmp_path, missing):
    """Half the rewards missing at step 1, all at step 2: β decays at steps 1, 3, 4, is unchanged by step 2 (one
    skipped update); everything finite; TRL's keys (reward None at step 2) as stock TRL logs them."""

    def sparse_reward(completions, trainer_state, **kwargs):
        step = trainer_state.global_step + 1
        values = [1.0, 1.5, 2.0, 2.5]  # mean 1.75 over all, 2.0 over the odd half: both ≥ the threshold
        if step == 2:
            return [missing] * len(completions)
        return [missing if step == 1 and i % 2 == 0 else values[i % 4] for i in range(len(completions))]

    adaptive = dict(
        kl_adaptation_method="dynamic+clip", kl_clip_threshold=1e-4, reward_threshold=1.0, dynamic_beta_decay=0.5
    )
    ours, stock = train_both(
        tiny_model_dir, tmp_path, [sparse_reward], adaptive, beta=0.1, max_steps=4, learning_rate=5e-2
    )
    assert_finite_run(ours, 4)
    assert history(ours, "adaptive_kl/current_beta") == pytest.approx({1: 0.1, 2: 0.05, 3: 0.05, 4: 0.025})
    assert ours.beta_controller.state_dict() == {
        "beta_base": pytest.approx(0.0125),
        "last_step": 4,
        "num_decays": 3,
        "num_skipped_updates": 1,
        "num_held_updates": 0,
    }
    assert [s["num_skipped_updates"] for s in ours.recorder.states] == [0, 1, 1, 1]
    # Visible: one warning for the run, and the count in the logs.
    assert history(ours, "adaptive_kl/skipped_updates") == {1: 0, 2: 1, 3: 1, 4: 1}
    [skip] = warned(ours, "β was not updated")
    assert "after optimizer step 2: its mean reward nan is not finite" in skip and "β stays at 0.05" in skip
    assert not warned(ours, "returned ±inf for")  # None / NaN is TRL's "no reward", not an error
    assert history(stock, "reward")[2] is None and history(stock, "reward")[1] == pytest.approx(2.0)
    assert history(ours, "adaptive_kl/raw_kl")[4] > 0  # the policy moved: the KL term was live
    assert_matches_trl(ours, stock)


# --- 2. infinite rewards --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sign,adaptive",
    [
        (1.0, dict(kl_adaptation_method="dynamic+sigmoid", reward_threshold=-10.0)),
        (
            -1.0,
            dict(
                kl_adaptation_method="clip",
                kl_clip_threshold=1e-3,
                kl_controller="stepwise",
                target_kl=2e-3,
                beta_max=0.2,
            ),
        ),
    ],
    ids=["+inf-dynamic", "-inf-stepwise"],
)
def test_infinite_rewards_never_reach_beta(tiny_model_dir, tmp_path, sign, adaptive):
    """One ±inf reward in the first of two groups: TRL logs reward ±inf (same kinds as stock); the loss, our metrics
    and β stay finite; `dynamic` skips every update (+inf ≥ threshold must not decay β); `stepwise` follows its
    rule on the (finite) KL."""
    reward = by_index([sign * math.inf, 0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 3.0])
    ours, stock = train_both(
        tiny_model_dir,
        tmp_path,
        [reward],
        adaptive,
        beta=0.1,
        max_steps=3,
        per_device_train_batch_size=8,
        learning_rate=5e-2,
    )
    assert_finite_run(ours, 3)
    assert set(history(stock, "reward").values()) == {sign * math.inf}
    assert_matches_trl(ours, stock)
    [infinite] = warned(ours, "returned ±inf for")  # once per run, although every batch has one
    assert "of the 8 completions of a generation batch: indexed_reward (1)." in infinite
    if "dynamic" in adaptive["kl_adaptation_method"]:
        assert history(ours, "adaptive_kl/current_beta") == {1: 0.1, 2: 0.1, 3: 0.1}
        assert ours.beta_controller.num_skipped_updates == 3 and ours.beta_controller.num_decays == 0
        assert history(ours, "adaptive_kl/skipped_updates") == {1: 1, 2: 2, 3: 3}
        [skip] = warned(ours, "β was not updated")
        assert "after optimizer step 1: its mean reward inf is not finite" in skip
    else:
        assert ours.beta_controller.num_skipped_updates == 0
        assert history(ours, "adaptive_kl/skipped_updates") == {1: 0, 2: 0, 3: 0}
        assert not warned(ours, "β was not updated")
        assert_controller_rule(ours, "stepwise", target=2e-3, sequences=8)
        assert history(ours, "adaptive_kl/raw_kl")[3] > 0


# --- 2b. an infinite reward that makes TRL itself diverge ---------------------------------------------------------


@pytest.fixture(scope="module")
def diverging_runs(tiny_model_dir, tmp_path_factory):
    """scale_rewards="none" and one +inf reward: TRL's advantages become -3.4e38, its loss inf, the parameters NaN;
    the second iteration on the same batch (num_iterations=2) has NaN log-probs, and the next generation raises.
    Returns (ours, stock, our error, stock's error)."""
    tmp = tmp_path_factory.mktemp("diverging")
    kwargs = dict(
        beta=0.1,
        max_steps=4,
        per_device_train_batch_size=8,
        num_iterations=2,
        scale_rewards="none",
        generation_kwargs={"sequence_bias": {(1,): 3.0}},  # EOS (id 1) likelier: completion lengths vary
    )
    reward = by_index([math.inf, 0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 3.0])
    adaptive = dict(kl_adaptation_method="sigmoid", kl_controller="adaptive", target_kl=1e-3, kl_horizon=16)
    runs = []
    for config in (adaptive, None):
        trainer = build(tiny_model_dir, tmp / ("ours" if config else "stock"), [reward], config, **kwargs)
        with pytest.raises(RuntimeError) as info:
            trainer.train()
        runs.append((trainer, info.value))
    (ours, our_error), (stock, stock_error) = runs
    return ours, stock, our_error, stock_error


def test_trl_divergence_is_kept_and_beta_stays_finite(diverging_runs):
    """Where TRL's own loss goes inf then NaN and its next generation raises, ours logs and raises the same; β updates
    at step 1 (KL 0: β·(1 − 0.2·8/16)), skips the NaN-KL step 2, and stays finite."""
    ours, stock, our_error, stock_error = diverging_runs
    assert type(our_error) is type(stock_error) and str(our_error) == str(stock_error)
    assert_matches_trl(ours, stock)
    assert kind(history(stock, "loss")[1]) == "+inf" and kind(history(stock, "loss")[2]) == "nan"
    assert history(stock, "kl") == {1: 0.0, 2: None}  # TRL: no valid KL value at step 2
    for key in ("adaptive_kl/raw_kl", "adaptive_kl/adapted_kl", "adaptive_kl/seq_kl"):
        assert history(ours, key) == {1: 0.0, 2: None}, key  # like TRL's `kl`, not a made-up number
    for key in ("adaptive_kl/current_beta", "adaptive_kl/beta_scale", "adaptive_kl/clip_fraction"):
        assert all(kind(v) == "finite" for v in history(ours, key).values()), key
    assert_controller_finite(ours, 2)
    assert history(ours, "adaptive_kl/current_beta") == pytest.approx({1: 0.1, 2: 0.09})
    assert ours.beta_controller.state_dict() == {
        "beta_base": pytest.approx(0.09),
        "last_step": 2,
        "num_decays": 0,
        "num_skipped_updates": 1,
        "num_held_updates": 0,
    }


def test_length_correlation_is_not_reported_from_a_nan_kl(diverging_runs):
    """At the NaN-KL step (lengths vary, KL is NaN) `adaptive_kl/kl_length_corr` is None like TRL's `kl`, not +1.0."""
    ours, stock, _, _ = diverging_runs
    lengths = step_logs(stock)[1]
    assert lengths["completions/min_length"] < lengths["completions/max_length"]  # the correlation has an x spread
    assert history(stock, "kl")[2] is None
    assert history(ours, "adaptive_kl/kl_length_corr")[2] is None


# --- 3. empty completions -------------------------------------------------------------------------------------------


def test_empty_completions(tiny_model_dir, tmp_path):
    """Every token but EOS suppressed: every completion decodes to "" (one EOS token); loss, metrics and β finite,
    the adaptive controller follows its rule on the EOS-token KL; TRL's keys as stock TRL logs them."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    eos = tokenizer.eos_token_id
    seen = []

    def recording_reward(completions, completion_ids, **kwargs):
        seen.append((list(completions), [list(ids) for ids in completion_ids]))
        return [float(i % 4) for i in range(len(completions))]

    adaptive = dict(
        kl_adaptation_method="clip", kl_clip_threshold=1e-4, kl_controller="adaptive", target_kl=1e-3, kl_horizon=16
    )
    ours, stock = train_both(
        tiny_model_dir,
        tmp_path,
        [recording_reward],
        adaptive,
        beta=0.1,
        max_steps=3,
        learning_rate=5e-2,
        generation_kwargs={"suppress_tokens": [i for i in range(len(tokenizer)) if i != eos]},
    )
    assert len(seen) == 6 and all(c == [""] * 4 and ids == [[eos]] * 4 for c, ids in seen)
    assert_finite_run(ours, 3)
    assert history(ours, "completions/mean_length") == {1: 1.0, 2: 1.0, 3: 1.0}
    assert history(ours, "adaptive_kl/raw_kl")[3] > 0
    assert_controller_rule(ours, "adaptive", target=1e-3, horizon=16, sequences=4)
    assert_matches_trl(ours, stock)


# --- 4. fully masked rows -------------------------------------------------------------------------------------------


def test_truncated_rows_masked(tiny_model_dir, tmp_path):
    """EOS made likelier: some completions end, the others are truncated and masked (whole rows of the mask 0);
    loss, metrics and β finite; `dynamic` decays as usual; step 1 identical to stock TRL."""
    adaptive = dict(kl_adaptation_method="dynamic+sigmoid", reward_threshold=1.0, dynamic_beta_decay=0.5)
    ours, stock = train_both(
        tiny_model_dir,
        tmp_path,
        [by_index([0.0, 1.0, 2.0, 3.0])],
        adaptive,
        beta=0.1,
        max_steps=3,
        learning_rate=5e-2,
        mask_truncated_completions=True,
        generation_kwargs={"sequence_bias": {(1,): 3.0}},  # EOS (id 1) likelier: some completions end, some don't
    )
    clipped = history(stock, "completions/clipped_ratio")
    assert 0 < clipped[1] < 1  # the premise: a mix of ended and masked rows
    assert_finite_run(ours, 3)
    assert history(ours, "adaptive_kl/current_beta") == pytest.approx({1: 0.1, 2: 0.05, 3: 0.025})
    assert_matches_trl(ours, stock, same_kinds_at=[1])  # later steps sample from different policies


def test_every_row_masked(tiny_model_dir, tmp_path):
    """EOS and pad suppressed: every completion is truncated, so every row is masked at every step: loss 0, KL metrics
    0, TRL's per-sequence clip metrics None as in stock TRL; no tokens means no KL measurement, so `stepwise` skips
    every update and β stays put."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    adaptive = dict(kl_adaptation_method="sigmoid", kl_controller="stepwise", target_kl=1e-3)
    ours, stock = train_both(
        tiny_model_dir,
        tmp_path,
        [by_index([0.0, 1.0, 2.0, 3.0])],
        adaptive,
        beta=0.1,
        max_steps=3,
        mask_truncated_completions=True,
        generation_kwargs={"suppress_tokens": [tokenizer.eos_token_id, tokenizer.pad_token_id]},
    )
    assert history(stock, "completions/clipped_ratio") == {1: 1.0, 2: 1.0, 3: 1.0}
    assert history(stock, "clip_ratio/low_min") == {1: None, 2: None, 3: None}  # TRL: no unmasked row
    assert_finite_run(ours, 3)
    assert history(ours, "loss") == {1: 0.0, 2: 0.0, 3: 0.0}
    for name in ("raw_kl", "adapted_kl", "seq_kl", "kl_length_corr"):
        assert history(ours, f"adaptive_kl/{name}") == {1: 0.0, 2: 0.0, 3: 0.0}, name
    assert history(ours, "adaptive_kl/current_beta") == {1: 0.1, 2: 0.1, 3: 0.1}
    assert ours.beta_controller.num_skipped_updates == 3
    assert_matches_trl(ours, stock)


# --- 5. zero reward spread ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "adaptive,expected_betas",
    [
        (
            dict(kl_adaptation_method="dynamic+clip", reward_threshold=0.5, dynamic_beta_decay=0.5),
            {1: 0.1, 2: 0.05, 3: 0.025},
        ),
        (
            dict(kl_adaptation_method="sigmoid", kl_controller="adaptive", target_kl=1e-3, kl_horizon=16),
            {1: 0.1, 2: 0.1, 3: 0.1},
        ),
    ],
    ids=["dynamic", "adaptive"],
)
def test_zero_reward_spread(tiny_model_dir, tmp_path, adaptive, expected_betas):
    """Two groups, each with a constant reward (0 and 1): advantages 0, KL 0, loss exactly 0 as in stock TRL; β
    follows its rule exactly (dynamic: mean 0.5 ≥ threshold; adaptive: every group agreed, so the controller holds
    β, where its rule on KL 0 would have lowered it to β·(1 − 0.2·8/16)); all finite."""
    ours, stock = train_both(
        tiny_model_dir,
        tmp_path,
        [by_index([0.0] * 4 + [1.0] * 4)],
        adaptive,
        beta=0.1,
        max_steps=3,
        per_device_train_batch_size=8,
    )
    assert history(stock, "frac_reward_zero_std") == {1: 1.0, 2: 1.0, 3: 1.0}
    assert_finite_run(ours, 3)
    assert history(ours, "loss") == history(stock, "loss") == {1: 0.0, 2: 0.0, 3: 0.0}
    assert history(ours, "adaptive_kl/current_beta") == pytest.approx(expected_betas, rel=1e-12)
    assert ours.beta_controller.num_skipped_updates == 0
    assert ours.beta_controller.num_held_updates == (3 if "kl_controller" in adaptive else 0)
    assert_matches_trl(ours, stock, same_values_at=(1, 2, 3))


# --- 6. a reward function that raises -------------------------------------------------------------------------------


class RewardServiceDown(RuntimeError):
    pass


def failing_reward(fail_on_call: int):
    """A reward function that raises a `RewardServiceDown` on its `fail_on_call`-th call; returns it and the error."""
    error = RewardServiceDown(f"reward service unavailable (call {fail_on_call})")
    calls = []

    def flaky_reward(completions, **kwargs):
        calls.append(len(completions))
        if len(calls) == fail_on_call:
            raise error
        return [float(i % 4) for i in range(len(completions))]

    return flaky_reward, error


@pytest.mark.parametrize(
    "adaptive",
    [
        dict(kl_adaptation_method="dynamic+clip", reward_threshold=1.0),
        dict(kl_adaptation_method="sigmoid", kl_controller="stepwise", target_kl=1e-3),
    ],
    ids=["dynamic", "stepwise"],
)
def test_reward_exception_propagates_unchanged(tiny_model_dir, tmp_path, adaptive):
    """The reward function's own exception object leaves `train()` (as it does from stock TRL); the controller state
    is finite and exactly what it was after the last finished step."""
    common = dict(beta=0.1, max_steps=4, gradient_accumulation_steps=2, learning_rate=5e-2)
    trainers = {}
    for name, config in (("ours", adaptive), ("stock", None)):
        reward, error = failing_reward(3)  # one generation per optimizer step: fails in step 3
        trainer = trainers[name] = build(tiny_model_dir, tmp_path / name, [reward], config, **common)
        with pytest.raises(RewardServiceDown) as info:
            trainer.train()
        assert info.value is error and str(info.value) == "reward service unavailable (call 3)"
        assert info.value.__cause__ is None and trainer.state.global_step == 2
    ours = trainers["ours"]
    assert_controller_finite(ours, 2)
    assert ours.beta_controller.state_dict() == ours.recorder.states[-1]  # unchanged since step 2 ended
    assert ours.beta_controller.last_step == 2


def test_resume_after_a_mid_step_reward_exception_gives_the_uninterrupted_trajectory(tiny_model_dir, tmp_path):
    """Reward raises in the 2nd micro-batch of step 3; resuming the same trainer from checkpoint-2 gives the β of an
    uninterrupted run (the failed step's first micro-batch must not count in the adaptive update)."""
    adaptive = dict(kl_adaptation_method="sigmoid", kl_controller="adaptive", target_kl=1e-3, kl_horizon=16)
    common = dict(
        beta=0.2,
        max_steps=4,
        learning_rate=5e-2,
        gradient_accumulation_steps=2,
        steps_per_generation=1,  # a generation (and a reward call) per micro-batch
        save_strategy="steps",
        save_steps=1,
    )
    full = build(tiny_model_dir, tmp_path / "full", [by_index([0.0, 1.0, 2.0])], adaptive, **common)
    full.train()
    calls = []

    def flaky_once(completions, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # generation of the 2nd micro-batch of step 3
            raise RewardServiceDown("reward service unavailable")
        return [(0.0, 1.0, 2.0)[i % 3] for i in range(len(completions))]

    resumed = build(tiny_model_dir, tmp_path / "resumed", [flaky_once], adaptive, **common)
    with pytest.raises(RewardServiceDown):
        resumed.train()
    assert resumed.beta_controller.last_step == 2 and math.isfinite(resumed.beta_controller.beta_base)
    resumed.train(resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-2"))
    assert resumed.beta_controller.last_step == 4
    resumed_betas = history(resumed, "adaptive_kl/current_beta")
    assert resumed_betas == pytest.approx(history(full, "adaptive_kl/current_beta"), rel=1e-9)
    assert resumed.beta_controller.beta_base == pytest.approx(full.beta_controller.beta_base, rel=1e-9)


# --- 7. extreme log-ratios through compute_loss ---------------------------------------------------------------------


EXTREME_CONFIGS = [
    dict(),
    dict(kl_adaptation_method="clip"),
    dict(kl_adaptation_method="sigmoid"),
    dict(kl_adaptation_method="length_normalized"),
    dict(kl_adaptation_method="dynamic+clip"),
    dict(kl_adaptation_method="dynamic+sigmoid+length_normalized"),
    dict(kl_adaptation_method="sigmoid", kl_controller="adaptive"),
    dict(kl_adaptation_method="clip", kl_controller="stepwise"),
    dict(kl_adaptation_method="sigmoid", kl_estimator="k2"),
    dict(kl_adaptation_method="clip", kl_estimator="k1"),
    dict(kl_adaptation_method="sigmoid", use_bias_correction_kl=True),
    dict(kl_adaptation_method="sigmoid", loss_type="dapo"),
]


@pytest.mark.filterwarnings("ignore:kl_estimator='k1'")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_log_ratios_of_100_give_finite_loss_and_gradients(tiny_model_dir, tmp_path, dtype):
    """Reference log-probs at log π ± 100 (alternating per token; model and log-probs in `dtype`): stock TRL's loss
    is not finite, and neither is ours at the defaults (its arithmetic is stock's); with the opt-in clamp
    `kl_log_ratio_clip=20`, ours and every parameter gradient are, for every method, and the KL term is still in the
    loss."""
    stock = make_trainer(GRPOTrainer, GRPOConfig, tiny_model_dir, beta=0.1, output_dir=str(tmp_path / "stock"))

    def extreme(trainer):
        trainer.model.to(dtype)
        inputs = fabricated_inputs(trainer)
        old = inputs["old_per_token_logps"].to(dtype)
        sign = torch.ones_like(old)
        sign[:, ::2] = -1.0
        inputs["old_per_token_logps"] = old
        inputs["ref_per_token_logps"] = old + 100.0 * sign
        return inputs

    stock_loss, _ = loss_and_grads(stock, extreme(stock))
    assert not torch.isfinite(stock_loss)  # the premise: an unclamped k3 overflows
    default = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, beta=0.1, output_dir=str(tmp_path / "default")
    )
    assert not torch.isfinite(loss_and_grads(default, extreme(default))[0])  # at the defaults, as stock
    policy_only = {}  # stock TRL at β = 0, per loss type: the policy term alone
    for config in EXTREME_CONFIGS:
        ours = make_trainer(
            AdaptiveKLGRPOTrainer,
            AdaptiveKLGRPOConfig,
            tiny_model_dir,
            beta=0.1,
            output_dir=str(tmp_path / "ours"),
            kl_log_ratio_clip=20.0,
            **config,
        )
        inputs = extreme(ours)
        loss, grads = loss_and_grads(ours, inputs)
        assert torch.isfinite(loss), config
        assert grads and all(torch.isfinite(g).all() for g in grads.values()), config
        assert all(g.dtype == dtype for g in grads.values()), config
        loss_type = {"loss_type": config["loss_type"]} if "loss_type" in config else {}
        key = str(loss_type)
        if key not in policy_only:
            policy_only[key] = make_trainer(
                GRPOTrainer, GRPOConfig, tiny_model_dir, beta=0.0, output_dir=str(tmp_path / "policy"), **loss_type
            )
            policy_only[key].model.to(dtype)
        policy_loss, _ = loss_and_grads(policy_only[key], inputs)
        assert abs(loss.item() - policy_loss.item()) > 1e-3, config  # the clamped KL term is in the loss
