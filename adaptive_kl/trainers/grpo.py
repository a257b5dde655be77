"""`AdaptiveKLGRPOTrainer`: `trl.GRPOTrainer` with an adaptive KL term.

Where the KL fields choose β_t only (every field at its default, a schedule, `dynamic`, a target-KL controller), the
host computes its own loss, KL term included, at β_t, bit for bit as stock TRL does at that β (`host_kl_term`), and
this class only measures the term. Otherwise the host computes its loss with β = 0 (the policy term, untouched), and
this class adds `β_t · Agg(f(k))` computed from the log-probabilities the host already computed for that loss
(`kl.term.kl_term_and_sequence_sums`): no copy of the host's loss, no extra forward pass; TRL's `kl` and
`policy_loss` are logged as TRL would have. With `kl_placement="reward"` the KL is instead a penalty on each
completion's reward (`_score_kl`), and the loss only measures it. A micro-batch reads top to bottom in
`_loss_and_kl_sums`; what both trainers do around it is `lifecycle.AdaptiveKLRun`'s.

The host is whatever `trl.GRPOTrainer` is when this module is first imported: TRL's own, or, after `import unsloth`,
Unsloth's generated trainer, whose loss is reached through `adaptive_kl.trainers.unsloth`.
"""

from __future__ import annotations

import inspect

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from ..kl.aggregation import TOKEN_SUM_LOSS_TYPES, token_sum_normalizer
from ..kl.groups import zero_std_groups
from ..kl.metrics import STAT_INDEX
from ..kl.placement import group_advantages
from ..kl.term import kl_term_and_sequence_sums
from ..metrics.diversity import diversity_metrics
from .config import AdaptiveKLGRPOConfig
from .embedding import HASHED, SentenceTransformerEmbedder
from .hooks import (
    MULTIMODAL_INPUTS,
    HostHooks,
    HostScoring,
    accumulation_steps,
    check_carries_gradient,
    check_host,
    completion_loss_mask,
    one_pass_log,
)
from .inputs import check_train_dataset
from .lifecycle import AdaptiveKLRun, ScoredBatch
from .unsloth import (
    UNSLOTH_LOG_RATIO_CLAMP,
    capturing_efficient_grpo,
    prepare_unsloth_host,
    unsloth_kl_term_inputs,
    unsupported_unsloth,
    with_keyword_only,
)


# The rows of `kl.metrics.kl_sequence_sums` that TRL's `kl` reads
TOKENS, HOST_KL = STAT_INDEX["tokens"], STAT_INDEX["host_kl"]


