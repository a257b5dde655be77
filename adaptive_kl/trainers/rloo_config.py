"""`AdaptiveKLRLOOConfig`: `trl.RLOOConfig` plus the fields that adapt RLOO's KL penalty in the reward.

RLOO puts the KL in the reward (Ahmadian et al. 2024, arXiv:2402.14740; TRL's `RLOOTrainer`): P_i = β·Σ_t k1 is
subtracted from each completion's reward before the leave-one-out advantages. This config takes the fields every host
takes (`kl_fields.AdaptiveKLFields`), `kl_estimator` defaulting to RLOO's k1; not the straight-through estimators (a
penalty in the reward has no gradient) nor GRPO's own fields (`GRPO_ONLY_FIELDS`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from .hooks import check_trl_version


check_trl_version()  # before TRL is imported: fail with what to install rather than misbehave

from trl import RLOOConfig  # noqa: E402

from ..kl.validation import require  # noqa: E402
from .kl_fields import AdaptiveKLFields  # noqa: E402


# The estimators of a penalty in the reward: the straight-through k1+/k3+ differ from k1/k3 only in a gradient that
# the detached penalty does not have.
RLOO_ESTIMATORS = ("k1", "k2", "k3")
# The fields of `AdaptiveKLGRPOConfig` that RLOO does not take, and why (a test checks that every other field of it is
# here, so a field added there is either offered here or listed).
GRPO_ONLY_FIELDS = {
    "kl_placement": "RLOO's KL is always in the reward",
    "kl_mask_zero_std_groups": "GRPO's zero-std groups; RLOO's leave-one-out advantages differ",
    "diversity_metrics": "the diversity metrics are wired into the GRPO trainer only",
    "diversity_embedder": "the diversity metrics are wired into the GRPO trainer only",
}


@dataclass
class AdaptiveKLRLOOConfig(AdaptiveKLFields, RLOOConfig):
    r"""
    Configuration class for [`AdaptiveKLRLOOTrainer`]: every [`~trl.RLOOConfig`] argument, plus the adaptation of its
    KL penalty in the reward.

    With every field below at its default the trainer is stock TRL's `RLOOTrainer` (the penalty β·Σ_t k1). Any other
    value needs `beta > 0` (TRL loads no reference model at `beta = 0`): a `ValueError` otherwise. The penalty of
    completion i is P_i = β_t · Σ_t m_it f(k_it) (or its per-sequence mean with `length_normalized`), subtracted from
    its reward before the leave-one-out advantages; `docs/rloo.md` has the formulas. The fields other than
    `kl_estimator` are those of [`AdaptiveKLGRPOConfig`] that every host takes (`kl_fields.AdaptiveKLFields`), with
    the same meaning, defaults and checks.

    Parameters:
        kl_estimator (`str`, *optional*, defaults to `"k1"`):
            Per-token estimator of KL(π‖π_ref) in the penalty: `"k1"` (r, RLOO's), `"k2"` (r²/2) or `"k3"`
            (exp(−r) + r − 1), with r = log π_old − log π_ref at the sampled token.
        kl_adaptation_method, kl_log_ratio_clip, kl_clip_threshold, kl_target, kl_scaling, kl_scaling_rate,
        dynamic_beta_decay, dynamic_trigger, reward_threshold, saturation_threshold, beta_schedule_steps,
        kl_controller, target_drift, drift_every, drift_samples, target_kl, kl_horizon, beta_min, beta_max,
        ref_reset_steps, ref_reset_kl, ref_reset_optimizer, skip_zero_beta_reference, kl_monitor_steps,
        resume_without_kl_state:
            As in [`AdaptiveKLGRPOConfig`].
    """

    kl_estimator: str = field(
        default="k1",
        metadata={
            "help": "Per-token KL estimator of the penalty, of r = log pi_old - log pi_ref: 'k1' (r, RLOO's), 'k2' "
            "(r^2/2) or 'k3' (exp(-r) + r - 1)."
        },
    )

    def _check_own_fields(self) -> None:
        check_no_unsloth("AdaptiveKLRLOOConfig")
        require(
            self.kl_estimator in RLOO_ESTIMATORS,
            f"kl_estimator must be one of {RLOO_ESTIMATORS}, got {self.kl_estimator!r} (RLOO's penalty is in the "
            "reward, which has no gradient for a straight-through estimator to shape).",
        )


def check_no_unsloth(name: str) -> None:
    """Refuses (`ImportError`) to build `name` once Unsloth is imported: this package's RLOO classes are not wired
    into Unsloth's RLOO trainer."""
    if "unsloth" in sys.modules:
        raise ImportError(
            f"{name} does not support Unsloth, which is imported in this process (it patches TRL's RLOOTrainer, "
            "which this package's RLOO classes are not wired into). Run RLOO without `import unsloth`, or use "
            "AdaptiveKLGRPOTrainer, which supports Unsloth."
        )
