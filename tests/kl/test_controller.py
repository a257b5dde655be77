"""The coefficient β_t (docs/design.md §5): step scaling, dynamic decay (reward or saturation trigger), target-KL
controllers, state."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import reference_drift_beta

from adaptive_kl.kl.controller import (
    DYNAMIC_TRIGGERS,
    KL_CONTROLLERS,
    KL_SCALINGS,
    BetaController,
    adaptive_kl_update,
    adaptive_reach,
    drift_beta,
    drift_path,
    dynamic_decay,
    step_scale,
    stepwise_kl_update,
)


SETTINGS = settings(max_examples=100, deadline=None)

EXPECTED_SCALE = {
    "none": lambda t: 1.0,
    "linear": lambda t: 1.0 / t,
    "sqrt": lambda t: t**-0.5,
    "log": lambda t: 1.0 / math.log1p(t),
    "exp": lambda t: math.exp((t - 1) * math.log(0.99)),  # γ^(t−1) at the default γ
}
SCALINGS = list(EXPECTED_SCALE)

positive = st.floats(min_value=1e-6, max_value=1e3)
statistic = st.one_of(
    st.none(),
    st.just(math.nan),
    st.just(math.inf),
    st.just(-math.inf),
    st.floats(min_value=-1e6, max_value=1e6),
)


def test_names_are_those_of_the_design():
    assert set(KL_SCALINGS) == {"none", "linear", "sqrt", "log", "exp"} == set(SCALINGS)
    assert set(KL_CONTROLLERS) == {"fixed", "adaptive", "stepwise", "drift"}
    assert DYNAMIC_TRIGGERS == ("reward", "saturation")


# --------------------------------------------------------------------------------------------------------------------
# Step scaling α(t)
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scaling", SCALINGS)
def test_step_scale_matches_closed_form(scaling):
    for t in range(2, 200):
        assert step_scale(t, scaling) == pytest.approx(EXPECTED_SCALE[scaling](t), rel=1e-14)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_step_scale_is_one_up_to_first_step(scaling):
    for t in (-5, 0, 1):
        assert step_scale(t, scaling) == 1.0


def test_step_scale_known_values():
    assert step_scale(4, "linear") == 0.25
    assert step_scale(4, "sqrt") == 0.5
    assert step_scale(math.e**2 - 1, "log") == pytest.approx(0.5, rel=1e-14)
    assert step_scale(10**6, "none") == 1.0
    assert step_scale(3, "exp", 0.5) == 0.25
    assert step_scale(11, "exp", 0.9) == pytest.approx(0.3486784401, rel=1e-12)
    assert step_scale(10**6, "exp", 1.0) == 1.0  # γ = 1 is "none"
    assert step_scale(2000, "exp", 0.5) == 0.0  # underflows: β_t = 0


@pytest.mark.parametrize("rate", [0.0, -0.5, 1.01, math.nan, math.inf, "0.9", None])
def test_exp_scaling_refuses_a_rate_outside_the_unit_interval(rate):
    with pytest.raises(ValueError, match=r"kl_scaling_rate must be a number in \(0, 1\]"):
        step_scale(3, "exp", rate)
    with pytest.raises(ValueError, match="kl_scaling_rate"):
        BetaController(0.1, kl_scaling="exp", kl_scaling_rate=rate)
    assert step_scale(3, "sqrt", rate) == 1 / math.sqrt(3)  # read by "exp" only


def test_unknown_scaling_raises_naming_the_field():
    with pytest.raises(ValueError, match="kl_scaling"):
        step_scale(3, "cosine")


# --------------------------------------------------------------------------------------------------------------------
# Pure update rules
# --------------------------------------------------------------------------------------------------------------------


def test_dynamic_decay_decays_at_or_above_threshold_only():
    kw = dict(reward_threshold=0.8, decay=0.9, beta_min=0.0)
    assert dynamic_decay(0.5, 0.8, **kw) == pytest.approx(0.45, rel=1e-15)  # reaching the threshold counts
    assert dynamic_decay(0.5, 1.7, **kw) == pytest.approx(0.45, rel=1e-15)
    assert dynamic_decay(0.5, 0.7999, **kw) == 0.5
    assert dynamic_decay(0.5, -3.0, **kw) == 0.5


def test_dynamic_decay_is_floored_at_beta_min():
    assert dynamic_decay(0.1, 1.0, reward_threshold=0.8, decay=0.5, beta_min=0.08) == 0.08
    assert dynamic_decay(0.2, 1.0, reward_threshold=0.8, decay=0.5, beta_min=0.08) == pytest.approx(0.1, rel=1e-15)


@SETTINGS
@given(positive, st.floats(-10, 10), st.floats(-10, 10), st.floats(min_value=1e-3, max_value=1.0), st.floats(0, 1))
def test_dynamic_decay_never_below_beta_min_nor_above_beta(beta, reward, threshold, decay, min_fraction):
    beta_min = beta * min_fraction
    new = dynamic_decay(beta, reward, reward_threshold=threshold, decay=decay, beta_min=beta_min)
    assert beta_min <= new <= beta
    if reward < threshold:
        assert new == beta


@pytest.mark.parametrize(
    ("kl", "error"),
    [(0.05, 0.0), (0.055, 0.1), (0.045, -0.1), (0.1, 0.2), (5.0, 0.2), (0.0, -0.2), (0.03, -0.2)],
)
def test_adaptive_update_is_clipped_proportional_rule(kl, error):
    """Ziegler et al.: e = clip(KL/target − 1, ±0.2), β ← β·(1 + e·n/H)."""
    new = adaptive_kl_update(0.4, kl, target_kl=0.05, horizon=1000, num_sequences=64)
    assert new == pytest.approx(0.4 * (1 + error * 64 / 1000), rel=1e-12)


@SETTINGS
@given(positive, st.floats(0, 1e6), positive, st.integers(1, 10**5), st.integers(1, 10**4))
def test_adaptive_update_moves_beta_by_at_most_clip_times_n_over_horizon(beta, kl, target, horizon, n):
    new = adaptive_kl_update(beta, kl, target_kl=target, horizon=horizon, num_sequences=n)
    assert abs(new / beta - 1) <= 0.2 * n / horizon * (1 + 1e-12) + 1e-14  # slack: rounding of new/beta
    if kl > target:
        assert new >= beta
    elif kl < target:
        assert new <= beta


@pytest.mark.parametrize(
    ("kl", "factor"),
    [(0.0, 0.75), (0.2499, 0.75), (0.25, 1.0), (0.5, 1.0), (0.75, 1.0), (0.7501, 1.5), (100.0, 1.5)],
)
def test_stepwise_update(kl, factor):
    """Target 0.5: ×1.5 strictly above 0.75, ×0.75 strictly below 0.25, unchanged in between (boundaries included)."""
    assert stepwise_kl_update(0.2, kl, target_kl=0.5) == pytest.approx(0.2 * factor, rel=1e-15)


# --------------------------------------------------------------------------------------------------------------------
# BetaController
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scaling", SCALINGS)
def test_fixed_controller_beta_is_initial_beta_times_step_scale(scaling):
    ctrl = BetaController(0.3, kl_scaling=scaling)
    for t in range(1, 60):
        assert ctrl.beta(t) == pytest.approx(0.3 * (1.0 if t <= 1 else EXPECTED_SCALE[scaling](t)), rel=1e-14)
        assert ctrl.beta_and_scale(t)[1] == pytest.approx(1.0 if t <= 1 else EXPECTED_SCALE[scaling](t), rel=1e-14)
        ctrl.update(t, mean_reward=10.0, mean_kl=10.0, num_sequences=8)
    assert ctrl.beta_base == 0.3


def test_dynamic_trajectory_follows_reward_triggered_decay():
    rewards = [0.2, 0.9, 0.8, 0.5, 1.0, 0.95, 0.1, 0.81]
    ctrl = BetaController(0.5, dynamic=True, dynamic_beta_decay=0.7, reward_threshold=0.8, beta_min=0.1)
    expected, decays = 0.5, 0
    for step, reward in enumerate(rewards, start=1):
        assert ctrl.beta(step) == pytest.approx(expected, rel=1e-14)  # β_t uses the state before step t's update
        ctrl.update(step, mean_reward=reward)
        if reward >= 0.8:
            new = max(expected * 0.7, 0.1)
            decays += new != expected
            expected = new
        assert ctrl.beta_base == pytest.approx(expected, rel=1e-14)
    assert ctrl.num_decays == decays
    assert ctrl.beta_base == 0.1  # the fifth decay (0.5·0.7⁵ ≈ 0.084) hits the floor


def test_dynamic_with_scaling_multiplies_base_by_alpha():
    ctrl = BetaController(0.5, dynamic=True, dynamic_beta_decay=0.5, reward_threshold=0.0, kl_scaling="sqrt")
    ctrl.update(1, mean_reward=1.0)
    ctrl.update(2, mean_reward=1.0)
    assert ctrl.beta(3) == pytest.approx(0.125 / math.sqrt(3), rel=1e-14)


def test_beta_schedule_steps_switches_to_beta_min_from_that_step_on():
    ctrl = BetaController(0.5, dynamic=True, reward_threshold=2.0, beta_min=0.05, beta_schedule_steps=10)
    for step in range(1, 15):
        expected = 0.5 if step < 10 else 0.05
        assert ctrl.beta(step) == expected
        ctrl.update(step, mean_reward=0.0)  # never reaches the threshold: only the schedule acts


def test_beta_schedule_steps_applies_with_step_scaling():
    ctrl = BetaController(0.5, dynamic=True, beta_min=0.04, beta_schedule_steps=3, kl_scaling="linear")
    assert ctrl.beta(2) == pytest.approx(0.25, rel=1e-15)
    assert ctrl.beta(4) == pytest.approx(0.01, rel=1e-15)


def test_beta_schedule_steps_is_a_dynamic_setting():
    """docs/design.md §5 ties beta_schedule_steps to `dynamic`; a fixed β ignores it."""
    ctrl = BetaController(0.5, beta_min=0.05, beta_schedule_steps=2)
    assert ctrl.beta(100) == 0.5


def test_adaptive_controller_trajectory():
    kls = [0.2, 0.06, 0.05, 0.0, 0.04, 1.0]
    ctrl = BetaController(0.1, kl_controller="adaptive", target_kl=0.05, kl_horizon=100, beta_max=1.0)
    expected = 0.1
    for step, kl in enumerate(kls, start=1):
        ctrl.update(step, mean_kl=kl, num_sequences=16)
        error = min(max(kl / 0.05 - 1, -0.2), 0.2)
        expected *= 1 + error * 16 / 100
        assert ctrl.beta_base == pytest.approx(expected, rel=1e-13)


def test_stepwise_controller_trajectory():
    ctrl = BetaController(0.2, kl_controller="stepwise", target_kl=0.5, beta_max=1.0)
    expected = 0.2
    for step, (kl, factor) in enumerate([(1.0, 1.5), (0.5, 1.0), (0.1, 0.75), (0.1, 0.75), (0.8, 1.5)], start=1):
        ctrl.update(step, mean_kl=kl, num_sequences=4)
        expected *= factor
        assert ctrl.beta_base == pytest.approx(expected, rel=1e-14)


def test_stepwise_trajectory_by_hand_floor_ceiling_and_hold():
    """β = 0.2, target 0.1 (×1.5 above 0.15, ×0.75 below 0.05), floor 0.1, ceiling at its default (β's start): the
    frontier study's runaway (×1.5 a step while every group agreed) stops at 0.2 and is held on the agreeing steps."""
    ctrl = BetaController(0.2, kl_controller="stepwise", target_kl=0.1, beta_min=0.1)
    steps = [  # (KL, fraction of zero-std groups, β_base after the step)
        (0.01, 0.5, 0.15),  # ×0.75
        (0.01, 0.0, 0.1125),  # ×0.75
        (0.01, 0.5, 0.1),  # ×0.75 = 0.084375, at the floor
        (0.30, 0.5, 0.15),  # ×1.5
        (0.30, 1.0, 0.15),  # every group agreed: held
        (0.30, 1.0, 0.15),  # held
        (0.30, 0.5, 0.2),  # ×1.5 = 0.225, at the ceiling
        (0.30, 0.5, 0.2),  # stays there
        (0.10, 0.5, 0.2),  # inside the band
        (0.01, 1.0, 0.2),  # held, even below the band
        (0.01, math.nan, 0.15),  # no group with two scored: not an agreement, the rule applies
    ]
    for step, (kl, zero_std, expected) in enumerate(steps, start=1):
        ctrl.update(step, mean_kl=kl, num_sequences=8, zero_std_fraction=zero_std)
        assert ctrl.beta_base == pytest.approx(expected, rel=1e-15), step
    assert (ctrl.num_held_updates, ctrl.num_skipped_updates) == (3, 0)


def test_adaptive_trajectory_by_hand_reaches_its_ceiling_and_holds():
    """Ziegler's rule at H = 40 and 8 sequences (±4% a step at the clip) under a ceiling of 0.21."""
    ctrl = BetaController(0.2, kl_controller="adaptive", target_kl=0.1, kl_horizon=40, beta_max=0.21)
    steps = [  # (KL, fraction of zero-std groups, β_base after the step)
        (1.0, 0.0, 0.2 * 1.04),  # error clipped to +0.2: ×(1 + 0.2·8/40)
        (1.0, 1.0, 0.2 * 1.04),  # held
        (1.0, 0.5, 0.21),  # 0.2163: the ceiling
        (0.09, 0.5, 0.21 * (1 - 0.1 * 0.2)),  # error −0.1: ×(1 − 0.1·0.2)
    ]
    for step, (kl, zero_std, expected) in enumerate(steps, start=1):
        ctrl.update(step, mean_kl=kl, num_sequences=8, zero_std_fraction=zero_std)
        assert ctrl.beta_base == pytest.approx(expected, rel=1e-14), step
    assert ctrl.num_held_updates == 1


def test_adaptive_reach_is_the_clipped_rule_applied_at_its_clip():
    low, high = adaptive_reach(100, horizon=10000, num_sequences=8)
    assert (round(1 - low, 4), round(high - 1, 4)) == (0.0159, 0.0161)  # Ziegler's horizon in a 100-step run
    up = down = 1.0
    for _ in range(30):
        up = adaptive_kl_update(up, 10.0, target_kl=1.0, horizon=64, num_sequences=16)
        down = adaptive_kl_update(down, 0.0, target_kl=1.0, horizon=64, num_sequences=16)
    assert adaptive_reach(30, horizon=64, num_sequences=16) == pytest.approx((down, up), rel=1e-13)


def test_dynamic_is_not_held_when_every_group_agrees():
    """The hold is the target-KL controllers' rule: `dynamic`'s saturation trigger decays exactly there."""
    ctrl = BetaController(0.2, dynamic=True, dynamic_trigger="saturation", saturation_threshold=1.0)
    ctrl.update(1, zero_std_fraction=1.0)
    assert (ctrl.beta_base, ctrl.num_decays, ctrl.num_held_updates) == (pytest.approx(0.18), 1, 0)


@pytest.mark.parametrize("controller", ["adaptive", "stepwise"])
def test_controllers_are_bounded_below_by_beta_min(controller):
    ctrl = BetaController(0.2, kl_controller=controller, beta_min=0.07, target_kl=0.05, kl_horizon=10)
    for step in range(1, 200):
        ctrl.update(step, mean_kl=0.0, num_sequences=8)
        assert ctrl.beta_base >= 0.07
    assert ctrl.beta_base == 0.07


def test_dynamic_decay_reaches_but_never_crosses_beta_min():
    ctrl = BetaController(1.0, dynamic=True, dynamic_beta_decay=0.5, reward_threshold=0.0, beta_min=0.01)
    for step in range(1, 100):
        ctrl.update(step, mean_reward=1.0)
        assert ctrl.beta_base >= 0.01
    assert ctrl.beta_base == 0.01


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -math.inf])
def test_dynamic_skips_non_finite_reward(bad):
    ctrl = BetaController(0.5, dynamic=True, reward_threshold=0.0)
    ctrl.update(1, mean_reward=bad)
    assert ctrl.beta_base == 0.5
    assert ctrl.num_skipped_updates == 1
    assert ctrl.num_decays == 0


