"""`BinomialKLConfig`: every `trl.GRPOConfig` argument, plus the binomial-KL ("SPO") objective's fields."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...trainers.hooks import check_trl_version


check_trl_version()  # before TRL is imported: fail with what to install rather than misbehave

import trl  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from ...kl.validation import is_finite_number, require  # noqa: E402
from ...trainers.kl_fields import check_training_arguments  # noqa: E402
from ...trainers.unsloth import check_import_order, is_unsloth_class  # noqa: E402
from .loss import BINOMIAL_KL_TARGETS  # noqa: E402


# Host options that change GRPO's loss and that this objective does not apply: refused unless at the value that
# leaves them inert.
_INERT_HOST_OPTIONS = {
    "top_entropy_quantile": 1.0,
    "off_policy_mask_threshold": None,
    "entropy_coef": 0.0,
    "use_adaptive_entropy": False,
}


@dataclass
class BinomialKLConfig(GRPOConfig):
    r"""
    Configuration class for [`BinomialKLTrainer`]: every [`~trl.GRPOConfig`] argument, plus the binomial-KL objective.

    `beta` must stay 0 (there is no reference-model term) and `loss_type` at its default (the aggregation is the
    objective's own); the PPO clip fields (`epsilon`, `delta`, `importance_sampling_level`) and reward normalization
    fields (`scale_rewards`, `multi_objective_aggregation`) are ignored.

    Parameters:
        binomial_kl_target (`str`, *optional*, defaults to `"max"`):
            Target probability q of the per-token KL(Bern(q) ‖ Bern(p)): `"max"` (q = p_max, the probability of the
            most probable token) or `"half"` (q = 0.5, only on tokens with p > 0.5).
        correct_reward_threshold (`float`, *optional*, defaults to `0.0`):
            A sequence is correct, and trained on, when its total reward is above this value.
        binomial_kl_detach_target (`bool`, *optional*, defaults to `True`):
            `"max"`: stop the gradient through p_max, making the loss a KL toward a fixed target. `False` also
            differentiates through p_max (as the RL2 study code does), which lowers the argmax token's probability.
    """

    binomial_kl_target: str = field(
        default="max",
        metadata={
            "help": "Target q of the per-token KL(Bern(q) || Bern(p_sampled)): 'max' (q = probability of the most "
            "probable token) or 'half' (q = 0.5, applied only where p_sampled > 0.5)."
        },
    )
    correct_reward_threshold: float = field(
        default=0.0,
        metadata={"help": "A sequence is correct (and trained on) when its total reward is > this value."},
    )
    binomial_kl_detach_target: bool = field(
        default=True,
        metadata={
            "help": "'max': stop the gradient through p_max (a KL toward a fixed target). False also differentiates "
            "through p_max, as the RL2 study code does."
        },
    )

    def __post_init__(self):
        check_import_order(GRPOConfig, trl.GRPOConfig, "GRPOConfig")
        if is_unsloth_class(GRPOConfig):
            raise NotImplementedError("BinomialKLConfig does not support Unsloth's GRPOConfig; use plain TRL.")
        self._validate_binomial_kl()
        super().__post_init__()
        # steps_per_generation is resolved by GRPOConfig.__post_init__ (it defaults to gradient_accumulation_steps).
        require(
            self.steps_per_generation % self.gradient_accumulation_steps == 0,
            f"steps_per_generation ({self.steps_per_generation}) must be a multiple of gradient_accumulation_steps "
            f"({self.gradient_accumulation_steps}) for BinomialKLConfig: the loss divides by the correct sequences of "
            "the whole optimizer step, which must all come from one generation batch.",
        )

    def _validate_binomial_kl(self) -> None:
        check_training_arguments(self)
        require(
            self.binomial_kl_target in BINOMIAL_KL_TARGETS,
            f"binomial_kl_target must be one of {BINOMIAL_KL_TARGETS}, got {self.binomial_kl_target!r}.",
        )
        threshold = self.correct_reward_threshold
        require(
            is_finite_number(threshold) and threshold >= 0,
            f"correct_reward_threshold must be a finite number >= 0, got {threshold!r}: the loss is weighted by the "
            "reward, so a correct sequence with a negative reward would be pushed away from its target.",
        )
        require(
            isinstance(self.binomial_kl_detach_target, bool),
            f"binomial_kl_detach_target must be True or False, got {self.binomial_kl_detach_target!r}.",
        )
        require(
            self.beta == 0,
            f"beta must be 0 for BinomialKLConfig, got {self.beta!r}: the binomial-KL objective has no "
            "reference-model KL term (its KL is toward p_max or 0.5 under the current policy).",
        )
        default_loss_type = GRPOConfig.__dataclass_fields__["loss_type"].default
        require(
            self.loss_type == default_loss_type,
            f"loss_type is not used by BinomialKLTrainer (its loss is the per-sequence binomial KL averaged over the "
            f"correct sequences); leave it at its default {default_loss_type!r}, got {self.loss_type!r}.",
        )
        for name, inert in _INERT_HOST_OPTIONS.items():
            value = getattr(self, name, inert)
            require(
                value == inert,
                f"{name} must be {inert!r} for BinomialKLConfig (got {value!r}): the binomial-KL loss does not "
                "apply it.",
            )
