"""`AdaptiveKLFields`: the adaptive-KL fields, checks and properties that `AdaptiveKLGRPOConfig` and
`AdaptiveKLRLOOConfig` share.

A dataclass mixin listed before the host's config (`class AdaptiveKLGRPOConfig(AdaptiveKLFields, GRPOConfig)`), so
that its fields follow the host's, whose positional arguments (`output_dir` first) keep their places. A config adds
the fields only its host takes, overrides a field whose default differs (RLOO's `kl_estimator`), checks its host
(Unsloth's import order) and its own fields in `_check_own_fields`, and the KL fields against the host's own in
`_check_with_host`. Nothing here imports TRL: the checks read the host's fields (`beta`, `learning_rate`,
`sync_ref_model`, ...) off the config they are called on.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import MISSING, dataclass, field, fields
from types import SimpleNamespace

from ..kl.controller import (
    ADAPTIVE_ERROR_CLIP,
    DEFAULT_KL_SCALING_RATE,
    DYNAMIC_TRIGGERS,
    KL_CONTROLLERS,
    KL_SCALINGS,
    KL_TARGET_CONTROLLERS,
    adaptive_reach,
)
from ..kl.estimators import EXPONENTIAL_ESTIMATORS
from ..kl.validation import is_finite_number, is_int, require


KL_METHODS = ("none", "clip", "sigmoid", "length_normalized", "dynamic")
KL_TRANSFORMS = ("clip", "sigmoid")
# The largest `kl_log_ratio_clip`: exp(88) ≈ 1.7e38 is still finite in float32 (its largest value is 3.4e38).
MAX_LOG_RATIO_CLIP = 88.0


def _beta_adapts(config) -> bool:
    return "dynamic" in config.kl_methods or config.kl_controller != "fixed"


# Parameters read only under a setting: field → (whether the config reads it, apart from β > 0; what makes it read).
# One set while nothing reads it warns at construction (`warn_unread_parameters`).
PARAMETER_READERS = {
    "kl_clip_threshold": (lambda c: "clip" in c.kl_methods, "kl_adaptation_method with 'clip'"),
    "kl_target": (
        lambda c: "sigmoid" in c.kl_methods,
        "kl_adaptation_method with 'sigmoid' (it is the gate's centre; the controllers' target is target_kl)",
    ),
    "kl_scaling_rate": (lambda c: c.kl_scaling == "exp", "kl_scaling='exp'"),
    "dynamic_beta_decay": (lambda c: "dynamic" in c.kl_methods, "kl_adaptation_method with 'dynamic'"),
    "dynamic_trigger": (lambda c: "dynamic" in c.kl_methods, "kl_adaptation_method with 'dynamic'"),
    "reward_threshold": (
        lambda c: "dynamic" in c.kl_methods and c.dynamic_trigger == "reward",
        "kl_adaptation_method with 'dynamic' and dynamic_trigger='reward'",
    ),
    "saturation_threshold": (
        lambda c: "dynamic" in c.kl_methods and c.dynamic_trigger == "saturation",
        "kl_adaptation_method with 'dynamic' and dynamic_trigger='saturation'",
    ),
    "beta_schedule_steps": (lambda c: "dynamic" in c.kl_methods, "kl_adaptation_method with 'dynamic'"),
    "target_kl": (
        lambda c: c.kl_controller in KL_TARGET_CONTROLLERS,
        "kl_controller='adaptive' or 'stepwise' (the sigmoid gate's centre is kl_target; the drift controller's "
        "target is target_drift)",
    ),
    "target_drift": (lambda c: c.kl_controller == "drift", "kl_controller='drift' (the others' target is target_kl)"),
    "drift_every": (lambda c: c.kl_controller == "drift", "kl_controller='drift'"),
    "drift_samples": (lambda c: c.kl_controller == "drift", "kl_controller='drift'"),
    "kl_horizon": (lambda c: c.kl_controller == "adaptive", "kl_controller='adaptive'"),
    "beta_min": (_beta_adapts, "kl_adaptation_method with 'dynamic', or a kl_controller other than 'fixed'"),
    "beta_max": (lambda c: c.kl_controller != "fixed", "kl_controller='adaptive', 'stepwise' or 'drift'"),
    "kl_monitor_steps": (
        lambda c: _beta_adapts(c) and c.beta_min == 0 and c.skip_zero_beta_reference,
        "a β that can reach 0 and stay there (dynamic or a target-KL controller, beta_min=0) with "
        "skip_zero_beta_reference=True",
    ),
    "resume_without_kl_state": (_beta_adapts, "a β that adapts (dynamic or a controller)"),
    "kl_log_ratio_clip": (
        # The GRPO config's bias correction exponentiates the importance log-ratio; RLOO's config has no such field.
        lambda c: c.kl_estimator in EXPONENTIAL_ESTIMATORS or getattr(c, "use_bias_correction_kl", False),
        "an estimator that exponentiates the log-ratio (kl_estimator 'k3' or 'k3+') or use_bias_correction_kl=True",
    ),
}


ALLOWED_METHODS = f"one of {KL_METHODS}, or several of them joined by '+' with at most one of clip/sigmoid"


def parse_kl_adaptation_method(value: str) -> tuple[str, ...]:
    """Splits `"dynamic+length_normalized"` into its methods; `()` for `"none"`. `ValueError`, naming the allowed
    values, for an unknown or repeated name, `"none"` combined with another method, or both `clip` and `sigmoid`."""
    allowed = ALLOWED_METHODS
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"kl_adaptation_method must be {allowed}; got {value!r}.")
    methods = tuple(part.strip() for part in value.split("+"))
    unknown = [m for m in methods if m not in KL_METHODS]
    if unknown:
        raise ValueError(f"kl_adaptation_method has unknown method(s) {unknown}; it must be {allowed}.")
    if len(set(methods)) != len(methods):
        raise ValueError(f"kl_adaptation_method repeats a method in {value!r}; it must be {allowed}.")
    if "none" in methods:
        if len(methods) > 1:
            raise ValueError(f"kl_adaptation_method cannot combine 'none' with other methods ({value!r}).")
        return ()
    if sum(m in KL_TRANSFORMS for m in methods) > 1:
        raise ValueError(f"kl_adaptation_method can use at most one of clip/sigmoid, got {value!r}.")
    return methods


@dataclass
class AdaptiveKLFields:
    """The KL fields every host takes (`AdaptiveKLGRPOConfig` documents each), with their checks and properties.

    A config names in `ADAPTATION_SELECTORS` the fields that select an adaptation (a value other than their default is
    one, as is any method of `kl_adaptation_method`): all of them need `beta > 0`.
    """

    kl_estimator: str = field(
        default="k3",
        metadata={
            "help": "Per-token KL estimator of the log-ratio r = log pi - log pi_ref: 'k1' (r), 'k2' (r^2/2) or 'k3' "
            "(exp(-r) + r - 1, TRL's); or the straight-through 'k1+'/'k3+' (the value of k1/k3, the gradient of k2; "
            "in the loss only)."
        },
    )
    kl_adaptation_method: str = field(
        default="none",
        metadata={
            "help": "KL adaptation: 'none', 'clip', 'sigmoid', 'length_normalized', 'dynamic', or several joined by "
            "'+' (at most one of clip/sigmoid), e.g. 'dynamic+length_normalized'."
        },
    )
    kl_log_ratio_clip: float | None = field(
        default=None,
        metadata={
            "help": "Clamp the log-ratio to [-c, c] before it is exponentiated (k3/k3+, and the importance ratio of "
            "use_bias_correction_kl): a token beyond it gets a finite estimate and no gradient, so one degenerate "
            "token cannot make the KL inf or NaN. None (TRL's arithmetic): no clamp. In (0, 88]."
        },
    )
    kl_clip_threshold: float = field(
        default=1.0,
        metadata={"help": "clip: per-token KL above this value is clipped and carries no gradient. Must be > 0."},
    )
    kl_target: float = field(
        default=0.1,
        metadata={
            "help": "sigmoid only: the gate's centre, the per-token KL k is weighted by sigmoid(k - kl_target). Must "
            "be >= 0. (The target-KL controllers' target is target_kl.)"
        },
    )
    kl_scaling: str = field(
        default="none",
        metadata={
            "help": "Step-based scaling of beta at optimizer step t (1 for t <= 1): 'none' (1), 'linear' (1/t), "
            "'sqrt' (1/sqrt(t)), 'log' (1/ln(t+1)) or 'exp' (kl_scaling_rate^(t-1))."
        },
    )
    kl_scaling_rate: float = field(
        default=DEFAULT_KL_SCALING_RATE,
        metadata={"help": "kl_scaling='exp' only: the factor by which the scaling shrinks at each step. In (0, 1]."},
    )
    dynamic_beta_decay: float = field(
        default=0.9,
        metadata={
            "help": "dynamic: beta is multiplied by this factor after each optimizer step that triggers a decay "
            "(dynamic_trigger). In (0, 1]."
        },
    )
    dynamic_trigger: str = field(
        default="reward",
        metadata={
            "help": "dynamic: what triggers a decay: 'reward' (the step's mean reward reaches reward_threshold) or "
            "'saturation' (its fraction of zero-std groups, whose completions all got the same reward, reaches "
            "saturation_threshold)."
        },
    )
    reward_threshold: float = field(
        default=0.8,
        metadata={
            "help": "dynamic with dynamic_trigger='reward': mean reward of a step at or above which beta decays."
        },
    )
    saturation_threshold: float = field(
        default=0.5,
        metadata={
            "help": "dynamic with dynamic_trigger='saturation': fraction of zero-std groups of a step at or above "
            "which beta decays. In (0, 1]."
        },
    )
    beta_schedule_steps: int = field(
        default=1000,
        metadata={"help": "dynamic: from this optimizer step on, beta equals beta_min. Must be >= 1."},
    )
    kl_controller: str = field(
        default="fixed",
        metadata={
            "help": "Controller of beta: 'fixed' (none); on the training KL, 'adaptive' (proportional, Ziegler et al. "
            "2019) or 'stepwise' (x1.5 above 1.5*target_kl, x0.75 below 0.5*target_kl), each holding beta after a "
            "step where every group's rewards agreed (no advantage); or 'drift', on the drift from the starting "
            "policy measured on held-out texts (eval_dataset), steered to target_drift at the run's last step. "
            "Each keeps beta in [beta_min, beta_max]."
        },
    )
    target_drift: float | None = field(
        default=None,
        metadata={
            "help": "kl_controller='drift' (required there): the drift you accept at the end of the run, in nats a "
            "token: the exact KL of the policy's next-token distributions to the starting policy's, averaged over "
            "the completion tokens of held-out texts (what `adaptive-kl frontier` reads as drift). Must be > 0."
        },
    )
    drift_every: int = field(
        default=5,
        metadata={
            "help": "kl_controller='drift': measure the drift and update beta after every this many optimizer steps "
            "(and after the last). Must be >= 1."
        },
    )
    drift_samples: int = field(
        default=32,
        metadata={
            "help": "kl_controller='drift': how many held-out texts (the first rows of eval_dataset) the drift is "
            "measured on: two forward passes of them per measurement. Must be >= 1."
        },
    )
    target_kl: float = field(
        default=0.05,
        metadata={
            "help": "kl_controller='adaptive' or 'stepwise' only: the target mean per-token KL. Must be > 0. (The "
            "sigmoid gate's centre is kl_target.)"
        },
    )
    kl_horizon: int = field(
        default=10000,
        metadata={
            "help": "Horizon H, in sequences, of the 'adaptive' controller: N steps of n sequences move beta by a "
            "factor of at most (1 +- 0.2*n/H)^N (1.6 percent in 100 steps of 8 at 10000). Must be > 0."
        },
    )
    beta_min: float = field(
        default=0.0,
        metadata={"help": "Lower bound of beta under 'dynamic' and the target-KL controllers. In [0, beta]."},
    )
    beta_max: float | None = field(
        default=None,
        metadata={
            "help": "Ceiling of beta under the target-KL controllers. None: beta, where it starts (a controller may "
            "lower beta and raise it back, never past the beta you chose). A number >= beta, or float('inf'): no "
            "ceiling, Ziegler et al.'s controller as verl and OpenRLHF run it. Warning: in the package's frontier "
            "study the unbounded 'stepwise' controller raised beta past 2 and lost the format reward on 4 of 5 seeds "
            "(docs/studies/README.md)."
        },
    )
    ref_reset_steps: int = field(
        default=0,
        metadata={
            "help": "Reference resets: after every this many optimizer steps the reference becomes the current policy "
            "(full model: its weights; PEFT: the adapter, copied into a frozen 'ref' adapter). 0: never."
        },
    )
    ref_reset_kl: float = field(
        default=0.0,
        metadata={
            "help": "Reset the reference after an optimizer step whose mean raw KL (adaptive_kl/raw_kl) exceeds this "
            "value. 0: never."
        },
    )
    ref_reset_optimizer: bool = field(
        default=False,
        metadata={"help": "Also clear the optimizer state (Adam's moments) at each reference reset, as ProRL does."},
    )
    skip_zero_beta_reference: bool = field(
        default=True,
        metadata={
            "help": "Skip the reference forward of a generation batch when beta is exactly 0 for every optimizer step "
            "it serves (dynamic from beta_schedule_steps on with beta_min=0); with full fine-tuning, free the "
            "reference model once beta is 0 for good and nothing else needs it (kl_monitor_steps=0, no resets)."
        },
    )
    kl_monitor_steps: int | None = field(
        default=None,
        metadata={
            "help": "While the reference forward is skipped, score it anyway on the first generation batch of every "
            "this many optimizer steps, so that adaptive_kl/raw_kl stays visible. None: logging_steps; 0: never."
        },
    )
    resume_without_kl_state: bool = field(
        default=False,
        metadata={
            "help": "Resume from a checkpoint without adaptive-KL controller state (saved by stock TRL's GRPOTrainer, "
            "or damaged) with beta started afresh. By default that is an error when beta adapts during training "
            "(dynamic or a target-KL controller)."
        },
    )

    ADAPTATION_SELECTORS = ("kl_scaling", "kl_estimator", "kl_controller")

    @property
    def kl_methods(self) -> tuple[str, ...]:
        """The methods of `kl_adaptation_method`, `()` for `"none"`."""
        return parse_kl_adaptation_method(self.kl_adaptation_method)

    @property
    def kl_transform(self) -> str | None:
        """`"clip"`, `"sigmoid"` or `None`."""
        return next((m for m in self.kl_methods if m in KL_TRANSFORMS), None)

    @property
    def uses_adaptive_kl(self) -> bool:
        """Whether any KL field differs from the host's stock behaviour: a method, or a selector off its default."""
        defaults = field_defaults(type(self))
        return bool(self.kl_methods) or any(getattr(self, n) != defaults[n] for n in self.ADAPTATION_SELECTORS)

    def __post_init__(self):
        self._validate_adaptive_kl()
        super().__post_init__()  # the host config's
        check_adaptive_horizon(self)  # needs the process count, which the host's sets up

    def _validate_adaptive_kl(self) -> None:
        """Every check of the KL fields, and the config's own (`_check_own_fields`: its host's too), in the order their
        errors are raised; warns for each parameter set while nothing reads it."""
        check_training_arguments(self)
        parse_kl_adaptation_method(self.kl_adaptation_method)  # its ValueError first, as before the other fields
        check_kl_scaling(self)
        self._check_own_fields()
        require(
            isinstance(self.resume_without_kl_state, bool),
            f"resume_without_kl_state must be True or False, got {self.resume_without_kl_state!r}.",
        )
        check_zero_beta_reference(self)
        check_kl_coefficient(self)
        chosen = ", ".join(f"{n}={getattr(self, n)!r}" for n in ("kl_adaptation_method", *self.ADAPTATION_SELECTORS))
        require(
            self.beta > 0 or not self.uses_adaptive_kl,
            f"beta must be > 0 when any KL adaptation is set ({chosen}): TRL loads no reference model at beta=0.",
        )
        check_reference_resets(self)
        check_drift_controller(self)
        self._check_with_host()
        self.warn_unread_parameters()

    def _check_own_fields(self) -> None:
        """The checks only this config makes: its host's (Unsloth's import order), its own fields' and the estimators
        its host takes."""

    def _check_with_host(self) -> None:
        """The checks of the KL fields against the host's own fields, and the warnings about them."""

    def warn_unread_parameters(self) -> None:
        """Warns once (at construction) for each parameter of `PARAMETER_READERS` set to other than its default while
        nothing reads it, naming what would make it take effect."""
        for name in unread_parameters(vars(self), type(self)):
            reader = PARAMETER_READERS[name][1]
            needs = f"beta > 0 and {reader}" if self.beta == 0 else reader
            warnings.warn(
                f"{name}={getattr(self, name)!r} has no effect: it is read only with {needs}.",
                UserWarning,
                stacklevel=5,  # the caller of the config: its __init__, __post_init__, _validate_adaptive_kl, here
            )


