"""`AdaptiveKLRLOOTrainer`: `trl.RLOOTrainer` with an adaptive KL penalty in the reward.

TRL's RLOO scores each generation batch with the sampling policy and the reference, subtracts β·Σ_t k1 from each
completion's reward and takes the leave-one-out advantages. This trainer keeps all of that (the host's β stays on),
and replaces the advantages afterwards (`_score_kl`): from the same rewards and the log-probabilities the host
computed while scoring (no extra forward), it subtracts the adapted penalty β_t·Σ_t f(k), recomputes the leave-one-out
advantages and logs TRL's `frac_reward_zero_std` from the rewards they use. Without an adaptation (`host_penalty`)
the host's penalty stands, bit for bit. The loss is the host's, untouched; each micro-batch's KL statistics come from
the penalty's tokens, which travel with the batch. What both trainers do is `lifecycle.AdaptiveKLRun`'s.
"""

from __future__ import annotations

import inspect

import torch
from trl import RLOOTrainer

from ..kl.groups import group_reward_std
from ..kl.placement import leave_one_out_advantages, penalty_sequence_sums
from .hooks import HostHooks, HostScoring, check_host, completion_loss_mask, unsupported_trl
from .lifecycle import AdaptiveKLRun, ScoredBatch
from .rloo_config import AdaptiveKLRLOOConfig, check_no_unsloth


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
        host_penalty (`bool`): the host's own penalty stands (every KL field at its default); the package only
            measures the KL for `adaptive_kl/*`.
    """

    host_class, host_family, config_class = RLOOTrainer, "rloo", AdaptiveKLRLOOConfig
    kl_in_reward = True

    def __init__(self, model, reward_funcs, args=None, *more, **kwargs):
        super().__init__(model, reward_funcs, args, *more, **kwargs)

    __init__.__signature__ = inspect.signature(RLOOTrainer.__init__)

    def _prepare_host(self, args, more: tuple, kwargs: dict) -> None:
        check_no_unsloth("AdaptiveKLRLOOTrainer")
        check_host(RLOOTrainer, "rloo", args, "AdaptiveKLRLOOTrainer", own_loss=False)  # the loss is the host's
        # Nothing of the config changes the host's penalty (β constant, k1 summed): it stands, and the advantages and
        # every value TRL logs are stock TRL's, bit for bit; the package only measures the KL.
        self.host_penalty = not args.uses_adaptive_kl

    # --- a scored generation batch -----------------------------------------------------------------------------------

    def _score_kl(self, scoring: HostScoring, batch: ScoredBatch) -> None:
        if self.beta == 0.0:  # stock RLOO (the config allows nothing else at β = 0): no penalty to replace
            return
        policy_logps, ref_logps = self._named_logps(scoring)
        output, mode = scoring.output, scoring.mode
        mask = completion_loss_mask(output)
        penalty = self._kl_penalty(policy_logps, ref_logps, mask, batch.beta, policy_logps.dtype)
        if ref_logps is not None:  # for the KL statistics of its micro-batches (without: scored without the reference)
            output[SAMPLING_LOGPS], output[REFERENCE_LOGPS] = policy_logps, ref_logps
        if self.host_penalty:  # the host subtracted this penalty itself: logged, not applied
            self._penalize(scoring, batch.rewards, penalty)
            return
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        rewards, normalize = batch.rewards, self.normalize_advantages
        if self.reward_clip_range:  # the host clamps the task reward, then subtracts its penalty: so do we
            rewards = rewards.clamp(min=self.reward_clip_range[0], max=self.reward_clip_range[1])
        penalized = self._penalize(
            scoring, rewards, penalty, lambda rewards: leave_one_out_advantages(rewards, group_size, normalize)
        )
        # TRL logs the zero-std groups of the rewards it penalized with its own fixed β; ours are those the advantages
        # use, whatever the path (with or without the reference skipped, any method), as TRL counts them.
        std = group_reward_std(penalized, group_size)
        zero_std = torch.isclose(std, torch.zeros_like(std)).float().mean()  # a float32 mean, as TRL's
        scoring.log.write("frac_reward_zero_std", [zero_std.item()])

    def _named_logps(self, scoring: HostScoring) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(policy, reference)` `(B, T)` log-probabilities of the batch (TRL's RLOO keeps only their sums): it scores
        the sampling policy, then the reference when its β is not 0; `UnsupportedTRLError` for another count."""
        expected = 2 if scoring.reference_scored else 1
        if len(scoring.logps) != expected:
            what = "the policy, then the reference" if scoring.reference_scored else "the policy only (β = 0)"
            raise unsupported_trl(
                f"{type(self).__name__} expects the host to score a generation batch with {what} "
                f"(_get_per_token_logps_and_entropies, {expected} times), but it did {len(scoring.logps)}"
            )
        return scoring.logps[0], scoring.logps[1] if scoring.reference_scored else None

    # --- the KL statistics -------------------------------------------------------------------------------------------

    def _loss_and_kl_sums(self, model, inputs, return_outputs, num_items_in_batch, mode, beta):
        loss = super(AdaptiveKLRun, self).compute_loss(model, inputs, return_outputs, num_items_in_batch)  # host's
        if REFERENCE_LOGPS not in inputs:  # scored without the reference: β_t = 0, the penalty was exactly 0
            return loss, None
        return loss, penalty_sequence_sums(
            inputs[SAMPLING_LOGPS], inputs[REFERENCE_LOGPS], completion_loss_mask(inputs), **self.kl_transform_options
        )
