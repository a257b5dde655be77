"""`AdaptiveKLRLOOTrainer`: `trl.RLOOTrainer` with an adaptive KL penalty in the reward.

TRL's RLOO scores each generation batch with the sampling policy and the reference, subtracts β·Σ_t k1 from each
completion's reward and takes the leave-one-out advantages. This trainer keeps all of that (the host's β stays on, so
it computes the reference log-probabilities and logs `kl` as usual), and replaces the advantages afterwards
(`HostHooks._on_scored`): from the same rewards and the log-probabilities the host computed while scoring
(`HostHooks.generation_logps`, no extra forward), it subtracts the adapted penalty β_t·Σ_t f(k)
(`kl.placement.sequence_kl_penalty`) and recomputes the leave-one-out advantages (`kl.placement.
leave_one_out_advantages`). With method `"none"` and `kl_estimator="k1"` the penalty is the host's, so the advantages
are the host's to float precision. The loss is the host's, untouched.

The collaborators are those of `AdaptiveKLGRPOTrainer`: `zero_beta` (a generation batch scored without the reference
while β_t is 0 for every step it serves, and the reference released once β is 0 for good), `resetter` (reference
resets), `rollouts` (the mean reward, zero-std groups), `monitoring` (the statistics the controller and the
`adaptive_kl/*` metrics read, recorded per micro-batch from the penalty's tokens, which travel with the batch) and
`state` (the β controller and the resets in every checkpoint, restored on resume).
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext

import torch
from trl import RLOOTrainer

from ..kl.placement import leave_one_out_advantages, penalty_statistics, sequence_kl_penalty
from .hooks import (
    HostHooks,
    check_host,
    check_host_attributes,
    completion_loss_mask,
    group_size,
    host_beta,
    host_built_without_reference,
    metric_store,
    normalizes_advantages,
    resolve_args,
    reward_clip_range,
    unsupported_trl,
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
        # Whether the generation batch being scored has the reference's log-probabilities (`_scores_reference`).
        self._batch_scores_reference = True
        self._build_kl_state(args, loads_no_reference)

    __init__.__signature__ = inspect.signature(RLOOTrainer.__init__)

    # --- the host's extension points (`hooks.HostHooks`) -------------------------------------------------------------

    def _scores_reference(self, mode: str) -> bool:
        self._batch_scores_reference = super()._scores_reference(mode)
        return self._batch_scores_reference

    def _on_scored(self, output: dict, rewards_per_func: torch.Tensor, mode: str) -> None:
        rewards = self.rollouts.total_rewards(rewards_per_func, mode)  # (N,): the mean reward `dynamic` reads
        if host_beta(self) == 0.0:  # stock RLOO (the config allows nothing else at β = 0): no penalty to replace
            return
        if self._batch_scores_reference:
            sampling_logps, ref_logps = self._scored_logps(scorings=2)
            penalty = sequence_kl_penalty(
                sampling_logps, ref_logps, completion_loss_mask(output),
                beta=self.beta_controller.beta(self.state.global_step + 1), **self._kl_options(),
            )  # fmt: skip
        else:
            # Scored without the reference (`_scores_reference`): β_t = 0 for every step the batch serves, so the
            # penalty is exactly 0. Its advantages still come from the path below, as those of the same run without
            # the skip (whose penalty is 0·Σ f(k)), so that the run is bitwise unchanged.
            (sampling_logps,), ref_logps = self._scored_logps(scorings=1), None
            dtype = torch.promote_types(sampling_logps.dtype, torch.float32)  # `sequence_kl_penalty`'s
            penalty = torch.zeros(len(sampling_logps), dtype=dtype, device=sampling_logps.device)
        clip = reward_clip_range(self)
        if clip:  # the host clamps the task reward, then subtracts its penalty: so do we
            rewards = rewards.clamp(min=clip[0], max=clip[1])
        self.rollouts.penalize(
            output, rewards, penalty, mode,
            advantages_of=lambda penalized: leave_one_out_advantages(
                penalized, group_size(self, mode), normalizes_advantages(self)
            ),
        )  # fmt: skip
        if ref_logps is not None:  # without them, the loss records its micro-batches as scored without the reference
            output[SAMPLING_LOGPS], output[REFERENCE_LOGPS] = sampling_logps, ref_logps

    def _scored_logps(self, scorings: int) -> tuple[torch.Tensor, ...]:
        """The `(B, T)` log-probabilities the host scored the batch with: the sampling policy's, then the
        reference's (`_get_per_token_logps_and_entropies`, called twice while its β is not 0; once, the policy's
        only, when `_scores_reference` had it score with β = 0).

        Raises:
            UnsupportedTRLError: the host scored the batch another number of times than `scorings`.
        """
        if len(self.generation_logps) != scorings:
            what = "the policy, then the reference" if scorings == 2 else "the policy only (β = 0)"
            raise unsupported_trl(
                f"{type(self).__name__} expects the host to score a generation batch with {what} "
                f"(_get_per_token_logps_and_entropies, {scorings} times), but it did {len(self.generation_logps)}"
            )
        return self.generation_logps

    # --- a run (`lifecycle.AdaptiveKLRun` starts each `train()`) -----------------------------------------------------

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        metrics = metric_store(self, mode)
        # TRL's `kl` (RLOO's k1, per generation batch) stays TRL's: ours, per micro-batch, covers other tokens when a
        # generation batch spans several optimizer steps. Ours is `adaptive_kl/raw_kl` with k1.
        host_kl = metrics.get("kl")
        self.kl_monitor.write_metrics(metrics, mode)
        if host_kl is None:
            metrics.pop("kl", None)
        else:
            metrics["kl"] = host_kl
        if mode == "eval":
            self.zero_beta.evaluation_logged()
        super().log(logs, start_time)

    # --- the KL statistics -------------------------------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if host_beta(self) == 0.0:
            return loss
        mode = "train" if self.model.training else "eval"
        step = self.state.global_step + 1  # the optimizer step in progress (the next one, in evaluation)
        controller = self.beta_controller
        if REFERENCE_LOGPS not in inputs:  # `_scores_reference`: β_t = 0, the penalty was exactly 0
            self.kl_monitor.record(None, mode, step, controller.beta(step), controller.scale(step))
            return loss
        stats = penalty_statistics(
            inputs[SAMPLING_LOGPS], inputs[REFERENCE_LOGPS], completion_loss_mask(inputs), **self._kl_transform()
        )
        stats = self.accelerator.reduce(stats, reduction="sum")
        self.kl_monitor.record(stats, mode, step, controller.beta(step), controller.scale(step))
        return loss

    def _kl_transform(self) -> dict:
        """How f(k) is computed from the per-token log-ratios k: the config's estimator and transform."""
        args = self.args
        return dict(
            estimator=args.kl_estimator,
            transform=self._kl_shape["transform"],
            clip_threshold=args.kl_clip_threshold,
            target=args.kl_target,
        )

    def _kl_options(self) -> dict:
        """`_kl_transform`, and whether the penalty is the per-sequence mean (`length_normalized`)."""
        return dict(self._kl_transform(), length_normalized=self._kl_shape["length_normalized"])
