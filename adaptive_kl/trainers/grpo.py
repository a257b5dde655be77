"""`AdaptiveKLGRPOTrainer`: `trl.GRPOTrainer` with an adaptive KL term.

Where the KL fields choose β_t only (every field at its default, a schedule, `dynamic`, a target-KL controller), the
host computes its own loss, KL term included, at β_t, bit for bit as stock TRL does at that β (`host_kl_term`), and
this class only measures the term for `adaptive_kl/*` and the controllers. Otherwise the host computes its loss with
β = 0 (the policy term, untouched), and this class adds `β_t · Agg(f(k))` computed from the log-probabilities the
host already computed for that loss: no copy of the host's loss, no extra forward pass. The KL term's path:
`compute_loss` (`lifecycle.AdaptiveKLRun`) → `_loss_and_kl_sums` → `hooks.HostHooks.host_loss_scoring` (what the
host's loss scored) → `_host_kl_inputs` (its aggregation, `hooks.host_loss_settings`) →
`kl.term.kl_term_and_estimates`. With `kl_placement="reward"` the KL is instead a penalty on each completion's
reward (`_score_kl`), and the loss only measures it.

The host is whatever `trl.GRPOTrainer` is when this module is first imported: TRL's own, or, after `import unsloth`,
Unsloth's generated trainer, whose loss is reached through `adaptive_kl.trainers.unsloth`. Everything taken from the
host goes through `adaptive_kl.trainers.hooks`; what both trainers do is `lifecycle.AdaptiveKLRun`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from ..kl.aggregation import TOKEN_SUM_LOSS_TYPES, token_sum_normalizer
from ..kl.groups import zero_std_groups
from ..kl.placement import group_advantages
from ..kl.term import kl_term_and_estimates, measured_sequence_sums
from ..metrics.diversity import diversity_metrics
from .config import AdaptiveKLGRPOConfig
from .embedding import build_embedder
from .hooks import (
    MULTIMODAL_INPUTS,
    HostHooks,
    HostScoring,
    check_carries_gradient,
    check_host,
    completion_loss_mask,
    grpo_scale_rewards,
    host_loss_settings,
    host_models,
    host_rewards,
    metric_store,
    score_policy,
)
from .inputs import check_train_dataset, train_dataset_argument
from .lifecycle import AdaptiveKLRun, ScoredBatch, local_rows
from .monitoring import PendingSums
from .unsloth import (
    UNSLOTH_LOG_RATIO_CLAMP,
    capturing_efficient_grpo,
    prepare_unsloth_host,
    unsloth_kl_term_inputs,
    unsupported_unsloth,
    with_keyword_only,
)


class AdaptiveKLGRPOTrainer(AdaptiveKLRun, HostHooks, GRPOTrainer, hub_tag="adaptive-kl"):
    """Drop-in replacement for [`~trl.GRPOTrainer`] that takes an [`AdaptiveKLGRPOConfig`].

    Every argument is passed to `GRPOTrainer` unchanged, with the same signature (`reward_funcs` may be omitted when
    an `environment_factory` owns the rewards). With `beta = 0` the trainer is stock TRL. Where the KL fields choose
    β_t only, TRL's loss computes its own KL term at β_t; otherwise the term is computed here (identical to TRL's where
    it reduces to it). The `adaptive_kl/*` metrics are logged through `Trainer.log`.

    Args:
        diversity_embedder (`Callable[[list[str]], torch.Tensor]`, *optional*, keyword only):
            Embeds completions for `diversity/embedding_similarity` (with `diversity_metrics=True`); takes precedence
            over the config's `diversity_embedder`, which names one (`"hashed"`: `HashedNgramEmbedder()`).

    Attributes:
        beta_controller (`BetaController`): owns β; saved in every checkpoint and restored on resume.
        reference_resets (`ReferenceResets`): when the reference is reset; saved in every checkpoint too.
        host_kl_term (`bool`): the host's loss keeps its own KL term, at β_t (the config's `kl_term_is_trls`, not on
            Unsloth); the package only measures it for `adaptive_kl/*` and the controllers.
    """

    host_class, host_family, config_class = GRPOTrainer, "grpo", AdaptiveKLGRPOConfig

    def __init__(self, model, reward_funcs=None, args=None, *more, diversity_embedder=None, **kwargs):
        super().__init__(model, reward_funcs, args, *more, **kwargs)
        if diversity_embedder is None and self.args.diversity_metrics:
            diversity_embedder = build_embedder(self.args.diversity_embedder)
        self.diversity_embedder = diversity_embedder

    __init__.__signature__ = with_keyword_only(
        inspect.signature(GRPOTrainer.__init__),
        [inspect.Parameter("diversity_embedder", inspect.Parameter.KEYWORD_ONLY, default=None)],
    )

    def _prepare_host(self, args, more: tuple, kwargs: dict) -> None:
        check_host(GRPOTrainer, "grpo", args, "AdaptiveKLGRPOTrainer", own_loss=args.beta > 0)
        check_train_dataset(
            train_dataset_argument(more, kwargs), environment=kwargs.get("environment_factory") is not None
        )
        self._unsloth_module = prepare_unsloth_host(GRPOTrainer, args.kl_placement, args.kl_mask_zero_std_groups)
        if self._unsloth_module is not None:
            self.host_log_ratio_clip = UNSLOTH_LOG_RATIO_CLAMP
        # Nothing of the config changes the form of the host's KL term (k3 in the loss, no transform, no mask, no
        # clamp), only its β_t: the host keeps it, at β_t, so the loss, its gradients and every value TRL logs are
        # stock TRL's at that β, bit for bit. Not on Unsloth, whose fused loss computes its KL where this class cannot
        # measure it, and compiles its β as a constant (`trainers.unsloth`).
        self.host_kl_term = args.kl_term_is_trls and self._unsloth_module is None

    @property
    def kl_in_reward(self) -> bool:
        return self.args.kl_placement == "reward"

    @property
    def logs_host_kl(self) -> bool:
        """Whether this trainer logs TRL's `kl` itself: when the host's loss runs with β = 0 (and logs no `kl`)."""
        return not self.host_kl_term

    # --- a scored generation batch -----------------------------------------------------------------------------------

    def _score_kl(self, scoring: HostScoring, batch: ScoredBatch) -> ScoredBatch:
        output, mode = scoring.output, scoring.mode
        keep = self._kl_group_mask(output, batch.rewards, mode) if self.args.kl_mask_zero_std_groups else None
        if self.kl_in_reward:
            batch = self._penalize_rewards(output, batch, keep, mode)
        if self.args.diversity_metrics:
            self._log_diversity(output, mode)
        return batch

    def _penalize_rewards(self, output: dict, batch: ScoredBatch, keep: torch.Tensor | None, mode: str) -> ScoredBatch:
        """`kl_placement="reward"`: the advantages of `output` become those of the rewards minus β_t·Σ_t f(k), each
        group's as TRL computes them; the completions of a group `keep` masks (`(B,)`, or None) get no penalty, so that
        they keep their zero advantages. Returns `batch` with its `(N,)` penalties."""
        # TRL's GRPO keeps the log-probabilities it scored in its output: the sampling policy's when it needs them
        # (off-policy), the reference's when its β is not 0 and the reference was scored.
        mask = completion_loss_mask(output)
        ref_logps = output.get("ref_per_token_logps")
        policy_logps = output.get("old_per_token_logps")
        if policy_logps is None and ref_logps is not None:  # on-policy: TRL did not score the sampling policy
            policy_logps = self._sampling_policy_logps(output, mode)
        # Without log-probabilities (scored without the reference, on-policy), those TRL would have scored are in the
        # output embedding's dtype or float32, which the penalty's dtype does not tell apart (`penalty_dtype`)
        embedding = host_models(self).policy.get_output_embeddings().weight
        logps_dtype = policy_logps.dtype if policy_logps is not None else embedding.dtype
        penalty = self._kl_penalty(policy_logps, ref_logps, mask, batch.beta, logps_dtype)
        if keep is not None:  # decided on the task rewards: those groups keep 0 advantages
            penalty = torch.where(keep, penalty, torch.zeros_like(penalty))
        group_size, scaling = host_rewards(self, mode).group_size, grpo_scale_rewards(self)
        penalties, _ = self._penalize(
            output, batch.rewards, penalty, mode, lambda rewards: group_advantages(rewards, group_size, scaling)
        )
        return dataclasses.replace(batch, penalty=penalties)

    def _sampling_policy_logps(self, output: dict, mode: str) -> torch.Tensor:
        """`(B, T)` log π at the sampled tokens under the policy that sampled them, by one no-grad forward of the
        policy (on-policy, `num_iterations == 1`: TRL skips it, and the policy has not changed since it sampled)."""
        args = self.args
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        batch_size = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
        multimodal = {key: output[key] for key in MULTIMODAL_INPUTS if key in output}
        with torch.no_grad():
            return score_policy(
                self, self.model, input_ids, attention_mask, output["completion_ids"].size(1), batch_size, **multimodal
            )

    def _kl_group_mask(self, output: dict, rewards: torch.Tensor, mode: str) -> torch.Tensor:
        """`kl_mask_zero_std_groups`: the `(B,)` bool mask of this process's completions whose KL counts, False for
        those of a group whose total `rewards` (`(N,)`, every process's) all agree. It is decided here, per group of
        the whole generation batch, and put in `output["kl_group_mask"]`: a tensor of first dimension B, it follows
        each completion through TRL's shuffle and split into micro-batches. Logs the fraction of completions masked."""
        masked = zero_std_groups(rewards, host_rewards(self, mode).group_size)  # (N,): groups may span processes
        rows = len(output["completion_ids"])
        keep = ~local_rows(masked, rows, self.accelerator.process_index).to(output["completion_ids"].device)
        output["kl_group_mask"] = keep
        metric_store(self, mode)["adaptive_kl/kl_masked_fraction"].append(masked.double().mean().item())
        return keep

    def _log_diversity(self, output: dict, mode: str) -> None:
        """`diversity/*` of the generation batch, over every process's completions (groups may span processes)."""
        tokenizer = self.processing_class
        pad = tokenizer.pad_token_id if hasattr(tokenizer, "pad_token_id") else None
        ids = []
        for row, mask in zip(output["completion_ids"], output["completion_mask"].bool()):
            if not mask.any() and pad is not None:  # masked whole by mask_truncated_completions: the tokens, unpadded
                mask = row != pad
            ids.append(row[mask].tolist())
        ids = gather_object(ids)
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        group_size = host_rewards(self, mode).group_size
        metrics = diversity_metrics(ids, texts, group_size, embedder=self.diversity_embedder)
        for name, value in metrics.items():
            metric_store(self, mode)[name].append(value)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        metrics = metric_store(self, mode)
        self.kl_monitor.write_policy_loss_terms(metrics, mode, self.accelerator.gather)
        if self.args.diversity_metrics and metrics.get("entropy"):
            metrics["diversity/entropy"] = list(metrics["entropy"])  # TRL's, on the panel
        super().log(logs, start_time)

    # --- the KL term -------------------------------------------------------------------------------------------------

    def _loss_and_kl_sums(self, model, inputs, return_outputs, num_items_in_batch, mode, beta):
        backend_capture = capturing_efficient_grpo if self._unsloth_module is not None else None
        policy_losses = metric_store(self, mode).get("policy_loss")  # TRL's, with its entropy bonus on
        logged = len(policy_losses) if policy_losses is not None else 0
        with self.host_loss_scoring(backend_capture, beta=beta if self.host_kl_term else 0.0) as captured:
            loss = self.host_compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if "ref_per_token_logps" not in inputs:  # `_scores_reference`: β_t = 0, the term adds exactly 0
            return loss, None
        training = torch.is_grad_enabled() and mode == "train"
        if self.host_kl_term:  # the host's own term, at β_t, is in the loss: the KL is measured for the metrics
            pending = self._pending_kl_sums(captured, inputs, mode, training)
            return loss, pending.sums() if self.reads_step_kl else pending
        host_inputs = self._host_kl_inputs(captured, inputs, mode, training, aggregated=not self.kl_in_reward)
        if self.kl_in_reward:
            # The KL is in the advantages: measured here, without a graph, for the metrics and controllers only (in
            # the reward, without the loss's importance ratio)
            host_inputs["use_bias_correction"] = False
            with torch.no_grad():
                _, sums = self._adapted_kl_term(host_inputs, with_term=False)
            return loss, sums
        kl_term, sums = self._adapted_kl_term(host_inputs)
        weighted = beta * kl_term
        policy_losses = metric_store(self, mode).get("policy_loss")
        if policy_losses is not None and len(policy_losses) > logged:
            # TRL's `policy_loss` is its loss before the entropy bonus, KL term included; the host's ran without it
            self.kl_monitor.record_policy_loss_term(mode, len(policy_losses) - 1, weighted.detach())
        return loss + weighted, sums  # Unsloth's backward ignores its incoming gradient: add, never scale

    def _adapted_kl_term(
        self, host_inputs: dict, with_term: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | PendingSums]:
        """Agg(f(k)) of one micro-batch from the host's inputs (`_host_kl_inputs`) and the config's estimate and
        transform (`None` without `with_term`), and the per-sequence sums of its statistics: `(5, B)` where a step
        reads them, else `PendingSums`, made at the log line."""
        term, estimates = kl_term_and_estimates(**host_inputs, **self.kl_options, with_term=with_term)
        if self.reads_step_kl:
            return term, estimates.sequence_sums()
        return term, PendingSums.of_estimates(estimates)

    def _pending_kl_sums(self, captured: dict, inputs: dict, mode: str, training: bool) -> PendingSums:
        """The KL of the host's own term, to be measured (`kl.term.measured_sequence_sums`): what `_host_kl_inputs`
        would give the term, less the aggregation. A step that reads it measures it at once, else the log line."""
        tensors = dict(
            per_token_logps=self.captured_policy_logps(captured, training).detach(),
            ref_per_token_logps=inputs["ref_per_token_logps"],
            mask=completion_loss_mask(inputs),
        )
        if self.args.use_bias_correction_kl and inputs.get("old_per_token_logps") is not None:
            tensors["old_per_token_logps"] = inputs["old_per_token_logps"]  # on-policy, the ratio is exactly 1
        level = host_loss_settings(self, mode).importance_sampling_level  # read per micro-batch, as the host does
        settings = (*self._kl_transform_settings, ("importance_sampling_level", level))
        return PendingSums(measured_sequence_sums, tensors, settings)

    @functools.cached_property
    def _kl_transform_settings(self) -> tuple:
        return (*self.kl_transform_options.items(), ("use_bias_correction", self.args.use_bias_correction_kl))

    def _host_kl_inputs(
        self, captured: dict, inputs: dict, mode: str, training: bool, aggregated: bool = True
    ) -> dict:
        """The log-probabilities, mask and aggregation of the host's loss that the KL term must share (`aggregated`
        False: the term is not aggregated, so TRL's token normalizer is not computed)."""
        if self._unsloth_module is not None:
            if "efficient_grpo" not in captured:
                raise unsupported_unsloth("its GRPO loss no longer calls UnslothEfficientGRPO.apply")
            kl_inputs = unsloth_kl_term_inputs(captured["efficient_grpo"])
            check_carries_gradient(kl_inputs["per_token_logps"], training, "Unsloth's policy log-probabilities")
            if self.args.kl_log_ratio_clip is not None:  # the user's clamp, in place of Unsloth's
                kl_inputs["importance_log_ratio_clip"] = self.args.kl_log_ratio_clip
            return kl_inputs
        per_token_logps = self.captured_policy_logps(captured, training)
        settings = host_loss_settings(self, mode)
        token_normalizer = None
        if aggregated and settings.loss_type in TOKEN_SUM_LOSS_TYPES:
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
            importance_log_ratio_clip=self.args.kl_log_ratio_clip,
            # `_score_kl` put it in every scored batch: numerator rows only, the normalizers are the host's
            sequence_mask=inputs["kl_group_mask"] if self.args.kl_mask_zero_std_groups else None,
        )