@pytest.mark.parametrize("controller", ["adaptive", "stepwise"])
@pytest.mark.parametrize(("kl", "n"), [(None, 8), (math.nan, 8), (math.inf, 8), (-math.inf, 8), (0.0, 0), (0.0, None)])
def test_controllers_skip_missing_or_non_finite_statistics(controller, kl, n):
    ctrl = BetaController(0.5, kl_controller=controller, target_kl=0.05, kl_horizon=10)
    ctrl.update(1, mean_kl=kl, num_sequences=n)
    assert ctrl.beta_base == 0.5
    assert ctrl.num_skipped_updates == 1


def test_an_overflowing_update_stops_at_the_ceiling():
    """Stepwise ×1.5 of a huge β overflows to inf; the ceiling, finite, takes its place."""
    ctrl = BetaController(1.5e308, kl_controller="stepwise", target_kl=0.05, beta_max=1.7e308)
    ctrl.update(1, mean_kl=10.0, num_sequences=4)
    assert ctrl.beta_base == 1.7e308
    assert ctrl.num_skipped_updates == 0


@SETTINGS
@given(
    st.sampled_from(["dynamic", "adaptive", "stepwise"]),
    positive,
    st.floats(0, 1),
    st.lists(st.tuples(statistic, statistic, st.one_of(st.none(), st.integers(0, 10**4))), max_size=40),
)
def test_beta_stays_finite_and_above_beta_min_under_any_statistics(mode, beta, min_fraction, stats):
    ctrl = BetaController(
        beta,
        dynamic=mode == "dynamic",
        kl_controller="fixed" if mode == "dynamic" else mode,
        beta_min=beta * min_fraction,
        kl_horizon=100,
        kl_scaling="log",
        beta_max=3 * beta,
    )
    for step, (reward, kl, n) in enumerate(stats, start=1):
        ctrl.update(step, mean_reward=reward, mean_kl=kl, num_sequences=n)
        assert math.isfinite(ctrl.beta_base)
        assert beta * min_fraction <= ctrl.beta_base <= 3 * beta  # dynamic only decays: its ceiling is its start
        assert math.isfinite(ctrl.beta(step + 1)) and ctrl.beta(step + 1) >= 0
    assert ctrl.last_step == len(stats)


