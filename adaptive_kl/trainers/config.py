"""`AdaptiveKLGRPOConfig`: `trl.GRPOConfig` plus the fields that select the KL adaptation.

The parent is whatever `trl.GRPOConfig` is when this module is first imported: TRL's own, or Unsloth's after
`import unsloth`, whose `__init__` (and defaults) the subclass keeps.
"""

from __future__ import annotations

import warnings
from dataclasses import MISSING, dataclass, field, fields
from types import SimpleNamespace

from .hooks import check_trl_version


check_trl_version()  # before TRL is imported: fail with what to install rather than misbehave

import trl  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from ..kl.aggregation import LOSS_TYPES  # noqa: E402
from ..kl.controller import (  # noqa: E402
    ADAPTIVE_ERROR_CLIP,
    DEFAULT_KL_SCALING_RATE,
    DYNAMIC_TRIGGERS,
    KL_CONTROLLERS,
    KL_SCALINGS,
)
from ..kl.estimators import ESTIMATORS, STRAIGHT_THROUGH_ESTIMATORS  # noqa: E402
from ..kl.placement import KL_PLACEMENTS  # noqa: E402
from ..kl.validation import is_finite_number, is_int, require  # noqa: E402
from .embedding import HASHED, MINILM, check_embedder  # noqa: E402
from .unsloth import check_import_order, is_unsloth_class, keep_host_init  # noqa: E402


KL_METHODS = ("none", "clip", "sigmoid", "length_normalized", "dynamic")
KL_TRANSFORMS = ("clip", "sigmoid")


def _dynamic(config) -> bool:
    return "dynamic" in config.kl_methods


def _dynamic_trigger(trigger: str):
    return lambda config: _dynamic(config) and config.dynamic_trigger == trigger


def _beta_adapts(config) -> bool:
    return _dynamic(config) or config.kl_controller != "fixed"


# Parameters read only under a setting: field → (whether the config reads it, apart from β > 0; what makes it read).
# One set while nothing reads it warns at construction (`warn_unread_parameters`).
PARAMETER_READERS = {
    "kl_clip_threshold": (lambda c: "clip" in c.kl_methods, "kl_adaptation_method with 'clip'"),
    "kl_target": (
        lambda c: "sigmoid" in c.kl_methods,
        "kl_adaptation_method with 'sigmoid' (it is the gate's centre; the controllers' target is target_kl)",
    ),
    "kl_scaling_rate": (lambda c: c.kl_scaling == "exp", "kl_scaling='exp'"),
    "dynamic_beta_decay": (_dynamic, "kl_adaptation_method with 'dynamic'"),
    "dynamic_trigger": (_dynamic, "kl_adaptation_method with 'dynamic'"),
    "reward_threshold": (
        _dynamic_trigger("reward"),
        "kl_adaptation_method with 'dynamic' and dynamic_trigger='reward'",
    ),
    "saturation_threshold": (
        _dynamic_trigger("saturation"),
        "kl_adaptation_method with 'dynamic' and dynamic_trigger='saturation'",
    ),
    "beta_schedule_steps": (_dynamic, "kl_adaptation_method with 'dynamic'"),
    "target_kl": (
        lambda c: c.kl_controller != "fixed",
        "kl_controller='adaptive' or 'stepwise' (the sigmoid gate's centre is kl_target)",
    ),
    "kl_horizon": (lambda c: c.kl_controller == "adaptive", "kl_controller='adaptive'"),
    "beta_min": (_beta_adapts, "kl_adaptation_method with 'dynamic', or a kl_controller other than 'fixed'"),
    "kl_monitor_steps": (
        lambda c: _beta_adapts(c) and c.beta_min == 0 and c.skip_zero_beta_reference,
        "a β that can reach 0 and stay there (dynamic or a target-KL controller, beta_min=0) with "
        "skip_zero_beta_reference=True",
    ),
    "resume_without_kl_state": (_beta_adapts, "a β that adapts (dynamic or a target-KL controller)"),
}


def parse_kl_adaptation_method(value: str) -> tuple[str, ...]:
    """Splits `"dynamic+length_normalized"` into its methods; `()` for `"none"`.

    Raises:
        ValueError: naming `kl_adaptation_method` and the allowed values, for an unknown or repeated name, `"none"`
            combined with another method, or both `clip` and `sigmoid`.
    """
    allowed = f"one of {KL_METHODS}, or several of them joined by '+' with at most one of clip/sigmoid"
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