def field_defaults(config_cls: type) -> dict:
    """Each field of the dataclass `config_cls` that has a default (not a factory) → that default."""
    return {f.name: f.default for f in fields(config_cls) if f.default is not MISSING}


def unread_parameters(values: dict, config_cls: type) -> list[str]:
    """The parameters of `PARAMETER_READERS` set to other than their defaults while nothing reads them, in the config
    of `config_cls` (built on `AdaptiveKLFields`) these field values build, every other field at its default. It
    takes values, not a config, so that code assembling a config's fields from several sources can ask before
    building it (which would warn)."""
    config = SimpleNamespace(**{**field_defaults(config_cls), **values})
    config.kl_methods = parse_kl_adaptation_method(config.kl_adaptation_method)  # what the readers look at
    defaults = field_defaults(AdaptiveKLFields)
    return [
        name
        for name, (is_read, _) in PARAMETER_READERS.items()
        if getattr(config, name) != defaults[name] and not (config.beta > 0 and is_read(config))
    ]


def check_reference_resets(config) -> None:
    """Checks of the reference resets' fields, and of them against `beta` and `sync_ref_model`."""
    require(
        isinstance(config.ref_reset_optimizer, bool),
        f"ref_reset_optimizer must be True or False, got {config.ref_reset_optimizer!r}.",
    )
    require(
        is_int(config.ref_reset_steps) and config.ref_reset_steps >= 0,
        f"ref_reset_steps must be an integer >= 0 (0: no resets), got {config.ref_reset_steps!r}.",
    )
    require(
        is_finite_number(config.ref_reset_kl) and config.ref_reset_kl >= 0,
        f"ref_reset_kl must be a finite number >= 0 (0: no resets), got {config.ref_reset_kl!r}.",
    )
    if not (config.ref_reset_steps > 0 or config.ref_reset_kl > 0):
        require(
            not config.ref_reset_optimizer,
            "ref_reset_optimizer=True clears the optimizer at each reference reset, but no reset is set: set "
            "ref_reset_steps or ref_reset_kl too.",
        )
        return
    settings = f"ref_reset_steps={config.ref_reset_steps}, ref_reset_kl={config.ref_reset_kl}"
    require(
        config.beta > 0,
        f"Reference resets ({settings}) need beta > 0: at beta=0 TRL loads no reference model to reset.",
    )
    require(
        not config.sync_ref_model,
        f"Reference resets ({settings}) and sync_ref_model=True both move the reference: use one of them "
        "(ref_reset_steps=N is sync_ref_model with ref_model_mixup_alpha=1 and ref_model_sync_steps=N, and also "
        "works for PEFT models).",
    )