def test_update_of_an_already_applied_step_is_ignored():
    ctrl = BetaController(0.5, dynamic=True, dynamic_beta_decay=0.5, reward_threshold=0.0)
    ctrl.update(3, mean_reward=1.0)
    assert ctrl.beta_base == 0.25
    ctrl.update(3, mean_reward=1.0)  # replay of the same step
    ctrl.update(2, mean_reward=1.0)  # an earlier step
    assert ctrl.beta_base == 0.25
    assert (ctrl.last_step, ctrl.num_decays) == (3, 1)
    ctrl.update(4, mean_reward=1.0)
    assert ctrl.beta_base == 0.125


def _run(ctrl, steps, *, start=1):
    for step in range(start, start + steps):
        ctrl.update(
            step,
            mean_reward=0.9 if step % 3 else 0.1,
            mean_kl=0.02 * step,
            num_sequences=32,
            zero_std_fraction=1.0 if step % 4 == 0 else 0.5,
        )


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(dynamic=True, dynamic_beta_decay=0.8, reward_threshold=0.5, beta_min=0.01, kl_scaling="sqrt"),
        dict(kl_controller="adaptive", target_kl=0.05, kl_horizon=200),
        dict(kl_controller="stepwise", target_kl=0.1, beta_min=0.02),
        dict(kl_controller="stepwise", target_kl=0.05, beta_max=0.6),  # held on every 4th step, at the ceiling
    ],
)
def test_state_dict_round_trip_resumes_the_same_trajectory(kwargs):
    uninterrupted = BetaController(0.4, **kwargs)
    _run(uninterrupted, 12)

    first_half = BetaController(0.4, **kwargs)
    _run(first_half, 6)
    saved = json.loads(json.dumps(first_half.state_dict()))  # checkpoints store it as JSON
    resumed = BetaController(0.4, **kwargs)
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == first_half.state_dict()
    _run(resumed, 6, start=4)  # replays steps 4-6 (ignored), then applies 7-9
    _run(resumed, 3, start=10)

    assert resumed.state_dict() == uninterrupted.state_dict()
    assert [resumed.beta(t) for t in range(1, 15)] == [uninterrupted.beta(t) for t in range(1, 15)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -0.1, "nan"])