def unread_parameters(config) -> list[str]:
    """The parameters of `PARAMETER_READERS` that `config` (an `AdaptiveKLGRPOConfig`, or anything with its fields
    and `kl_methods`) sets to other than their defaults while nothing reads them."""
    defaults = {f.name: f.default for f in fields(AdaptiveKLGRPOConfig) if f.name in PARAMETER_READERS}
    return [
        name
        for name, (is_read, _) in PARAMETER_READERS.items()
        if getattr(config, name) != defaults[name] and not (config.beta > 0 and is_read(config))
    ]


def unread_field_values(values: dict) -> list[str]:
    """`unread_parameters` of the config these field values would build (every other field at its default), without
    building it (which would warn): for code that assembles a config's fields from several sources."""
    defaults = {f.name: f.default for f in fields(AdaptiveKLGRPOConfig) if f.default is not MISSING}
    config = SimpleNamespace(**{**defaults, **values})
    config.kl_methods = parse_kl_adaptation_method(config.kl_adaptation_method)
    return unread_parameters(config)


@dataclass
class AdaptiveKLGRPOConfig(GRPOConfig):
    r"""
    Configuration class for [`AdaptiveKLGRPOTrainer`]: every [`~trl.GRPOConfig`] argument, plus the KL adaptation.

    With every field below at its default the trainer is stock TRL. The five selectors (`kl_estimator`,
    `kl_adaptation_method`, `kl_placement`, `kl_scaling`, `kl_controller`) set to anything else need `beta > 0` (TRL
    loads no reference model at `beta = 0`): a `ValueError` otherwise. A parameter set while nothing reads it (the
    method, controller or β it belongs to is off; `PARAMETER_READERS`) warns at construction, naming what would make
    it take effect. The loss is `policy_loss + β_t · Agg(f(k))`; `docs/design.md` has the formulas.

    Parameters:
        > Parameters that control the per-token KL estimate k and its transform f(k)

        kl_estimator (`str`, *optional*, defaults to `"k3"`):
            Per-token estimator of KL(π_θ‖π_ref): `"k1"` (r), `"k2"` (r²/2) or `"k3"` (exp(−r) + r − 1); or the
            straight-through `"k1+"`/`"k3+"`: the value of k1/k3 with the gradient of k2 (in the loss only).
        kl_adaptation_method (`str`, *optional*, defaults to `"none"`):
            `"none"`, `"clip"`, `"sigmoid"`, `"length_normalized"`, `"dynamic"`, or several joined by `"+"` (at most
            one of clip/sigmoid), e.g. `"dynamic+length_normalized"`.
        kl_clip_threshold (`float`, *optional*, defaults to `1.0`):
            `clip`: per-token KL above this value is clipped (and carries no gradient).
        kl_target (`float`, *optional*, defaults to `0.1`):
            `sigmoid` only: the gate's centre τ, the per-token KL at which σ(k − τ) is one half (the seed documents'
            name). Not the controllers' target, which is `target_kl`.

        > Parameters that control where the KL goes

        kl_placement (`str`, *optional*, defaults to `"loss"`):
            `"loss"`: β_t·Agg(f(k)) is added to the loss. `"reward"`: the detached sequence penalty β_t·Σ_t f(k) is
            subtracted from each completion's reward before the group advantages, and the loss has no KL term (use
            `kl_estimator="k1"` there).
        kl_mask_zero_std_groups (`bool`, *optional*, defaults to `False`):
            Leave out the KL of the completions of a group whose total rewards all agree (zero group std, decided per
            group of each generation batch as TRL decides `frac_reward_zero_std`): their advantages are 0, so the KL
            would be their only gradient (TRL issue #5588). In the loss only the KL's numerator loses them (the host's
            normalizers are unchanged); in the reward they carry no penalty. The KL statistics still cover them.

        > Parameters that control the coefficient β_t = β_base(t)·α(t)

        kl_scaling (`str`, *optional*, defaults to `"none"`):
            Step scaling α(t) of β: `"none"` (1), `"linear"` (1/t), `"sqrt"` (1/√t), `"log"` (1/ln(t+1)) or `"exp"`
            (γ^(t−1), γ = `kl_scaling_rate`).
        kl_scaling_rate (`float`, *optional*, defaults to `0.99`):
            `kl_scaling="exp"` only: the factor γ in (0, 1] by which α shrinks at each optimizer step.
        dynamic_beta_decay (`float`, *optional*, defaults to `0.9`):
            `dynamic`: β is multiplied by this factor after each step that triggers a decay (`dynamic_trigger`).
        dynamic_trigger (`str`, *optional*, defaults to `"reward"`):
            `dynamic`: what triggers a decay: `"reward"` (the step's mean reward reaches `reward_threshold`) or
            `"saturation"` (its fraction of zero-std groups, whose completions all got the same reward, reaches
            `saturation_threshold`).
        reward_threshold (`float`, *optional*, defaults to `0.8`):
            `dynamic` with `dynamic_trigger="reward"`: the mean reward that triggers a decay.
        saturation_threshold (`float`, *optional*, defaults to `0.5`):
            `dynamic` with `dynamic_trigger="saturation"`: the fraction of zero-std groups, in (0, 1], that triggers a
            decay.
        beta_schedule_steps (`int`, *optional*, defaults to `1000`):
            `dynamic`: from this optimizer step on, β = `beta_min`.
        kl_controller (`str`, *optional*, defaults to `"fixed"`):
            `"fixed"`, `"adaptive"` (Ziegler et al., 2019) or `"stepwise"` target-KL controller of β.
        target_kl (`float`, *optional*, defaults to `0.05`):
            `kl_controller="adaptive"` or `"stepwise"` only: the target mean per-token KL (PPO's name). Not the sigmoid
            gate's centre, which is `kl_target`.
        kl_horizon (`int`, *optional*, defaults to `10000`):
            Horizon (in sequences) of the `"adaptive"` controller.
        beta_min (`float`, *optional*, defaults to `0.0`):
            Lower bound of β under `dynamic` and the target-KL controllers.

        > Parameters that control the reference policy

        ref_reset_steps (`int`, *optional*, defaults to `0`):
            Reference resets (ProRL): after every this many optimizer steps the reference becomes the current policy
            (a full model's weights, or a PEFT model's adapter copied into a frozen `"ref"` adapter). 0: never.
        ref_reset_kl (`float`, *optional*, defaults to `0.0`):
            Reset the reference after an optimizer step whose mean raw KL (`adaptive_kl/raw_kl`) exceeds this value.
            0: never.
        ref_reset_optimizer (`bool`, *optional*, defaults to `False`):
            Also clear the optimizer's state (Adam's moments) at each reset, as ProRL does. The learning-rate
            schedule goes on.
        skip_zero_beta_reference (`bool`, *optional*, defaults to `True`):
            Skip the reference forward of a generation batch when β_t is exactly 0 for every optimizer step it serves
            (`dynamic` from `beta_schedule_steps` on with `beta_min = 0`): the loss and gradients are those of the
            same run without the skip. With full fine-tuning, once β is 0 for good and nothing else needs the model
            of the reference (`kl_monitor_steps = 0`, no reference resets, no `sync_ref_model`), it is freed.
        kl_monitor_steps (`int` or `None`, *optional*, defaults to `None`):
            While the reference forward is skipped, score the reference anyway on the first generation batch of every
            this many optimizer steps, so that `adaptive_kl/raw_kl` stays visible (from those batches only). `None`:
            `logging_steps`, so that every log line carries it; `0`: never.

        > Parameters that control checkpoints

        resume_without_kl_state (`bool`, *optional*, defaults to `False`):
            Resuming from a checkpoint that carries no adaptive-KL controller state (one saved by stock TRL's
            `GRPOTrainer`, or damaged) is an error when β adapts during training (`dynamic` or a target-KL
            controller), since β would silently restart at `beta`. `True` resumes anyway, with β started afresh.

        > Parameters that control the logging

        diversity_metrics (`bool`, *optional*, defaults to `False`):
            Log `diversity/*` metrics of each generation batch (unique completions, distinct-n, embedding
            similarity within groups, token entropy).
        diversity_embedder (`str`, *optional*, defaults to `"hashed"`):
            Embedder of `diversity/embedding_similarity`: `"hashed"` (character n-grams, no dependency),
            `"minilm"` (all-MiniLM-L6-v2 through sentence-transformers, offline, from the `diversity` extra) or the
            path or hub id of a sentence-transformers model. Needs `diversity_metrics=True`.
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
    kl_placement: str = field(
        default="loss",
        metadata={
            "help": "Where the KL goes: 'loss' (beta * Agg(f(k)) added to the loss) or 'reward' (the detached "
            "sequence penalty beta * sum_t f(k) subtracted from each reward before the group advantages; use "
            "kl_estimator='k1' there)."
        },
    )
    kl_mask_zero_std_groups: bool = field(
        default=False,
        metadata={
            "help": "Leave out the KL of completions whose group's total rewards all agree (zero std, decided per "
            "group): their advantages are 0 and the KL would be their only gradient. The loss's normalizers are "
            "unchanged (only those completions' KL is zeroed); with kl_placement='reward' they carry no penalty."
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
            "help": "Target-KL controller of beta: 'fixed' (none), 'adaptive' (proportional, Ziegler et al. 2019) or "
            "'stepwise' (x1.5 above 1.5*target_kl, x0.75 below 0.5*target_kl)."
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
        metadata={"help": "Horizon, in sequences, of the 'adaptive' controller. Must be > 0."},
    )
    beta_min: float = field(
        default=0.0,
        metadata={"help": "Lower bound of beta under 'dynamic' and the target-KL controllers. In [0, beta]."},
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
    diversity_metrics: bool = field(
        default=False,
        metadata={
            "help": "Log diversity/* metrics of each generation batch: unique completions per group, distinct-1/2, "
            "mean pairwise embedding similarity within groups, token entropy."
        },
    )
    diversity_embedder: str = field(
        default=HASHED,
        metadata={
            "help": "Embedder of diversity/embedding_similarity: 'hashed' (character n-grams, no dependency), "
            "'minilm' (all-MiniLM-L6-v2 via sentence-transformers, offline; pip install 'adaptive-kl[diversity]') or "
            "the path or hub id of a sentence-transformers model. Needs diversity_metrics=True."
        },
    )

    def __post_init__(self):
        check_import_order(GRPOConfig, trl.GRPOConfig, "GRPOConfig")
        self._validate_adaptive_kl()
        super().__post_init__()
        check_adaptive_horizon(self)

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
        """Whether any KL field differs from stock TRL's behaviour."""
        chosen = (self.kl_scaling, self.kl_estimator, self.kl_controller, self.kl_placement)
        return bool(self.kl_methods) or chosen != ("none", "k3", "fixed", "loss") or self.kl_mask_zero_std_groups

    def _validate_adaptive_kl(self) -> None:
        check_training_arguments(self)
        parse_kl_adaptation_method(self.kl_adaptation_method)  # its ValueError first, as before the other fields
        check_kl_scaling(self)
        require(
            self.kl_estimator in ESTIMATORS, f"kl_estimator must be one of {ESTIMATORS}, got {self.kl_estimator!r}."
        )
        require(
            self.kl_placement in KL_PLACEMENTS,
            f"kl_placement must be one of {KL_PLACEMENTS}, got {self.kl_placement!r}.",
        )
        flags = ("diversity_metrics", "resume_without_kl_state", "kl_mask_zero_std_groups")
        for name in flags:
            value = getattr(self, name)
            require(isinstance(value, bool), f"{name} must be True or False, got {value!r}.")
        require(
            isinstance(self.diversity_embedder, str) and self.diversity_embedder.strip() != "",
            f"diversity_embedder must be {HASHED!r}, {MINILM!r} or a sentence-transformers model's path or hub id, "
            f"got {self.diversity_embedder!r}.",
        )
        if self.diversity_embedder != HASHED:
            require(
                self.diversity_metrics,
                f"diversity_embedder={self.diversity_embedder!r} is used only by the diversity metrics: set "
                "diversity_metrics=True too.",
            )
            check_embedder(self.diversity_embedder)
        check_zero_beta_reference(self)
        check_kl_coefficient(self)
        require(
            self.beta > 0 or not self.uses_adaptive_kl,
            f"beta must be > 0 when any KL adaptation is set (kl_adaptation_method={self.kl_adaptation_method!r}, "
            f"kl_scaling={self.kl_scaling!r}, kl_estimator={self.kl_estimator!r}, "
            f"kl_controller={self.kl_controller!r}, kl_placement={self.kl_placement!r}, "
            f"kl_mask_zero_std_groups={self.kl_mask_zero_std_groups!r}): TRL loads no reference model at beta=0.",
        )
        check_reference_resets(self)
        if self.kl_placement == "reward":
            require(
                self.kl_estimator not in STRAIGHT_THROUGH_ESTIMATORS,
                f"kl_estimator={self.kl_estimator!r} differs from {self.kl_estimator[:-1]!r} only in its gradient, "
                "and kl_placement='reward' uses no gradient of the penalty: use "
                f"kl_estimator={self.kl_estimator[:-1]!r} there, or kl_placement='loss'.",
            )
            require(
                self.multi_objective_aggregation == "sum_then_normalize",
                "kl_placement='reward' subtracts the KL penalty from the total reward before the group normalization, "
                "which needs multi_objective_aggregation='sum_then_normalize' (got "
                f"{self.multi_objective_aggregation!r}, which normalizes each reward function separately).",
            )
        require(
            self.beta == 0 or self.loss_type in LOSS_TYPES,
            f"loss_type must be one of {LOSS_TYPES} when beta > 0 (the KL term mirrors its aggregation), "
            f"got {self.loss_type!r}.",
        )
        self.warn_unread_parameters()
        if self.kl_estimator == "k1" and self.beta > 0 and self.kl_placement == "loss":
            warnings.warn(
                "kl_estimator='k1' in the loss has zero expected gradient: it measures KL but does not regularize "
                "towards the reference. Use 'k2' or 'k3' in the loss, or kl_placement='reward' for k1.",
                UserWarning,
                stacklevel=4,  # the caller of AdaptiveKLGRPOConfig(...)
            )

    def warn_unread_parameters(self) -> None:
        """Warns once (at construction) for each parameter of `PARAMETER_READERS` set to other than its default while
        nothing reads it, naming what would make it take effect."""
        for name in unread_parameters(self):
            reader = PARAMETER_READERS[name][1]
            needs = f"beta > 0 and {reader}" if self.beta == 0 else reader
            warnings.warn(
                f"{name}={getattr(self, name)!r} has no effect: it is read only with {needs}.",
                UserWarning,
                stacklevel=5,  # the caller of AdaptiveKLGRPOConfig(...)
            )

    @property
    def resets_reference(self) -> bool:
        """Whether reference resets are on (`ref_reset_steps` or `ref_reset_kl`)."""
        return self.ref_reset_steps > 0 or self.ref_reset_kl > 0


