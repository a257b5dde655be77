"""`AdaptiveKLGRPOConfig`: `trl.GRPOConfig` plus the fields that select the KL adaptation.

The fields every host takes, their checks and properties are `kl_fields.AdaptiveKLFields`'s; this config adds those of
GRPO alone (where the KL goes, the zero-std KL mask, the diversity metrics) and their checks against GRPO's own fields.
The parent is whatever `trl.GRPOConfig` is when this module is first imported: TRL's own, or Unsloth's after
`import unsloth`, whose `__init__` (and defaults) the subclass keeps.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from .hooks import check_trl_version


check_trl_version()  # before TRL is imported: fail with what to install rather than misbehave

import trl  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from ..kl.aggregation import LOSS_TYPES  # noqa: E402
from ..kl.estimators import ESTIMATORS, STRAIGHT_THROUGH_ESTIMATORS  # noqa: E402
from ..kl.placement import KL_PLACEMENTS  # noqa: E402
from ..kl.validation import require  # noqa: E402
from .embedding import HASHED, MINILM, check_embedder  # noqa: E402
from .kl_fields import (  # noqa: E402, F401 (the config's vocabulary, importable with it)
    KL_METHODS,
    KL_TRANSFORMS,
    PARAMETER_READERS,
    AdaptiveKLFields,
    parse_kl_adaptation_method,
    unread_parameters,
)
from .unsloth import check_import_order, is_unsloth_class, keep_host_init  # noqa: E402


@dataclass
class AdaptiveKLGRPOConfig(AdaptiveKLFields, GRPOConfig):
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
        kl_log_ratio_clip (`float` or `None`, *optional*, defaults to `None`):
            Clamp the log-ratio to [−c, c] before it is exponentiated: k3's and k3+'s r, and with
            `use_bias_correction_kl` the importance log-ratio. A token beyond it gets a finite estimate and no
            gradient, so one degenerate token cannot make the KL inf or NaN (docs/errors.md). `None`: no clamp, TRL's
            arithmetic (on Unsloth, its loss's ±20). In (0, 88].
        kl_clip_threshold (`float`, *optional*, defaults to `1.0`):
            `clip`: per-token KL above this value is clipped (and carries no gradient).
        kl_target (`float`, *optional*, defaults to `0.1`):
            `sigmoid` only: the gate's centre τ, the per-token KL at which σ(k − τ) is one half (the seed documents'
            name). Not the controllers' target, which is `target_kl`.

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
            `"fixed"`; `"adaptive"` (Ziegler et al., 2019) or `"stepwise"`, target-KL controllers of β on the training
            KL, which hold β after an optimizer step where every group's rewards agreed (no advantage: the KL was the
            step's only gradient; `adaptive_kl/held_updates` counts those steps); or `"drift"`, which steers the drift
            from the starting policy on held-out texts (`eval_dataset`) to `target_drift` at the run's last step
            (docs/design.md §5). Each keeps β in [`beta_min`, `beta_max`].
        target_drift (`float` or `None`, *optional*, defaults to `None`):
            `kl_controller="drift"` (required there): the drift you accept at the end of the run, nats a token: the
            exact KL of the policy's next-token distributions to the starting policy's, averaged over the completion
            tokens of the held-out texts, what `adaptive-kl frontier` reads as drift. > 0.
        drift_every (`int`, *optional*, defaults to `5`):
            `kl_controller="drift"`: measure the drift, and update β, after every this many optimizer steps and after
            the last (logged as `adaptive_kl/drift` beside the path's `adaptive_kl/drift_target`).
        drift_samples (`int`, *optional*, defaults to `32`):
            `kl_controller="drift"`: how many held-out texts, the first rows of `eval_dataset`, the drift is measured
            on: their `prompt` and `completion`, or without that column the starting policy's greedy answers to the
            prompts. Kept in every checkpoint.
        target_kl (`float`, *optional*, defaults to `0.05`):
            `kl_controller="adaptive"` or `"stepwise"` only: the target mean per-token KL (PPO's name). Not the sigmoid
            gate's centre, which is `kl_target`.
        kl_horizon (`int`, *optional*, defaults to `10000`):
            Horizon H (in sequences) of the `"adaptive"` controller: a step of n sequences moves β by a factor of at
            most 1 ± 0.2·n/H, so N steps by at most (1 ± 0.2·n/H)^N (1.6% in 100 steps of 8 sequences at 10,000). A
            horizon that cannot move β by 10% over `max_steps` warns.
        beta_min (`float`, *optional*, defaults to `0.0`):
            Lower bound of β under `dynamic` and the controllers.
        beta_max (`float` or `None`, *optional*, defaults to `None`):
            Ceiling of β under the controllers, the rules that raise it. `None`: `beta`, where β starts: a
            controller may lower β towards a larger KL and raise it back, never past the β you chose. In [`beta`, ∞]:
            `float("inf")` is no ceiling (Ziegler et al.'s controller, as verl and OpenRLHF run it). In the package's
            frontier study the unbounded `"stepwise"` controller raised β past 2 and lost the format reward on 4 of 5
            seeds (docs/studies/README.md).

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

        > Parameters of GRPO alone: where the KL goes

        kl_placement (`str`, *optional*, defaults to `"loss"`):
            `"loss"`: β_t·Agg(f(k)) is added to the loss. `"reward"`: the detached sequence penalty β_t·Σ_t f(k) is
            subtracted from each completion's reward before the group advantages, and the loss has no KL term (use
            `kl_estimator="k1"` there).
        kl_mask_zero_std_groups (`bool`, *optional*, defaults to `False`):
            Leave out the KL of the completions of a group whose total rewards all agree (zero group std, decided per
            group of each generation batch as TRL decides `frac_reward_zero_std`): their advantages are 0, so the KL
            would be their only gradient (TRL issue #5588). In the loss only the KL's numerator loses them (the host's
            normalizers are unchanged); in the reward they carry no penalty. The KL statistics still cover them.

        > Parameters of GRPO alone: the logging

        diversity_metrics (`bool`, *optional*, defaults to `False`):
            Log `diversity/*` metrics of each generation batch (unique completions, distinct-n, embedding
            similarity within groups, token entropy).
        diversity_embedder (`str`, *optional*, defaults to `"hashed"`):
            Embedder of `diversity/embedding_similarity`: `"hashed"` (character n-grams, no dependency),
            `"minilm"` (all-MiniLM-L6-v2 through sentence-transformers, offline, from the `diversity` extra) or the
            path or hub id of a sentence-transformers model. Needs `diversity_metrics=True`.
    """

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

    ADAPTATION_SELECTORS = ("kl_scaling", "kl_estimator", "kl_controller", "kl_placement", "kl_mask_zero_std_groups")

    @property
    def kl_term_is_trls(self) -> bool:
        """Whether the KL term is TRL's own, β_t·Agg(k3) with TRL's bias correction and aggregation, whatever chooses
        β_t (a constant, `kl_scaling`, `dynamic`, a target-KL controller): k3, no transform, no length normalization,
        in the loss, no zero-std mask, no log-ratio clamp. TRL's loss then computes it, at β_t."""
        return (
            self.kl_estimator == "k3"
            and self.kl_transform is None
            and "length_normalized" not in self.kl_methods
            and self.kl_placement == "loss"
            and not self.kl_mask_zero_std_groups
            and self.kl_log_ratio_clip is None
        )

    def _check_own_fields(self) -> None:
        check_import_order(GRPOConfig, trl.GRPOConfig, "GRPOConfig")
        require(
            self.kl_estimator in ESTIMATORS, f"kl_estimator must be one of {ESTIMATORS}, got {self.kl_estimator!r}."
        )
        require(
            self.kl_placement in KL_PLACEMENTS,
            f"kl_placement must be one of {KL_PLACEMENTS}, got {self.kl_placement!r}.",
        )
        for name in ("diversity_metrics", "kl_mask_zero_std_groups"):
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

    def _check_with_host(self) -> None:
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
        if self.kl_estimator == "k1" and self.beta > 0 and self.kl_placement == "loss":
            warnings.warn(
                "kl_estimator='k1' in the loss has zero expected gradient: it measures KL but does not regularize "
                "towards the reference. Use 'k2' or 'k3' in the loss, or kl_placement='reward' for k1.",
                UserWarning,
                stacklevel=5,  # the caller of AdaptiveKLGRPOConfig(...)
            )


if is_unsloth_class(GRPOConfig):  # `import unsloth` came first: keep Unsloth's __init__ and its defaults
    keep_host_init(AdaptiveKLGRPOConfig, GRPOConfig)