def check_zero_beta_reference(config) -> None:
    """Checks of the zero-β reference skip's fields (`skip_zero_beta_reference`, `kl_monitor_steps`)."""
    require(
        isinstance(config.skip_zero_beta_reference, bool),
        f"skip_zero_beta_reference must be True or False, got {config.skip_zero_beta_reference!r}.",
    )
    require(
        config.kl_monitor_steps is None or (is_int(config.kl_monitor_steps) and config.kl_monitor_steps >= 0),
        "kl_monitor_steps must be None (every logging_steps) or an integer >= 0 (0: never), got "
        f"{config.kl_monitor_steps!r}.",
    )


def check_kl_scaling(config) -> None:
    """Checks of the step scaling α(t) and the `dynamic` trigger's fields"""
    require(config.kl_scaling in KL_SCALINGS, f"kl_scaling must be one of {KL_SCALINGS}, got {config.kl_scaling!r}.")
    require(
        is_finite_number(config.kl_scaling_rate) and 0 < config.kl_scaling_rate <= 1,
        f"kl_scaling_rate must be a number in (0, 1], got {config.kl_scaling_rate!r}.",
    )
    require(
        config.dynamic_trigger in DYNAMIC_TRIGGERS,
        f"dynamic_trigger must be one of {DYNAMIC_TRIGGERS}, got {config.dynamic_trigger!r}.",
    )
    require(
        is_finite_number(config.saturation_threshold) and 0 < config.saturation_threshold <= 1,
        f"saturation_threshold must be a fraction in (0, 1], got {config.saturation_threshold!r}.",
    )


