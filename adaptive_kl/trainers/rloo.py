"""`AdaptiveKLRLOOTrainer`: `trl.RLOOTrainer` with an adaptive KL penalty in the reward.

TRL's RLOO scores each generation batch with the sampling policy and the reference, subtracts β·Σ_t k1 from each
completion's reward and takes the leave-one-out advantages. This trainer keeps all of that (the host's β stays on, so
it computes the reference log-probabilities and logs `kl` as usual), and replaces the advantages afterwards
(`_on_scored`): from the same rewards and the log-probabilities the host computed while scoring (`hooks.ScoredBatch`,
no extra forward), it subtracts the adapted penalty β_t·Σ_t f(k) (`kl.placement.sequence_kl_penalty`), recomputes the
leave-one-out advantages (`kl.placement.leave_one_out_advantages`) and logs TRL's `frac_reward_zero_std` from the
rewards they use. With method `"none"` and `kl_estimator="k1"` the penalty is the host's, so the advantages and logs
are the host's to float precision. The loss is the host's, untouched.

The rest is `lifecycle.AdaptiveKLRun`'s, shared with `AdaptiveKLGRPOTrainer`: the β each generation batch is scored
with, the statistics recorded per micro-batch from the penalty's tokens (which travel with the batch), the end of each
optimizer step, the metrics, and the collaborators `zero_beta` (a generation batch scored without the reference while
β_t is 0 for every step it serves, and the reference released once β is 0 for good), `resetter` (reference resets),
`rollouts` (the mean reward, zero-std groups) and `state` (the β controller and the resets in every checkpoint).
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext

import torch
from trl import RLOOTrainer

from ..kl.placement import leave_one_out_advantages, penalty_statistics, sequence_kl_penalty
from .hooks import (
    HostHooks,
    ScoredBatch,
    check_host,
    check_host_attributes,
    completion_loss_mask,
    group_size,
    host_beta,
    host_built_without_reference,
    normalizes_advantages,
    resolve_args,
    reward_clip_range,
)
from .lifecycle import AdaptiveKLRun
from .rloo_config import AdaptiveKLRLOOConfig, check_no_unsloth
from .zero_beta import reference_never_scored


# Keys this trainer adds to each scored batch: `(B, T)` tensors, so TRL's shuffle and split carry them with their
# completions into the micro-batches, where the KL statistics are recorded. The host's loss does not read them.
SAMPLING_LOGPS, REFERENCE_LOGPS = "adaptive_kl_sampling_logps", "adaptive_kl_ref_logps"


class AdaptiveKLRLOOTrainer(AdaptiveKLRun, HostHooks, RLOOTrainer, hub_tag="adaptive-kl"):
    """Drop-in replacement for [`~trl.RLOOTrainer`] that takes an [`AdaptiveKLRLOOConfig`].

    Every argument is passed to `RLOOTrainer` unchanged, with the same signature. With `beta = 0` the trainer is stock
    TRL; otherwise the KL penalty in the reward is computed here (identical to TRL's at the config's defaults) and
    the `adaptive_kl/*` metrics are logged through `Trainer.log`. Not with Unsloth.

    Attributes:
        beta_controller (`BetaController`): owns β_t; saved in every checkpoint and restored on resume.
        reference_resets (`ReferenceResets`): when the reference is reset; saved in every checkpoint too.
    """

    def __init__(self, model, reward_funcs, args=None, *more, **kwargs):
        check_no_unsloth("AdaptiveKLRLOOTrainer")
        args = resolve_args(RLOOTrainer, AdaptiveKLRLOOConfig, model, args, "AdaptiveKLRLOOTrainer", "RLOO")
        check_host(RLOOTrainer, args, "AdaptiveKLRLOOTrainer", own_loss=False)  # the loss is the host's, untouched
        loads_no_reference = reference_never_scored(args, model, kwargs.get("peft_config"), on_unsloth=False)
        with host_built_without_reference(self, args) if loads_no_reference else nullcontext():
            super().__init__(model, reward_funcs, args, *more, **kwargs)
        check_host_attributes(self)
        self._build_kl_state(args, loads_no_reference)

    __init__.__signature__ = inspect.signature(RLOOTrainer.__init__)

    kl_in_reward = True
    host_metrics_kept = ("kl",)  # RLOO's `kl` (k1, per generation batch) stays TRL's: ours is `adaptive_kl/raw_kl`

    # --- the host's extension points (`hooks.HostHooks`) -------------------------------------------------------------

    def _on_scored(self, batch: ScoredBatch) -> None:
        # (N,): also what `dynamic` reads, the mean reward
        rewards = self.rollouts.total_rewards(batch.rewards_per_func, batch.mode)
        if host_beta(self) == 0.0:  # stock RLOO (the config allows nothing else at β = 0): no penalty to replace
            return
        if batch.ref_logps is not None:
            beta = self.generation_batches[batch.mode].beta
            penalty = sequence_kl_penalty(
                batch.policy_logps, batch.ref_logps, batch.mask, beta=beta, **self.kl_options()
            )
        else:
            # Scored without the reference (`_scores_reference`): β_t = 0 for every step the batch serves, so the
            # penalty is exactly 0. Its advantages still come from the path below, as those of the same run without
            # the skip (whose penalty is 0·Σ f(k)), so that the run is bitwise unchanged.
            dtype = torch.promote_types(batch.policy_logps.dtype, torch.float32)  # `sequence_kl_penalty`'s
            penalty = torch.zeros(len(batch.policy_logps), dtype=dtype, device=batch.policy_logps.device)
        clip = reward_clip_range(self)
        if clip:  # the host clamps the task reward, then subtracts its penalty: so do we
            rewards = rewards.clamp(min=clip[0], max=clip[1])
        penalized = self.rollouts.penalize(
            batch.output, rewards, penalty, batch.mode,
            advantages_of=lambda penalized: leave_one_out_advantages(
                penalized, group_size(self, batch.mode), normalizes_advantages(self)
            ),
        )  # fmt: skip
        # TRL logs the zero-std groups of the rewards it penalized with its own fixed β; ours are those the advantages
        # use, whatever the path (with or without the reference skipped, any method).
        self.rollouts.replace_logged_zero_std_fraction(penalized, batch.mode)
        if batch.ref_logps is not None:  # without them, the loss records its micro-batches as scored without it
            batch.output[SAMPLING_LOGPS], batch.output[REFERENCE_LOGPS] = batch.policy_logps, batch.ref_logps

    # --- the KL statistics -------------------------------------------------------------------------------------------

    def _loss_and_kl_statistics(self, model, inputs, return_outputs, num_items_in_batch, mode, beta):
        loss = self.host_compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if REFERENCE_LOGPS not in inputs:  # `_scores_reference`: β_t = 0, the penalty was exactly 0
            return loss, None
        stats = penalty_statistics(
            inputs[SAMPLING_LOGPS],
            inputs[REFERENCE_LOGPS],
            completion_loss_mask(inputs),
            **self.kl_transform_options(),
        )
        return loss, self.accelerator.reduce(stats, reduction="sum")