def test_load_state_dict_refuses_invalid_beta_and_keeps_state(bad):
    ctrl = BetaController(0.4, kl_controller="stepwise")
    ctrl.update(1, mean_kl=1.0, num_sequences=4)
    before = ctrl.state_dict()
    with pytest.raises(ValueError, match="beta_base"):
        ctrl.load_state_dict({"beta_base": bad, "last_step": 7, "num_decays": 0, "num_skipped_updates": 0})
    assert ctrl.state_dict() == before


@pytest.mark.parametrize(
    "entry,bad",
    [
        ("last_step", -1),
        ("last_step", 2.5),
        ("num_decays", math.inf),
        ("num_skipped_updates", "3"),
        ("num_decays", True),
        ("num_held_updates", -2),
    ],
)
def test_load_state_dict_refuses_invalid_counters_and_keeps_state(entry, bad):
    ctrl = BetaController(0.4, kl_controller="stepwise")
    ctrl.update(1, mean_kl=1.0, num_sequences=4)
    before = ctrl.state_dict()
    state = {"beta_base": 0.3, "last_step": 7, "num_decays": 0, "num_skipped_updates": 0, entry: bad}
    with pytest.raises(ValueError, match=f"{entry}={bad!r}"):
        ctrl.load_state_dict(state)
    assert ctrl.state_dict() == before


