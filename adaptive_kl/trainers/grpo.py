"""`AdaptiveKLGRPOTrainer`: `trl.GRPOTrainer` with an adaptive KL term.

The host computes its own loss with β = 0 (the policy term, untouched), and this class adds `β_t · Agg(f(k))` computed
from the log-probabilities the host already computed for that loss: no copy of the host's loss, no extra forward
pass. The KL term's path: `compute_loss` → `hooks.HostHooks.host_loss_without_kl` (what the host's loss scored) →
`_host_kl_inputs` (its aggregation, `hooks.host_loss_settings`) → `kl.term.adapted_kl_term`.

The host is whatever `trl.GRPOTrainer` is when this module is first imported: TRL's own, or, after `import unsloth`,
Unsloth's generated trainer, whose loss is reached through `adaptive_kl.trainers.unsloth`. Everything taken from the
host goes through `adaptive_kl.trainers.hooks` (its table `HOST_INTERNALS`). The other concerns are collaborators with
their own state, built and driven through a run by `lifecycle.AdaptiveKLRun` (shared with the RLOO trainer):
`zero_beta` (the reference skipped and released while β is 0 for good), `resetter` (reference resets), `rollouts` (each
scored generation batch: KL in the reward, the zero-std KL mask, diversity), `monitoring` (the statistics the
controller and the `adaptive_kl/*` metrics read) and `state` (checkpoints and resume).
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext

import torch
from trl import GRPOTrainer

from ..kl.aggregation import TOKEN_SUM_LOSS_TYPES, token_sum_normalizer
from ..kl.placement import sequence_kl_penalty
from ..kl.term import adapted_kl_term
from .config import AdaptiveKLGRPOConfig
from .embedding import build_embedder
from .hooks import (
    HostHooks,
    ScoredBatch,
    check_carries_gradient,
    check_host,
    check_host_attributes,
    completion_loss_mask,
    host_built_without_reference,
    host_loss_settings,
    metric_store,
    resolve_args,
)
from .inputs import check_train_dataset, train_dataset_argument
from .lifecycle import AdaptiveKLRun
from .unsloth import (
    capturing_efficient_grpo,
    prepare_unsloth_host,
    unsloth_kl_term_inputs,
    unsupported_unsloth,
    with_keyword_only,
)
from .zero_beta import reference_never_scored


class AdaptiveKLGRPOTrainer(AdaptiveKLRun, HostHooks, GRPOTrainer, hub_tag="adaptive-kl"):
    """Drop-in replacement for [`~trl.GRPOTrainer`] that takes an [`AdaptiveKLGRPOConfig`].

    Every argument is passed to `GRPOTrainer` unchanged, with the same signature (`reward_funcs` may be omitted when
    an `environment_factory` owns the rewards). With `beta = 0` the trainer is stock TRL; otherwise the KL term of the
    loss is computed here (identical to TRL's for method `"none"`, estimator `"k3"`) and the `adaptive_kl/*` metrics
    are logged through `Trainer.log`.

    Args:
        diversity_embedder (`Callable[[list[str]], torch.Tensor]`, *optional*, keyword only):
            Embeds completions for `diversity/embedding_similarity` (with `diversity_metrics=True`); takes precedence
            over the config's `diversity_embedder`, which names one (`"hashed"`: `HashedNgramEmbedder()`).

    Attributes:
        beta_controller (`BetaController`): owns β; saved in every checkpoint and restored on resume.
        reference_resets (`ReferenceResets`): when the reference is reset; saved in every checkpoint too.
    """

    def __init__(self, model, reward_funcs=None, args=None, *more, diversity_embedder=None, **kwargs):
        args = resolve_args(GRPOTrainer, AdaptiveKLGRPOConfig, model, args, "AdaptiveKLGRPOTrainer", "GRPO")
        check_host(GRPOTrainer, args, "AdaptiveKLGRPOTrainer", own_loss=args.beta > 0)
        check_train_dataset(
            train_dataset_argument(more, kwargs), environment=kwargs.get("environment_factory") is not None
        )
        self._unsloth_module = prepare_unsloth_host(GRPOTrainer, args.kl_placement, args.kl_mask_zero_std_groups)
        on_unsloth = self._unsloth_module is not None
        loads_no_reference = reference_never_scored(args, model, kwargs.get("peft_config"), on_unsloth)
        with host_built_without_reference(self, args) if loads_no_reference else nullcontext():
            super().__init__(model, reward_funcs, args, *more, **kwargs)
        check_host_attributes(self)
        if diversity_embedder is None and args.diversity_metrics:
            diversity_embedder = build_embedder(args.diversity_embedder)
        self.diversity_embedder = diversity_embedder
        self._build_kl_state(args, loads_no_reference)

    __init__.__signature__ = with_keyword_only(
        inspect.signature(GRPOTrainer.__init__),
        [inspect.Parameter("diversity_embedder", inspect.Parameter.KEYWORD_ONLY, default=None)],
    )

    kl_in_reward = property(lambda self: self.args.kl_placement == "reward")

    # --- the host's extension points (`hooks.HostHooks`) -------------------------------------------------------------

    def _on_scored(self, batch: ScoredBatch) -> None:
        rewards = self.rollouts.total_rewards(batch.rewards_per_func, batch.mode)
        keep = None
        if self.args.kl_mask_zero_std_groups:
            keep = self.rollouts.kl_group_mask(batch.output, rewards, batch.mode)
        if self.kl_in_reward:
            penalty = self._kl_penalty(batch) if batch.ref_logps is not None else None
            if penalty is not None and keep is not None:  # decided on the task rewards: those groups keep 0 advantages
                penalty = torch.where(keep, penalty, torch.zeros_like(penalty))
            self.rollouts.penalize(batch.output, rewards, penalty, batch.mode)
        if self.args.diversity_metrics:
            self.rollouts.log_diversity(batch.output, batch.mode)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.args.diversity_metrics:
            metrics = metric_store(self, "train" if self.model.training else "eval")
            if metrics.get("entropy"):
                metrics["diversity/entropy"] = list(metrics["entropy"])  # TRL's, on the panel
        super().log(logs, start_time)

    # --- the KL term -------------------------------------------------------------------------------------------------

    def _loss_and_kl_statistics(self, model, inputs, return_outputs, num_items_in_batch, mode, beta):
        backend_capture = capturing_efficient_grpo if self._unsloth_module is not None else None
        with self.host_loss_without_kl(backend_capture) as captured:
            loss = self.host_compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if "ref_per_token_logps" not in inputs:  # `_scores_reference`: β_t = 0, the term adds exactly 0
            return loss, None
        host_inputs = self._host_kl_inputs(
            captured, inputs, mode, training=torch.is_grad_enabled() and mode == "train"
        )
        if self.kl_in_reward:
            # The KL is in the advantages: measured here, without a graph, for the metrics and controllers only.
            with torch.no_grad():
                _, stats = self._adapted_kl_term({**host_inputs, "use_bias_correction": False})
            return loss, stats
        kl_term, stats = self._adapted_kl_term(host_inputs)
        return loss + beta * kl_term, stats  # Unsloth's backward ignores its incoming gradient: add, never scale

    def _host_kl_inputs(self, captured: dict, inputs: dict, mode: str, training: bool) -> dict:
        """The log-probabilities, mask and aggregation of the host's loss that the KL term must share."""
        if self._unsloth_module is not None:
            if "efficient_grpo" not in captured:
                raise unsupported_unsloth("its GRPO loss no longer calls UnslothEfficientGRPO.apply")
            kl_inputs = unsloth_kl_term_inputs(captured["efficient_grpo"])
            check_carries_gradient(kl_inputs["per_token_logps"], training, "Unsloth's policy log-probabilities")
            return kl_inputs
        per_token_logps = self.captured_policy_logps(captured, training)
        settings = host_loss_settings(self, mode)
        token_normalizer = None
        if settings.loss_type in TOKEN_SUM_LOSS_TYPES:
            token_normalizer = token_sum_normalizer(
                inputs["num_items_in_batch"],
                self.accelerator.num_processes,
                settings.accumulation_steps,
                self.args.steps_per_generation if mode == "train" else None,
            )
        return dict(
            per_token_logps=per_token_logps,
            ref_per_token_logps=inputs["ref_per_token_logps"],
            mask=completion_loss_mask(inputs).to(per_token_logps.dtype),
            old_per_token_logps=inputs.get("old_per_token_logps"),
            loss_type=settings.loss_type,
            accumulation_steps=settings.accumulation_steps,
            max_completion_length=settings.max_completion_length,
            token_normalizer=token_normalizer,
            use_bias_correction=self.args.use_bias_correction_kl,
            importance_sampling_level=settings.importance_sampling_level,
            # `_on_scored` put it in every scored batch: numerator rows only, the normalizers are the host's
            sequence_mask=inputs["kl_group_mask"] if self.args.kl_mask_zero_std_groups else None,
        )

    def _adapted_kl_term(self, host_inputs: dict):
        """Agg(f(k)) for one micro-batch, with the host's normalizers, and its statistics summed over processes."""
        term, stats = adapted_kl_term(**host_inputs, **self.kl_options())
        return term, self.accelerator.reduce(stats, reduction="sum")

    def _kl_penalty(self, batch: ScoredBatch) -> torch.Tensor:
        """KL in the reward: the `(B,)` detached penalties β_t·Σ_t f(k) of the generation batch's sequences, with the
        β of the first optimizer step it serves."""
        policy_logps = batch.policy_logps
        if policy_logps is None:  # on-policy: TRL did not score the sampling policy
            policy_logps = self.rollouts.sampling_policy_logps(batch.output, batch.mode)
        beta = self.generation_batches[batch.mode].beta
        return sequence_kl_penalty(policy_logps, batch.ref_logps, batch.mask, beta=beta, **self.kl_options())