def check_kl_coefficient(config) -> None:
    """Checks of β_t's fields (`beta`, the controllers, `dynamic`) and of the estimate's and transforms' parameters."""
    clip = config.kl_log_ratio_clip
    require(
        clip is None or (is_finite_number(clip) and 0 < clip <= MAX_LOG_RATIO_CLIP),
        f"kl_log_ratio_clip must be None (no clamp, TRL's arithmetic) or a number in (0, {MAX_LOG_RATIO_CLIP:g}] "
        f"(exp of it must be finite in float32), got {clip!r}.",
    )
    require(
        config.kl_controller in KL_CONTROLLERS,
        f"kl_controller must be one of {KL_CONTROLLERS}, got {config.kl_controller!r}.",
    )
    require(
        is_finite_number(config.kl_clip_threshold) and config.kl_clip_threshold > 0,
        f"kl_clip_threshold must be a finite number > 0, got {config.kl_clip_threshold!r}.",
    )
    require(
        is_finite_number(config.kl_target) and config.kl_target >= 0,
        f"kl_target must be a finite number >= 0, got {config.kl_target!r}.",
    )
    require(
        is_finite_number(config.dynamic_beta_decay) and 0 < config.dynamic_beta_decay <= 1,
        f"dynamic_beta_decay must be in (0, 1], got {config.dynamic_beta_decay!r}.",
    )
    require(
        is_finite_number(config.reward_threshold),
        f"reward_threshold must be a finite number, got {config.reward_threshold!r}.",
    )
    require(
        is_finite_number(config.beta) and config.beta >= 0, f"beta must be a finite number >= 0, got {config.beta!r}."
    )
    require(
        is_finite_number(config.beta_min) and 0 <= config.beta_min <= config.beta,
        f"beta_min must be a finite number in [0, beta={config.beta}], got {config.beta_min!r}.",
    )
    require(
        config.beta_max is None
        or ((is_finite_number(config.beta_max) or config.beta_max == math.inf) and config.beta_max >= config.beta),
        f"beta_max must be None (the ceiling is beta={config.beta}), a number >= beta, or float('inf') (no ceiling), "
        f"got {config.beta_max!r}.",
    )
    require(
        is_int(config.beta_schedule_steps) and config.beta_schedule_steps >= 1,
        f"beta_schedule_steps must be an integer >= 1, got {config.beta_schedule_steps!r}.",
    )
    require(
        is_finite_number(config.target_kl) and config.target_kl > 0,
        f"target_kl must be a finite number > 0, got {config.target_kl!r}.",
    )
    require(
        is_int(config.kl_horizon) and config.kl_horizon > 0,
        f"kl_horizon must be an integer > 0, got {config.kl_horizon!r}.",
    )
    require(
        not ("dynamic" in parse_kl_adaptation_method(config.kl_adaptation_method) and config.kl_controller != "fixed"),
        f"kl_adaptation_method='dynamic' and kl_controller={config.kl_controller!r} both steer beta; use one of "
        "them (kl_controller='fixed' with 'dynamic').",
    )