def test_load_state_dict_takes_whole_floats_and_refuses_a_state_without_last_step():
    ctrl = BetaController(0.4)
    ctrl.load_state_dict({"beta_base": 0.2, "last_step": 5.0, "num_decays": 2.0, "num_skipped_updates": 0})
    assert ctrl.state_dict() == {
        "beta_base": 0.2,
        "last_step": 5,
        "num_decays": 2,
        "num_skipped_updates": 0,
        "num_held_updates": 0,
    }
    assert all(type(v) is int for k, v in ctrl.state_dict().items() if k != "beta_base")
    with pytest.raises(ValueError, match="last_step is missing"):
        ctrl.load_state_dict({"beta_base": 0.2})
    with pytest.raises(ValueError, match="expected a mapping"):
        ctrl.load_state_dict([0.2, 5])


@pytest.mark.parametrize(
    "kwargs,stateful",
    [
        (dict(), False),
        (dict(kl_scaling="log"), False),
        (dict(dynamic=True), True),
        (dict(kl_controller="adaptive"), True),
        (dict(kl_controller="stepwise"), True),
        (dict(kl_controller="drift", target_drift=0.1, max_steps=10), True),
    ],
)
def test_which_controllers_carry_training_state(kwargs, stateful):
    assert BetaController(0.1, **kwargs).has_training_state is stateful


def test_load_state_dict_defaults_missing_counters():
    ctrl = BetaController(0.4)
    ctrl.load_state_dict({"beta_base": 0.2, "last_step": 5})  # saved before num_held_updates existed, or older
    assert ctrl.state_dict() == {
        "beta_base": 0.2,
        "last_step": 5,
        "num_decays": 0,
        "num_skipped_updates": 0,
        "num_held_updates": 0,
    }


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("kl_controller", dict(kl_controller="pid")),
        ("kl_scaling", dict(kl_scaling="cosine")),
        ("dynamic_trigger", dict(dynamic=True, dynamic_trigger="entropy")),
        ("target_drift", dict(kl_controller="drift", max_steps=10)),
        ("target_drift", dict(kl_controller="drift", target_drift=0.0, max_steps=10)),
        ("max_steps", dict(kl_controller="drift", target_drift=0.1)),
    ],
)
def test_constructor_rejects_unknown_names(field, kwargs):
    with pytest.raises(ValueError, match=field):
        BetaController(0.1, **kwargs)


def _args(**overrides):
    base = dict(
        beta=0.3,
        kl_methods=("dynamic", "length_normalized"),
        dynamic_beta_decay=0.85,
        dynamic_trigger="saturation",
        reward_threshold=0.6,
        saturation_threshold=0.3,
        beta_min=0.02,
        beta_schedule_steps=77,
        kl_scaling="exp",
        kl_scaling_rate=0.97,
        kl_controller="fixed",
        target_kl=0.07,
        kl_horizon=5000,
        target_drift=None,
        max_steps=100,
        beta_max=None,
    )
    base.update(overrides)
    return SimpleNamespace(**base)