def check_reference_resets(config) -> None:
    """Checks of the reference resets' fields (`ref_reset_steps`, `ref_reset_kl`, `ref_reset_optimizer`) against
    `beta` and `sync_ref_model`: shared by the GRPO and RLOO configs."""
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
    """Checks of the zero-β reference skip's fields (`skip_zero_beta_reference`, `kl_monitor_steps`): shared by the
    GRPO and RLOO configs."""
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
    """Checks of the step scaling α(t) and the `dynamic` trigger's fields: shared by the GRPO and RLOO configs."""
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
    """Checks of the fields of β_t (`beta`, the controllers, `dynamic`) and of the transforms' parameters: shared by
    the GRPO and RLOO configs."""
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


def check_adaptive_horizon(config) -> None:
    """The 'adaptive' controller's horizon against the sequences of one optimizer step, after
    `TrainingArguments.__post_init__`: it needs the process count, known once the distributed state is set up."""
    sequences_per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps * config.world_size
    require(
        config.kl_controller != "adaptive" or ADAPTIVE_ERROR_CLIP * sequences_per_step < config.kl_horizon,
        f"kl_horizon must exceed {ADAPTIVE_ERROR_CLIP} x the sequences per optimizer step ({sequences_per_step}) "
        f"with kl_controller='adaptive', got {config.kl_horizon}: a larger step would make beta negative.",
    )


def check_training_arguments(config) -> None:
    """Checks of inherited `TrainingArguments` fields that Transformers leaves to the optimizer, which would fail (or
    silently not train) only inside `train()`: shared by every config of this package."""
    require(
        is_finite_number(config.learning_rate) and config.learning_rate > 0,
        f"learning_rate must be a finite number > 0, got {config.learning_rate!r} (at 0 the policy never changes; "
        "a negative one is refused by the optimizer only once training starts).",
    )


if is_unsloth_class(GRPOConfig):  # `import unsloth` came first: keep Unsloth's __init__ and its defaults
    keep_host_init(AdaptiveKLGRPOConfig)