def check_drift_controller(config) -> None:
    """Checks of the drift controller's fields, and of it against the run's length and the reference: the drift is
    measured against TRL's reference, which must stay the starting policy."""
    require(
        is_int(config.drift_every) and config.drift_every >= 1,
        f"drift_every must be an integer >= 1, got {config.drift_every!r}.",
    )
    require(
        is_int(config.drift_samples) and config.drift_samples >= 1,
        f"drift_samples must be an integer >= 1, got {config.drift_samples!r}.",
    )
    require(
        config.target_drift is None or (is_finite_number(config.target_drift) and config.target_drift > 0),
        f"target_drift must be None or a finite number > 0 (nats a token), got {config.target_drift!r}.",
    )
    if config.kl_controller != "drift":
        return
    require(
        config.target_drift is not None,
        "kl_controller='drift' needs target_drift: the drift you accept at the end of the run, in nats a token "
        "(read it off `adaptive-kl frontier`'s line, docs/frontier.md).",
    )
    require(
        is_int(config.max_steps) and config.max_steps > 0,
        f"kl_controller='drift' needs max_steps > 0, got {config.max_steps!r}: it steers the drift at the run's last "
        "step, which a run whose length is set by epochs does not know in advance.",
    )
    moved = [
        name
        for name, on in (
            ("ref_reset_steps", config.ref_reset_steps > 0),
            ("ref_reset_kl", config.ref_reset_kl > 0),
            ("sync_ref_model", config.sync_ref_model),
        )
        if on
    ]
    require(
        not moved,
        f"kl_controller='drift' measures the drift against the reference, which {', '.join(moved)} moves away from "
        "the starting policy: use one of them.",
    )