def test_from_args_copies_every_field():
    ctrl = BetaController.from_args(_args())
    assert ctrl.dynamic is True
    assert (ctrl.beta_base, ctrl.initial_beta) == (0.3, 0.3)
    assert (ctrl.dynamic_beta_decay, ctrl.reward_threshold, ctrl.beta_min, ctrl.beta_schedule_steps) == (
        0.85,
        0.6,
        0.02,
        77,
    )
    assert (ctrl.kl_scaling, ctrl.kl_controller, ctrl.target_kl, ctrl.kl_horizon) == ("exp", "fixed", 0.07, 5000)
    assert (ctrl.dynamic_trigger, ctrl.saturation_threshold, ctrl.kl_scaling_rate) == ("saturation", 0.3, 0.97)
    assert ctrl.trigger_threshold == 0.3 and ctrl.beta_and_scale(3)[1] == pytest.approx(0.97**2, rel=1e-15)
    assert ctrl.beta_max == 0.3  # None: where β starts
    assert ctrl.state_dict() == {
        "beta_base": 0.3,
        "last_step": 0,
        "num_decays": 0,
        "num_skipped_updates": 0,
        "num_held_updates": 0,
    }


def test_from_args_dynamic_only_when_requested():
    ctrl = BetaController.from_args(_args(kl_methods=("clip",), kl_controller="adaptive", beta_max=0.5))
    assert ctrl.dynamic is False
    ctrl.update(1, mean_reward=1.0, mean_kl=1.0, num_sequences=500)
    assert ctrl.beta_base == pytest.approx(0.3 * (1 + 0.2 * 500 / 5000), rel=1e-14)


def test_from_args_with_real_config(tmp_path):
    from adaptive_kl import AdaptiveKLGRPOConfig

    args = AdaptiveKLGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        beta=0.2,
        kl_adaptation_method="dynamic+clip",
        beta_min=0.01,
        beta_schedule_steps=5,
        kl_scaling="sqrt",
    )
    ctrl = BetaController.from_args(args)
    assert ctrl.dynamic and ctrl.kl_controller == "fixed"
    assert ctrl.beta(4) == pytest.approx(0.2 / 2, rel=1e-15)
    assert ctrl.beta(9) == pytest.approx(0.01 / 3, rel=1e-15)


def test_beta_is_zero_from_a_step_exactly_when_no_later_update_can_move_it():
    """`is_zero_from(t)`: β_t' = 0 for every t' ≥ t whatever the statistics, checked against the rule applied to a
    run of random statistics; false with beta_min > 0, before the schedule's switch, or while β_base > 0."""
    dynamic = BetaController(0.1, dynamic=True, beta_min=0.0, beta_schedule_steps=5, reward_threshold=0.5)
    assert [dynamic.is_zero_from(t) for t in range(1, 8)] == [False] * 4 + [True] * 3
    floored = BetaController(0.1, dynamic=True, beta_min=0.01, beta_schedule_steps=5)
    assert not any(floored.is_zero_from(t) for t in range(1, 20))
    fixed = BetaController(0.1, kl_scaling="log")
    assert not any(fixed.is_zero_from(t) for t in range(1, 20))
    for controller in (
        BetaController(0.1, kl_controller="adaptive", target_kl=0.05, kl_horizon=100),
        BetaController(0.1, kl_controller="stepwise", target_kl=0.05),
        BetaController(0.1, dynamic=True, reward_threshold=0.0, dynamic_beta_decay=0.5, beta_schedule_steps=10**6),
    ):
        controller.beta_base = 0.0  # reached, say, by underflow: no rule moves it from 0 with beta_min = 0
        assert controller.is_zero_from(1)
        generator = torch.Generator().manual_seed(0)
        for step in range(1, 50):
            kl, reward = torch.rand(2, generator=generator).tolist()
            controller.update(step, mean_reward=reward, mean_kl=kl * 10, num_sequences=8)
            assert controller.beta(step + 1) == 0.0
        assert controller.num_skipped_updates == 0
    dynamic.update(1, mean_reward=float("nan"))  # an update that can move β and gets no statistic: skipped
    assert dynamic.num_skipped_updates == 1
    pinned = BetaController(0.1, kl_controller="adaptive", target_kl=0.05)
    pinned.beta_base = 0.0
    pinned.update(1, mean_kl=float("nan"), num_sequences=0)  # β cannot move: nothing to measure, nothing skipped
    assert pinned.num_skipped_updates == 0 and pinned.last_step == 1


# --------------------------------------------------------------------------------------------------------------------
# The saturation trigger: the fraction of zero-std groups, and `dynamic` reading it
# --------------------------------------------------------------------------------------------------------------------


def test_saturation_trigger_decays_at_or_above_threshold_only():
    """β_base ← max(β·decay, β_min) after a step whose fraction reaches the threshold (equality counts); the mean
    reward, however high, is not read."""
    fractions = [0.25, 0.5, 0.75, 0.4999, 1.0, 0.0, 0.5]
    ctrl = BetaController(
        0.4, dynamic=True, dynamic_trigger="saturation", saturation_threshold=0.5, dynamic_beta_decay=0.5,
        beta_min=0.03,
    )  # fmt: skip
    assert ctrl.trigger_threshold == 0.5
    expected, decays = 0.4, 0
    for step, fraction in enumerate(fractions, start=1):
        assert ctrl.beta(step) == expected
        ctrl.update(step, mean_reward=100.0, zero_std_fraction=fraction)
        if fraction >= 0.5:
            new = max(expected * 0.5, 0.03)
            decays += new != expected
            expected = new
        assert ctrl.beta_base == expected
    assert (expected, ctrl.num_decays) == (0.03, 4)  # 0.4 → 0.2 → 0.1 → 0.05 → 0.03 (floored)


