"""The coefficient β_t: step scaling, reward- or saturation-triggered decay, target-KL controllers and the drift
controller.

β_t = β_base(t) · α(t) for optimizer step t = 1, 2, …; β_t is constant within a step. The pure update rules are
module-level functions; `BetaController` composes them and carries the state that checkpoints save and restore.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

from .validation import is_finite_number


KL_SCALINGS = ("none", "linear", "sqrt", "log", "exp")
KL_CONTROLLERS = ("fixed", "adaptive", "stepwise", "drift")
KL_TARGET_CONTROLLERS = ("adaptive", "stepwise")  # those that read the training KL (`target_kl`)
DYNAMIC_TRIGGERS = ("reward", "saturation")
DEFAULT_KL_SCALING_RATE = 0.99  # γ of kl_scaling="exp": α halves in about 69 steps

# Ziegler et al. (2019) clip the proportional error to ±0.2 so one noisy step cannot move β by more than 0.2·n/H.
ADAPTIVE_ERROR_CLIP = 0.2
# Stepwise controller: grow β by 1.5× above 1.5·target, shrink it by 0.75× below 0.5·target (the rule of the seed
# "Tutorial 15: KL Divergence and Policy Regularization"; no published source).
STEPWISE_HIGH, STEPWISE_LOW = 1.5, 0.5
STEPWISE_UP, STEPWISE_DOWN = 1.5, 0.75
# Drift controller (docs/design.md §5, "The drift controller"). The path's power: on SmolLM2 LoRA
# (docs/studies/real/frontier_sum) a constant β had drifted, by a quarter of the run, 0.57–1.0 of its final drift (mean
# over 5 seeds at each β from 0.02 to 0.2): (1/4)^0.25 = 0.71 lies in that range.
DRIFT_PATH_POWER = 0.25
# Under a constant β the drift rises to a height β sets and levels off there (on SmolLM2 LoRA,
# docs/studies/real/drift_sum: 0.131 at step 25 and 0.129 at step 100 under β = 0.2, seed mean; 0.43 and 0.54 under
# 0.04), with a lag and a scatter from measurement to measurement. log β is a proportional term plus a slower integral
# of the error of the drift against the path (a PI rule on log β; Åström & Murray, "Feedback Systems", 2008, ch. 10–11,
# for PI control and integrator windup). Two rules came before it: a pure integral, clipped to ×2 a measurement (the
# first rule), swung the drift around the path with a period of 40–50 steps (docs/studies/real/drift_sum/first_rule);
# the same PI rule on the drift extrapolated 10 steps along its last slope (the second rule) tripled each jitter of the
# drift and moved β by factors up to 18 between measurements (docs/studies/real/drift_sum/second_rule). Dropping the
# slope was chosen on surrogates weighted by how well they reproduce those 15 runs (`scripts/drift_surrogate.py`).
DRIFT_PROPORTIONAL_GAIN = 1.0
DRIFT_INTEGRAL_GAIN = 0.5
DRIFT_MAX_RATIO = 4.0  # the error's ratio is clipped to [1/4, 4]: one measurement moves the proportional term ≤ 4×
# The integral's β stays within [max(beta_min, beta / 1000), beta_max]: it does not wind up past a bound β is held at.
DRIFT_INTEGRAL_RANGE = 1000.0
# Nor does it lower β in the first quarter of the run, where a drift below the path is the lag before the reward is
# learned: in a pilot (SmolLM2, seed 0; docs/studies/real/drift_sum/pilot) lowering β there to 0.029 and 0.0125 let
# the burst of steps 15–25 overshoot both targets (drift 0.61 against 0.13, 0.79 against 0.6, at step 25).
DRIFT_NO_LOWERING_FRACTION = 0.25


# The step scalings and `dynamic` come from the seeds "EasyR1 with Dynamic KL Scaling" and "Adaptive KL Divergence for
# GRPO Training", which cite no published source: docs/design.md defines them.
def step_scale(step: int, scaling: str, rate: float = DEFAULT_KL_SCALING_RATE) -> float:
    """α(t): 1 for t ≤ 1; otherwise 1, 1/t, 1/√t, 1/ln(t+1) or γ^(t−1) (γ = `rate`, `kl_scaling_rate`) for "none",
    "linear", "sqrt", "log", "exp"."""
    if scaling not in KL_SCALINGS:
        raise ValueError(f"kl_scaling must be one of {KL_SCALINGS}, got {scaling!r}.")
    if scaling == "exp" and not (is_finite_number(rate) and 0 < rate <= 1):
        raise ValueError(f"kl_scaling_rate must be a number in (0, 1], got {rate!r}.")
    if scaling == "none" or step <= 1:
        return 1.0
    if scaling == "linear":
        return 1.0 / step
    if scaling == "sqrt":
        return 1.0 / math.sqrt(step)
    if scaling == "exp":
        # Underflows to 0.0 only past t ≈ 70000 at γ = 0.99; β_t = 0 then, which every consumer of β takes.
        return rate ** (step - 1)
    return 1.0 / math.log(step + 1)


def dynamic_decay(beta: float, mean_reward: float, *, reward_threshold: float, decay: float, beta_min: float) -> float:
    """`dynamic`: β ← max(β·decay, β_min) when the step's mean reward reaches the threshold, else unchanged."""
    if mean_reward >= reward_threshold:
        return max(beta * decay, beta_min)
    return beta


# Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", arXiv:1909.08593 §2.2; the n/horizon form
# is their code's: openai/lm-human-preferences@cbfd210bb8b08f6bc5c26878c10984b90f516c66
# lm_human_preferences/train_policy.py L115-124 (`AdaptiveKLController`).
def adaptive_kl_update(beta: float, kl: float, *, target_kl: float, horizon: int, num_sequences: int) -> float:
    """Ziegler et al. (2019): e = clip(KL/target − 1, ±0.2); β ← β·(1 + e·n/horizon)."""
    error = min(max(kl / target_kl - 1.0, -ADAPTIVE_ERROR_CLIP), ADAPTIVE_ERROR_CLIP)
    return beta * (1.0 + error * num_sequences / horizon)


def adaptive_reach(steps: int, *, horizon: int, num_sequences: int) -> tuple[float, float]:
    """The factors by which `adaptive_kl_update` can move β in `steps` steps of `num_sequences` sequences, at most:
    `((1 − 0.2·n/H)^steps, (1 + 0.2·n/H)^steps)`, every step's error at its clip. At Ziegler's horizon (10,000) with 8
    sequences a step, 100 steps move β by 1.6% at most."""
    per_step = ADAPTIVE_ERROR_CLIP * num_sequences / horizon
    return (1.0 - per_step) ** steps, (1.0 + per_step) ** steps


def stepwise_kl_update(beta: float, kl: float, *, target_kl: float) -> float:
    """β ← 1.5·β if KL > 1.5·target; 0.75·β if KL < 0.5·target; else unchanged."""
    if kl > STEPWISE_HIGH * target_kl:
        return beta * STEPWISE_UP
    if kl < STEPWISE_LOW * target_kl:
        return beta * STEPWISE_DOWN
    return beta


def drift_path(step: int, *, target_drift: float, max_steps: int) -> float:
    """The drift the controller asks for at optimizer step `step` of `max_steps`: target · (t/T)^0.25, which reaches
    `target_drift` at the run's last step."""
    return target_drift * (min(step, max_steps) / max_steps) ** DRIFT_PATH_POWER


def drift_beta(
    drifts: list[list], *, beta: float, beta_min: float, beta_max: float, target_drift: float, max_steps: int
) -> float:
    """β_base after the measurements `drifts` (`[step, drift, …]` in order), starting from `beta`. At measurement k
    (step t_k, drift D_k):

        e_k = log clip(D_k / path(t_k), 1/4, 4)                        ≥ 0 in the first quarter: β is not lowered there
        I_k = clip(I_{k−1} + K_i · e_k, log(max(β_min/β, 1/1000)), log(β_max/β))       I_0 = 0
        β_k = clip(β · exp(I_k + K_p · e_k), β_min, β_max)

    with K_p = `DRIFT_PROPORTIONAL_GAIN`, K_i = `DRIFT_INTEGRAL_GAIN`. A function of the measurements alone, so a
    resumed run that has them has its β. `beta` > 0 (the config refuses 0 with a controller)."""
    integral, error = 0.0, 0.0
    floor = math.log(max(beta_min / beta, 1.0 / DRIFT_INTEGRAL_RANGE))
    ceiling = math.log(beta_max / beta)
    for step, drift, *_ in drifts:
        path = drift_path(step, target_drift=target_drift, max_steps=max_steps)
        error = math.log(min(max(drift / path, 1.0 / DRIFT_MAX_RATIO), DRIFT_MAX_RATIO))
        if step < DRIFT_NO_LOWERING_FRACTION * max_steps:
            error = max(error, 0.0)
        integral = min(max(integral + DRIFT_INTEGRAL_GAIN * error, floor), ceiling)
    return min(max(beta * math.exp(integral + DRIFT_PROPORTIONAL_GAIN * error), beta_min), beta_max)