# Below this largest relative move of β over `max_steps`, the 'adaptive' controller is a constant β in that run.
ADAPTIVE_MIN_REACH = 0.10


def check_adaptive_horizon(config) -> None:
    """The 'adaptive' controller's horizon against the sequences of one optimizer step, after
    `TrainingArguments.__post_init__`: it needs the process count, known once the distributed state is set up. Warns
    when the horizon cannot move β by `ADAPTIVE_MIN_REACH` over `max_steps` (when set), naming a horizon that can."""
    if config.kl_controller != "adaptive":
        return
    sequences_per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps * config.world_size
    require(
        ADAPTIVE_ERROR_CLIP * sequences_per_step < config.kl_horizon,
        f"kl_horizon must exceed {ADAPTIVE_ERROR_CLIP} x the sequences per optimizer step ({sequences_per_step}) "
        f"with kl_controller='adaptive', got {config.kl_horizon}: a larger step would make beta negative.",
    )
    steps = config.max_steps
    if steps <= 0:  # the run's length is set by epochs and the data: unknown here
        return
    _, largest = adaptive_reach(steps, horizon=config.kl_horizon, num_sequences=sequences_per_step)
    if largest - 1 < ADAPTIVE_MIN_REACH:
        # The horizon at which β, its error at the clip on every step, moves by a factor of 10 in `steps` / 2 steps:
        # H = 0.2·n / (1 − 0.1^(2/steps)), rounded down; never below the least horizon the config accepts (more than
        # 0.2·n), which in runs of 2 steps or fewer moves β less
        horizon = max(
            int(ADAPTIVE_ERROR_CLIP * sequences_per_step / (1 - 0.1 ** (2 / steps))),
            int(ADAPTIVE_ERROR_CLIP * sequences_per_step) + 1,
        )
        _, reach = adaptive_reach(steps, horizon=horizon, num_sequences=sequences_per_step)
        warnings.warn(
            f"kl_horizon={config.kl_horizon} with {sequences_per_step} sequences per optimizer step moves beta by at "
            f"most {100 * (largest - 1):.1f}% in max_steps={steps} steps, (1 + {ADAPTIVE_ERROR_CLIP} x "
            f"{sequences_per_step}/{config.kl_horizon})^{steps}: in this run the 'adaptive' controller is a constant "
            f"beta. kl_horizon={horizon} lets it move beta up to {reach:.3g}x in the run.",
            UserWarning,
            stacklevel=4,
        )


def check_training_arguments(config) -> None:
    """Checks of inherited `TrainingArguments` fields that Transformers leaves to the optimizer, which would fail (or
    silently not train) only inside `train()`: shared with the binomial trainer's config."""
    require(
        is_finite_number(config.learning_rate) and config.learning_rate > 0,
        f"learning_rate must be a finite number > 0, got {config.learning_rate!r} (at 0 the policy never changes; "
        "a negative one is refused by the optimizer only once training starts).",
    )