def test_reward_trigger_does_not_read_the_fraction():
    ctrl = BetaController(0.4, dynamic=True, reward_threshold=0.8, dynamic_beta_decay=0.5)
    ctrl.update(1, mean_reward=0.0, zero_std_fraction=1.0)
    assert ctrl.beta_base == 0.4
    ctrl.update(2, mean_reward=0.8, zero_std_fraction=0.0)
    assert ctrl.beta_base == 0.2


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -math.inf])
def test_saturation_trigger_skips_a_missing_or_non_finite_fraction(bad):
    ctrl = BetaController(0.5, dynamic=True, dynamic_trigger="saturation", saturation_threshold=0.1)
    ctrl.update(1, mean_reward=1.0, zero_std_fraction=bad)  # a finite reward does not stand in for it
    assert (ctrl.beta_base, ctrl.num_skipped_updates, ctrl.num_decays) == (0.5, 1, 0)
    ctrl.update(2, mean_reward=math.nan, zero_std_fraction=0.1)  # nor does a NaN reward skip it
    assert (ctrl.beta_base, ctrl.num_skipped_updates, ctrl.num_decays) == (0.45, 1, 1)


def test_saturation_state_round_trip_resumes_the_same_trajectory():
    """The trigger keeps no state of its own: β_base, the last step and the counters resume it."""
    kwargs = dict(dynamic=True, dynamic_trigger="saturation", saturation_threshold=0.5, dynamic_beta_decay=0.8)
    fractions = [0.5, 0.2, 1.0, math.nan, 0.75, 0.1, 0.6, 0.5]
    uninterrupted, first_half = BetaController(0.4, **kwargs), BetaController(0.4, **kwargs)
    for step, fraction in enumerate(fractions, start=1):
        uninterrupted.update(step, zero_std_fraction=fraction)
        if step <= 4:
            first_half.update(step, zero_std_fraction=fraction)
    resumed = BetaController(0.4, **kwargs)
    resumed.load_state_dict(json.loads(json.dumps(first_half.state_dict())))
    for step, fraction in enumerate(fractions, start=1):
        resumed.update(step, zero_std_fraction=fraction)  # steps 1-4 replayed: ignored
    assert resumed.state_dict() == uninterrupted.state_dict()
    assert uninterrupted.beta_base == pytest.approx(0.4 * 0.8**5, rel=1e-15)
    assert uninterrupted.num_skipped_updates == 1


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("trigger", DYNAMIC_TRIGGERS)
def test_exp_scaling_and_saturation_compose_with_the_schedule(scaling, trigger):
    ctrl = BetaController(
        0.5, dynamic=True, dynamic_trigger=trigger, reward_threshold=0.0, saturation_threshold=1.0,
        dynamic_beta_decay=0.5, beta_min=0.02, beta_schedule_steps=4, kl_scaling=scaling, kl_scaling_rate=0.9,
    )  # fmt: skip
    alpha = (lambda t: 0.9 ** (t - 1)) if scaling == "exp" else EXPECTED_SCALE[scaling]
    for step, expected_base in enumerate([0.5, 0.25, 0.125, 0.02, 0.02], start=1):
        assert ctrl.beta(step) == pytest.approx(expected_base * (alpha(step) if step > 1 else 1.0), rel=1e-14)
        ctrl.update(step, mean_reward=1.0, zero_std_fraction=1.0)


# --------------------------------------------------------------------------------------------------------------------
# The drift controller (docs/design.md, "The drift controller")


@given(step=st.integers(1, 500), steps=st.integers(1, 500), target=positive)
@SETTINGS
def test_drift_path_rises_as_the_fourth_root_of_the_run_to_the_target(step, steps, target):
    expected = target * math.exp(0.25 * math.log(min(step, steps) / steps))
    assert drift_path(step, target_drift=target, max_steps=steps) == pytest.approx(expected, rel=1e-12)
    assert drift_path(steps, target_drift=target, max_steps=steps) == target


def test_drift_beta_by_hand():
    """One measurement past the first quarter, by hand: step 30 of 100, drift 0.1, target 0.2, β = 0.1. The path
    there is 0.2 · 0.3^0.25 = 0.148017; e = log(0.675600) = −0.392154; β = 0.1 · exp(0.5 e + e) = 0.1 · 0.555309."""
    kwargs = dict(beta=0.1, beta_min=0.0, beta_max=1.0, target_drift=0.2, max_steps=100)
    assert drift_beta([[30, 0.1, 0.0]], **kwargs) == pytest.approx(0.0555309, abs=1e-7)
    # Half of it at step 20 (the first quarter) is below the path: held, not lowered
    assert drift_beta([[20, 0.05, 0.0]], **kwargs) == 0.1