class BetaController:
    """Owns β_base and computes β_t for each optimizer step.

    Args:
        beta (`float`): the initial β_base (`args.beta`).
        dynamic (`bool`): triggered decay of β_base (`"dynamic"` in `kl_adaptation_method`).
        dynamic_trigger (`str`): what triggers it: `"reward"` (the step's mean reward ≥ `reward_threshold`) or
            `"saturation"` (its fraction of zero-std groups ≥ `saturation_threshold`).
        dynamic_beta_decay, reward_threshold, saturation_threshold, beta_min, beta_schedule_steps: see
            `AdaptiveKLGRPOConfig`.
        kl_scaling (`str`), kl_scaling_rate (`float`): the step scaling α(t), and γ of `"exp"`.
        kl_controller (`str`): `"fixed"`, `"adaptive"`, `"stepwise"` or `"drift"`.
        target_kl (`float`), kl_horizon (`int`): target-KL controller parameters.
        target_drift (`float` or `None`), max_steps (`int`): the drift controller's target at the run's last step, and
            that step (`drift_path`).
        beta_max (`float` or `None`): the ceiling of a controller's β_base; `None`: `beta`, where it starts.

    `update(step, ...)` is called once per finished optimizer step with that step's global statistics; non-finite
    statistics leave the state untouched (and are counted), so β can never become NaN or inf. A target-KL controller
    keeps β_base in [`beta_min`, ceiling] and holds it (counted) after a step where every group's rewards agreed: such
    a step had no advantage, so its KL was the only gradient, and is no measure of how hard the reward pulls. The
    drift controller keeps β_base in the same bounds and moves it only at steps whose drift was measured, each of
    which it keeps in `drifts` (`[step, drift, the path's drift there]`).
    """

    def __init__(
        self,
        beta: float,
        *,
        dynamic: bool = False,
        dynamic_beta_decay: float = 0.9,
        dynamic_trigger: str = "reward",
        reward_threshold: float = 0.8,
        saturation_threshold: float = 0.5,
        beta_min: float = 0.0,
        beta_schedule_steps: int = 1000,
        kl_scaling: str = "none",
        kl_scaling_rate: float = DEFAULT_KL_SCALING_RATE,
        kl_controller: str = "fixed",
        target_kl: float = 0.05,
        kl_horizon: int = 10000,
        target_drift: float | None = None,
        max_steps: int = 0,
        beta_max: float | None = None,
    ):
        if kl_controller not in KL_CONTROLLERS:
            raise ValueError(f"kl_controller must be one of {KL_CONTROLLERS}, got {kl_controller!r}.")
        if dynamic_trigger not in DYNAMIC_TRIGGERS:
            raise ValueError(f"dynamic_trigger must be one of {DYNAMIC_TRIGGERS}, got {dynamic_trigger!r}.")
        step_scale(1, kl_scaling, kl_scaling_rate)  # validates the name and the rate
        self.initial_beta = float(beta)
        self.dynamic = dynamic
        self.dynamic_beta_decay = dynamic_beta_decay
        self.dynamic_trigger = dynamic_trigger
        self.reward_threshold = reward_threshold
        self.saturation_threshold = saturation_threshold
        self.beta_min = beta_min
        self.beta_schedule_steps = beta_schedule_steps
        self.kl_scaling = kl_scaling
        self.kl_scaling_rate = kl_scaling_rate
        self.kl_controller = kl_controller
        self.target_kl = target_kl
        self.kl_horizon = kl_horizon
        self.target_drift = target_drift
        self.max_steps = max_steps
        if kl_controller == "drift" and not (is_finite_number(target_drift) and target_drift > 0 and max_steps > 0):
            raise ValueError(
                f"kl_controller='drift' needs target_drift > 0 and max_steps > 0, got {target_drift!r} and "
                f"{max_steps!r}."
            )
        self.beta_max = self.initial_beta if beta_max is None else float(beta_max)
        # What `update` reads: the `dynamic` trigger's statistic and threshold, or a target-KL controller's mean KL
        saturation = dynamic_trigger == "saturation"
        self.trigger_threshold = saturation_threshold if saturation else reward_threshold
        self.reads_kl = not dynamic and kl_controller in KL_TARGET_CONTROLLERS
        self.reads_drift = kl_controller == "drift"
        # Whether β_base changes during training, so that a run resumed without the saved state would follow another β
        # trajectory: a fixed β_base is a function of the step alone
        self.has_training_state = dynamic or kl_controller != "fixed"
        self.reset()

    @classmethod
    def from_args(cls, args: Any) -> BetaController:
        """Builds the controller from an `AdaptiveKLGRPOConfig` (or anything with the same attributes)."""
        return cls(
            args.beta,
            dynamic="dynamic" in args.kl_methods,
            dynamic_beta_decay=args.dynamic_beta_decay,
            dynamic_trigger=args.dynamic_trigger,
            reward_threshold=args.reward_threshold,
            saturation_threshold=args.saturation_threshold,
            beta_min=args.beta_min,
            beta_schedule_steps=args.beta_schedule_steps,
            kl_scaling=args.kl_scaling,
            kl_scaling_rate=args.kl_scaling_rate,
            kl_controller=args.kl_controller,
            target_kl=args.target_kl,
            kl_horizon=args.kl_horizon,
            target_drift=args.target_drift,
            max_steps=args.max_steps,
            beta_max=args.beta_max,
        )

    def beta(self, step: int) -> float:
        """β_t = β_base(t)·α(t) for optimizer step `step` (1-based)."""
        return self.beta_and_scale(step)[0]

    def beta_and_scale(self, step: int) -> tuple[float, float]:
        """`(β_t, α(t))` for optimizer step `step`: β_base(t) is the controlled coefficient, or `beta_min` from
        `beta_schedule_steps` on under `dynamic`; α(t) the step scaling."""
        scale = step_scale(step, self.kl_scaling, self.kl_scaling_rate)
        base = self.beta_min if self.dynamic and step >= self.beta_schedule_steps else self.beta_base
        return base * scale, scale

    def is_zero_from(self, step: int) -> bool:
        """Whether β_t is exactly 0 for optimizer step `step` and every later step, whatever statistics the later
        updates bring: `beta_min` is 0 and either `dynamic` has reached `beta_schedule_steps` or β_base is 0 (no rule
        moves β_base away from 0 with `beta_min = 0`; α(t) is never 0). Once true it stays true, so a generation
        batch whose first step has it serves only steps with β = 0."""
        if self.beta_min != 0.0:
            return False
        return self.beta_base == 0.0 or (self.dynamic and step >= self.beta_schedule_steps)

    def update(
        self,
        step: int,
        *,
        mean_reward: float | None = None,
        zero_std_fraction: float | None = None,
        mean_kl: float | None = None,
        num_sequences: int | None = None,
        drift: float | None = None,
    ) -> None:
        """Applies the statistics of finished optimizer step `step` (global over processes) to β_base: `dynamic` reads
        `mean_reward` or `zero_std_fraction` (`adaptive_kl.kl.groups.zero_std_group_fraction`), as `dynamic_trigger`
        says; the target-KL controllers read `mean_kl` and `num_sequences`; the drift controller reads `drift`, the
        policy's drift after the step, or None at a step that did not measure it (β_base is left as it is).

        Steps already applied (e.g. replayed after a resume) are ignored, so the update is idempotent.
        """
        if step <= self.last_step:
            return
        if self.reads_drift and drift is None:  # a step between measurements: nothing to apply, and not applied yet
            return
        self.last_step = step
        if self.beta_base == 0.0 and self.beta_min == 0.0:  # every rule keeps 0: nothing to measure, nothing skipped
            return
        if self.dynamic:
            statistic = zero_std_fraction if self.dynamic_trigger == "saturation" else mean_reward
            if statistic is None or not math.isfinite(statistic):
                self.num_skipped_updates += 1
                return
            new_beta = dynamic_decay(
                self.beta_base,
                statistic,
                reward_threshold=self.trigger_threshold,
                decay=self.dynamic_beta_decay,
                beta_min=self.beta_min,
            )
            self.num_decays += int(new_beta != self.beta_base)
        elif self.reads_drift:
            if not math.isfinite(drift):
                self.num_skipped_updates += 1
                return
            path = drift_path(step, target_drift=self.target_drift, max_steps=self.max_steps)
            self.drifts.append([step, drift, path])
            new_beta = drift_beta(
                self.drifts,
                beta=self.initial_beta,
                beta_min=self.beta_min,
                beta_max=self.beta_max,
                target_drift=self.target_drift,
                max_steps=self.max_steps,
            )
        elif self.reads_kl:
            if mean_kl is None or not math.isfinite(mean_kl) or not num_sequences:
                self.num_skipped_updates += 1
                return
            if zero_std_fraction == 1.0:  # every group agreed: no advantage, the KL was the step's only gradient
                self.num_held_updates += 1
                return
            if self.kl_controller == "adaptive":
                new_beta = adaptive_kl_update(
                    self.beta_base,
                    mean_kl,
                    target_kl=self.target_kl,
                    horizon=self.kl_horizon,
                    num_sequences=num_sequences,
                )
            else:
                new_beta = stepwise_kl_update(self.beta_base, mean_kl, target_kl=self.target_kl)
            new_beta = min(max(new_beta, self.beta_min), self.beta_max)
        else:
            return
        if math.isfinite(new_beta):
            self.beta_base = new_beta
        else:
            self.num_skipped_updates += 1

    COUNTERS = ("num_decays", "num_skipped_updates", "num_held_updates")  # saved beside last_step; missing: 0

    def reset(self) -> None:
        """Back to the initial state: β_base = `beta`, no step applied."""
        self.beta_base = self.initial_beta
        self.last_step = self.num_decays = self.num_skipped_updates = self.num_held_updates = 0
        self.drifts: list[list] = []

    def state_dict(self) -> dict[str, float | int]:
        """The mutable state (JSON-serializable); the drift controller's adds its measurements."""
        state = {
            "beta_base": self.beta_base,
            "last_step": self.last_step,
            "num_decays": self.num_decays,
            "num_skipped_updates": self.num_skipped_updates,
            "num_held_updates": self.num_held_updates,
        }
        if self.reads_drift:
            state["drifts"] = [list(entry) for entry in self.drifts]
        return state

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        """Restores the state saved by `state_dict`; counters missing from an older state count as 0.

        Raises:
            ValueError: naming the entry, for a missing or non-finite or negative `beta_base`, a missing `last_step`,
                a counter that is not a whole number >= 0, or `drifts` not a list of finite `[step, drift, path]` with
                increasing whole steps >= 1. The state is left unchanged.
        """
        if not isinstance(state, dict):
            raise ValueError(f"Invalid saved KL controller state: expected a mapping, got {state!r}.")
        beta_base = state.get("beta_base")
        if not is_finite_number(beta_base) or beta_base < 0:
            raise ValueError(f"Invalid saved KL controller state: beta_base={beta_base!r} (a finite number >= 0).")
        counters = {name: state.get(name, 0) for name in ("last_step", *self.COUNTERS)}
        if "last_step" not in state:
            raise ValueError("Invalid saved KL controller state: last_step is missing.")
        for name, value in counters.items():
            if not (is_finite_number(value) and value >= 0 and float(value).is_integer()):  # JSON may give 3.0
                raise ValueError(f"Invalid saved KL controller state: {name}={value!r} (a whole number >= 0).")
        drifts = state.get("drifts", [])
        if not (
            isinstance(drifts, list)
            and all(isinstance(e, list) and len(e) == 3 and all(is_finite_number(v) for v in e) for e in drifts)
            # `drift_beta` divides by the steps between measurements: whole steps >= 1, each after the one before
            and all(float(step).is_integer() and last < step for last, step in pairwise([0, *(e[0] for e in drifts)]))
        ):
            raise ValueError(
                f"Invalid saved KL controller state: drifts={drifts!r} (a list of [step, drift, path], its steps "
                "whole numbers >= 1 in increasing order)."
            )
        self.beta_base = float(beta_base)
        self.last_step, self.num_decays, self.num_skipped_updates, self.num_held_updates = (
            int(v) for v in counters.values()
        )
        self.drifts = [[int(e[0]), float(e[1]), float(e[2])] for e in drifts]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(beta_base={self.beta_base}, last_step={self.last_step}, "
            f"kl_scaling={self.kl_scaling!r}, kl_controller={self.kl_controller!r}, dynamic={self.dynamic})"
        )