def policy_loss_with_term(logged: float, share: torch.Tensor, host_loss: torch.Tensor, gather) -> float:
    """TRL's `policy_loss` of a micro-batch whose host loss ran without the KL term, with the term: `logged` is the
    host's (its policy loss averaged over the processes by `gather` and `nanmean`, a process whose loss is NaN left
    out), `share` this process's term as TRL's loss carries it; the term is averaged over the processes that TRL's
    mean counts, as TRL averages its loss, term included: the share of a process whose `host_loss` (the host's
    returned loss) is NaN is left out too. That loss is NaN where its policy loss is; it differs from TRL's choice
    only where the entropy bonus or the auxiliary loss alone is NaN, or the term alone on one process."""
    share = torch.where(torch.isnan(host_loss.detach()), torch.nan, share.detach())
    return logged + gather(share).nanmean().item()


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
        logs_host_kl (`bool`): the host's loss runs without its KL term, so this trainer logs TRL's `kl` itself.
    """

    host_class, host_family, config_class = GRPOTrainer, "grpo", AdaptiveKLGRPOConfig

    def __init__(self, model, reward_funcs=None, args=None, *more, diversity_embedder=None, **kwargs):
        super().__init__(model, reward_funcs, args, *more, **kwargs)
        name = self.args.diversity_embedder  # for `"hashed"`, None: the diversity metrics' own default
        if diversity_embedder is None and self.args.diversity_metrics and name != HASHED:
            diversity_embedder = SentenceTransformerEmbedder(name)
        self.diversity_embedder = diversity_embedder

    __init__.__signature__ = with_keyword_only(
        inspect.signature(GRPOTrainer.__init__),
        [inspect.Parameter("diversity_embedder", inspect.Parameter.KEYWORD_ONLY, default=None)],
    )

    def _prepare_host(self, args, more: tuple, kwargs: dict) -> None:
        check_host(GRPOTrainer, "grpo", args, "AdaptiveKLGRPOTrainer", own_loss=args.beta > 0)
        train_dataset = more[0] if more else kwargs.get("train_dataset")  # GRPOTrainer's argument after `args`
        check_train_dataset(train_dataset, environment=kwargs.get("environment_factory") is not None)
        self._unsloth_module = prepare_unsloth_host(GRPOTrainer, args.kl_placement, args.kl_mask_zero_std_groups)
        if self._unsloth_module is not None:
            self.host_log_ratio_clip = UNSLOTH_LOG_RATIO_CLAMP
        self.kl_in_reward = args.kl_placement == "reward"
        self.kl_mask_zero_std_groups = args.kl_mask_zero_std_groups
        # The config changes only the host KL term's β_t, not its form: the host keeps it, so the loss, its gradients
        # and every value TRL logs are stock TRL's at that β, bit for bit. Not on Unsloth, whose fused loss computes
        # its KL where this class cannot measure it, and compiles its β as a constant (`trainers.unsloth`).
        self.host_kl_term = args.kl_term_is_trls and self._unsloth_module is None
        self.logs_host_kl = not self.host_kl_term

    # --- a scored generation batch -----------------------------------------------------------------------------------

    def _on_scored(self, scoring: HostScoring) -> None:
        super()._on_scored(scoring)
        if not self.args.diversity_metrics:
            return
        # `diversity/*` of the generation batch, over every process's completions (groups may span processes)
        output, mode = scoring.output, scoring.mode
        tokenizer = self.processing_class
        pad = tokenizer.pad_token_id if hasattr(tokenizer, "pad_token_id") else None
        ids = []
        for row, mask in zip(output["completion_ids"], output["completion_mask"].bool()):
            if not mask.any() and pad is not None:  # masked whole by mask_truncated_completions: the tokens, unpadded
                mask = row != pad
            ids.append(row[mask].tolist())
        ids = gather_object(ids)
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        metrics = diversity_metrics(ids, texts, group_size, embedder=self.diversity_embedder)
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)

    def _score_kl(self, scoring: HostScoring, batch: ScoredBatch) -> None:
        output, mode = scoring.output, scoring.mode
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        keep = None
        if self.kl_mask_zero_std_groups:
            # Decided per group of the whole generation batch (groups may span processes), then put in the output:
            # a tensor of first dimension B follows each completion through TRL's shuffle and split into micro-batches
            masked = zero_std_groups(batch.rewards, group_size)  # (N,)
            rows = len(output["completion_ids"])
            start = self.accelerator.process_index * rows
            keep = output["kl_group_mask"] = ~masked[start : start + rows].to(output["completion_ids"].device)
            self._metrics[mode]["adaptive_kl/kl_masked_fraction"].append(masked.double().mean().item())
        if not self.kl_in_reward:
            return
        # The advantages become those of the rewards minus β_t·Σ_t f(k), each group's as TRL computes them. TRL keeps
        # the log-probabilities it scored in its output: the sampling policy's when it needs them (off-policy), the
        # reference's when its β is not 0 and the reference was scored.
        mask = completion_loss_mask(output)
        ref_logps, policy_logps = output.get("ref_per_token_logps"), output.get("old_per_token_logps")
        if policy_logps is None and ref_logps is not None:
            # On-policy, TRL skips the sampling policy's scoring: one no-grad forward of the policy, which has not
            # changed since it sampled
            input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
            args = self.args
            rows_per_forward = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
            multimodal = {key: output[key] for key in MULTIMODAL_INPUTS if key in output}
            with torch.no_grad():
                policy_logps = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, output["completion_ids"].size(1), rows_per_forward,
                    **multimodal,
                )[0]  # fmt: skip
        # Without log-probabilities (scored without the reference, on-policy), those TRL would have scored are in the
        # output embedding's dtype, which the zero penalty's dtype follows
        embedding = self.accelerator.unwrap_model(self.model).get_output_embeddings().weight
        logps_dtype = policy_logps.dtype if policy_logps is not None else embedding.dtype
        penalty = self._kl_penalty(policy_logps, ref_logps, mask, batch.beta, logps_dtype)
        if keep is not None:  # decided on the task rewards: those groups keep 0 advantages
            penalty = torch.where(keep, penalty, torch.zeros_like(penalty))
        scale = self.scale_rewards
        self._penalize(scoring, batch.rewards, penalty, lambda reward: group_advantages(reward, group_size, scale))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        metrics = self._metrics["train" if self.model.training else "eval"]
        if self.args.diversity_metrics and metrics.get("entropy"):
            metrics["diversity/entropy"] = list(metrics["entropy"])  # TRL's, on the panel
        super().log(logs, start_time)

    # --- the KL term -------------------------------------------------------------------------------------------------

    def _loss_and_kl_sums(self, model, inputs, return_outputs, num_items_in_batch, mode, beta):
        backend_capture = capturing_efficient_grpo if self._unsloth_module is not None else None
        # Where the host's loss runs without its KL term, TRL's `kl` and `policy_loss` of the micro-batch are written
        # here, once, as TRL writes them with its term (`one_pass_log`)
        metrics = self._metrics[mode]
        logged_here = {"kl": metrics, "policy_loss": metrics} if self.logs_host_kl else {}
        with one_pass_log(logged_here) as log:
            with self.host_loss_scoring(backend_capture, beta=beta if self.host_kl_term else 0.0) as captured:
                loss = super(AdaptiveKLRun, self).compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if "ref_per_token_logps" not in inputs:  # scored without the reference: β_t = 0, the term adds exactly 0
                return loss, None
            training = torch.is_grad_enabled() and mode == "train"
            if self.host_kl_term:  # the host's own term, at β_t, is in the loss and its logs: the KL is only measured
                policy_logps = self.captured_policy_logps(captured, training).detach()
                old_logps = inputs.get("old_per_token_logps")  # None on-policy, where the bias correction's ratio is 1
                _, sums = kl_term_and_sequence_sums(
                    policy_logps, inputs["ref_per_token_logps"], completion_loss_mask(inputs).to(policy_logps.dtype),
                    **self.kl_transform_options, old_per_token_logps=old_logps,
                    use_bias_correction=self.args.use_bias_correction_kl and old_logps is not None,
                    importance_sampling_level=self.importance_sampling_level, with_term=False,
                )  # fmt: skip
                return loss, sums
            host_inputs = self._host_kl_inputs(captured, inputs, mode, training)
            if self.kl_in_reward:  # the KL is in the advantages: measured, without a graph (and without the ratio)
                with torch.no_grad():
                    _, sums = kl_term_and_sequence_sums(
                        **{**host_inputs, "use_bias_correction": False}, **self.kl_options, with_term=False
                    )
            else:
                kl_term, sums = kl_term_and_sequence_sums(**host_inputs, **self.kl_options)
                weighted = beta * kl_term
                logged = log.host("policy_loss")
                if logged:  # TRL logs it with its entropy bonus on
                    # TRL's `policy_loss` is its loss before the bonus, KL term included, and before its division by
                    # the accumulation steps (after it for the token-sum types, whose normalizer holds them)
                    token_sum = host_inputs["loss_type"] in TOKEN_SUM_LOSS_TYPES
                    share = weighted * (1.0 if token_sum else host_inputs["accumulation_steps"])
                    (host_mean,) = logged  # one entry a micro-batch
                    log.write("policy_loss", [policy_loss_with_term(host_mean, share, loss, self.accelerator.gather)])
                loss = loss + weighted  # Unsloth's backward ignores its incoming gradient: add, never scale
            # TRL's `kl` of this micro-batch, as its loss logs it: the token mean of its k3 (bias-corrected like the
            # loss), over every process. A host that logged one with β = 0 (Unsloth's logs 0) has it replaced.
            tokens, host_kl = self.sum_over_processes(sums[[TOKENS, HOST_KL]].sum(-1)).tolist()
            log.write("kl", [host_kl / max(tokens, 1.0)])
            return loss, sums

    def _host_kl_inputs(self, captured: dict, inputs: dict, mode: str, training: bool) -> dict:
        """The log-probabilities, mask and aggregation of the host's loss that the KL term shares, read per
        micro-batch, as the host reads them."""
        if self._unsloth_module is not None:
            if "efficient_grpo" not in captured:
                raise unsupported_unsloth("its GRPO loss no longer calls UnslothEfficientGRPO.apply")
            kl_inputs = unsloth_kl_term_inputs(captured["efficient_grpo"])
            check_carries_gradient(kl_inputs["per_token_logps"], training, "Unsloth's policy log-probabilities")
            if self.args.kl_log_ratio_clip is not None:  # the user's clamp, in place of Unsloth's
                kl_inputs["importance_log_ratio_clip"] = self.args.kl_log_ratio_clip
            return kl_inputs
        per_token_logps = self.captured_policy_logps(captured, training)
        steps = accumulation_steps(self) if mode == "train" else 1.0  # TRL does not accumulate in evaluation
        token_normalizer = None
        if self.loss_type in TOKEN_SUM_LOSS_TYPES and not self.kl_in_reward:
            token_normalizer = token_sum_normalizer(
                inputs["num_items_in_batch"],
                self.accelerator.num_processes,
                steps,
                self.args.steps_per_generation if mode == "train" else None,
            )
        return dict(
            per_token_logps=per_token_logps,
            ref_per_token_logps=inputs["ref_per_token_logps"],
            mask=completion_loss_mask(inputs).to(per_token_logps.dtype),
            old_per_token_logps=inputs.get("old_per_token_logps"),
            loss_type=self.loss_type,
            accumulation_steps=steps,
            max_completion_length=self.max_completion_length,
            token_normalizer=token_normalizer,
            use_bias_correction=self.args.use_bias_correction_kl,
            importance_sampling_level=self.importance_sampling_level,
            importance_log_ratio_clip=self.args.kl_log_ratio_clip,
            # `_score_kl` put it in every scored batch: numerator rows only, the normalizers are the host's
            sequence_mask=inputs["kl_group_mask"] if self.kl_mask_zero_std_groups else None,
        )