def test_drift_beta_integral_stops_at_beta_min():
    """Ten measurements at a quarter of the path hold β at `beta_min` = 0.05 and its integral at log(0.05/0.1), not
    lower: a drift then at twice the path raises β at once, to 0.1 · exp(log ½ + ½ log 2 + log 2) = 0.1 · √2. With the
    integral wound down to log(1/1000) (the second rule's floor) it would have stayed at 0.05."""
    kwargs = dict(beta=0.1, beta_min=0.05, beta_max=1.0, target_drift=0.2, max_steps=100)
    low = [[step, 0.25 * drift_path(step, target_drift=0.2, max_steps=100), 0.0] for step in range(30, 80, 5)]
    assert drift_beta(low, **kwargs) == 0.05
    above = [85, 2 * drift_path(85, target_drift=0.2, max_steps=100), 0.0]
    assert drift_beta([*low, above], **kwargs) == pytest.approx(0.1 * math.sqrt(2), rel=1e-12)


@given(
    beta=st.floats(1e-3, 1.0),
    ceiling=st.floats(1.0, 100.0),
    floor=st.floats(0.0, 1.0),
    target=st.floats(1e-3, 5.0),
    steps=st.integers(4, 400),
    measured=st.lists(st.tuples(st.integers(1, 40), st.floats(0.0, 10.0)), min_size=1, max_size=30),
)
@SETTINGS
def test_drift_beta_follows_its_formula_within_its_bounds(beta, ceiling, floor, target, steps, measured):
    drifts, step, beta_min = [], 0, beta * floor
    for gap, drift in measured:
        step += gap
        drifts.append((step, drift))
    beta_max = beta * ceiling
    kwargs = dict(beta=beta, beta_min=beta_min, beta_max=beta_max, target_drift=target, max_steps=steps)
    got = drift_beta([[t, d, 0.0] for t, d in drifts], **kwargs)
    expected = reference_drift_beta(drifts, **kwargs)
    assert got == pytest.approx(expected, rel=1e-9)
    assert beta_min <= got <= beta_max


def test_drift_controller_moves_beta_only_at_measured_steps_and_keeps_its_bounds():
    ctrl = BetaController(0.1, kl_controller="drift", target_drift=0.2, max_steps=16, beta_min=0.04, beta_max=0.3)
    assert not ctrl.reads_kl and ctrl.reads_drift
    ctrl.update(1, mean_kl=5.0, num_sequences=8)  # the training KL is not what it reads
    assert (ctrl.beta_base, ctrl.last_step, ctrl.drifts) == (0.1, 0, [])
    ctrl.update(3, drift=0.0)  # far below the path, but in the first quarter (steps before 4 of 16): held
    assert ctrl.beta_base == 0.1
    ctrl.update(8, drift=1.0)  # far above the path: ×4^1.5 = 8, then the ceiling
    assert ctrl.beta_base == 0.3
    for step in (10, 11, 12):
        ctrl.update(step, drift=0.0)  # a quarter of the path, then the floor
    assert ctrl.beta_base == 0.04
    ctrl.update(13, drift=math.nan)  # counted, not applied
    assert (ctrl.beta_base, ctrl.num_skipped_updates, ctrl.last_step) == (0.04, 1, 13)
    assert [entry[0] for entry in ctrl.drifts] == [3, 8, 10, 11, 12]
    assert ctrl.drifts[1] == [8, 1.0, drift_path(8, target_drift=0.2, max_steps=16)]
    ctrl.update(14, drift=0.25)
    measured = [(t, d) for t, d, _ in ctrl.drifts]
    expected = reference_drift_beta(measured, beta=0.1, beta_min=0.04, beta_max=0.3, target_drift=0.2, max_steps=16)
    assert ctrl.beta_base == pytest.approx(expected, rel=1e-12) and 0.04 < expected < 0.3


def test_drift_controller_state_round_trips_its_measurements_and_refuses_bad_ones():
    def run(ctrl, steps):
        for step in steps:
            ctrl.update(step, drift=0.01 * step if step % 3 == 0 else None)

    kwargs = dict(kl_controller="drift", target_drift=0.1, max_steps=12, beta_max=1.0)
    uninterrupted, first_half = BetaController(0.2, **kwargs), BetaController(0.2, **kwargs)
    run(uninterrupted, range(1, 13))
    run(first_half, range(1, 7))
    resumed = BetaController(0.2, **kwargs)
    resumed.load_state_dict(json.loads(json.dumps(first_half.state_dict())))
    run(resumed, range(7, 13))
    assert resumed.state_dict() == uninterrupted.state_dict()
    assert [step for step, _, _ in resumed.drifts] == [3, 6, 9, 12]
    # A repeated, decreasing, fractional or zero step would divide by zero or a fraction of a step in `drift_beta`
    repeated, backwards = [[3, 0.03, 0.1], [3, 0.06, 0.1]], [[6, 0.06, 0.1], [3, 0.03, 0.1]]
    for bad in ([[3, math.nan, 0.1]], [[3, 0.1]], "[]", repeated, backwards, [[2.5, 0.03, 0.1]], [[0, 0.0, 0.0]]):
        with pytest.raises(ValueError, match="drifts"):
            resumed.load_state_dict({**first_half.state_dict(), "drifts": bad})
    assert resumed.state_dict() == uninterrupted.state_dict()  # left unchanged
    assert "drifts" not in BetaController(0.2, kl_controller="stepwise").state_dict()
