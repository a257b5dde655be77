"""`AdaptiveKLGRPOTrainer`: `trl.GRPOTrainer` with an adaptive KL term.

The host computes its own loss with β = 0 (the policy term, untouched), and this class adds
`β_t · Agg(f(k))` computed from the log-probabilities the host already computed for that loss: no copy of the
host's loss, no extra forward pass. The reference model is loaded as usual because `args.beta > 0`.

The host is whatever `trl.GRPOTrainer` is when this module is first imported: TRL's own, or, after `import unsloth`,
Unsloth's generated trainer, whose loss is reached through `adaptive_kl.trainers.unsloth`. Everything taken from the
host goes through `adaptive_kl.trainers.hooks` (its table `HOST_INTERNALS`): this class overrides no private method of
the host, only the extension points of `hooks.HostHooks`.
"""

from __future__ import annotations

import gc
import inspect
import warnings
from contextlib import nullcontext

import peft
import torch
from accelerate.utils import gather_object
from packaging.version import Version
from peft import PeftModel
from transformers.utils import logging
from trl import GRPOTrainer

from ..kl.aggregation import TOKEN_SUM_LOSS_TYPES, token_sum_normalizer
from ..kl.controller import BetaController
from ..kl.metrics import STAT_INDEX, kl_metrics
from ..kl.placement import group_advantages, sequence_kl_penalty, total_rewards
from ..kl.term import adapted_kl_term
from ..metrics.diversity import diversity_metrics
from .config import AdaptiveKLGRPOConfig
from .embedding import build_embedder
from .hooks import (
    MULTIMODAL_INPUTS,
    HostHooks,
    check_carries_gradient,
    check_host,
    check_host_attributes,
    completion_loss_mask,
    host_beta,
    host_built_without_reference,
    metric_store,
    release_reference_model,
    replace_logged_advantages,
    resolve_args,
    score_policy,
)
from .inputs import check_train_dataset, train_dataset_argument
from .reference import (
    REFERENCE_ADAPTER,
    ReferenceResets,
    add_reference_adapter,
    copy_policy_to_reference,
    load_reference,
    restore_trained_adapter,
    save_reference,
)
from .state import (
    AdaptiveKLStateCallback,
    missing_kl_state_message,
    read_checkpoint_kl_state,
    resolve_checkpoint,
    resumes_past_the_switch,
)
from .unsloth import (
    install_capture_shim,
    unsloth_host_module,
    unsloth_kl_term_inputs,
    unsupported_unsloth,
    with_keyword_only,
)


logger = logging.get_logger(__name__)


def reference_unread_at_zero_beta(args) -> bool:
    """Whether nothing but the KL term reads the reference while β is 0 for good: no KL monitoring
    (`kl_monitor_steps=0`), no reference resets, no `sync_ref_model`."""
    return (
        args.kl_monitor_steps == 0 and args.ref_reset_steps == 0 and args.ref_reset_kl == 0 and not args.sync_ref_model
    )


def reference_is_base_despite_trained_adapter(model) -> bool:
    """Whether the reference is scored with the adapter disabled although the adapter already changes the model.

    TRL copies a PEFT model's adapter into a frozen `"ref"` adapter and scores the reference with it, except for
    LoRA with `target_parameters` on peft < 0.20, where it falls back to the base model. A LoRA adapter changes the
    model once any `lora_B` is non-zero (PEFT initializes them to zero).
    """
    if not isinstance(model, PeftModel) or "ref" in model.peft_config:
        return False
    return any(
        param.detach().abs().max().item() > 0
        for name, param in model.named_parameters()
        if "lora_B" in name or "lora_embedding_B" in name
    )


class AdaptiveKLGRPOTrainer(HostHooks, GRPOTrainer, hub_tag="adaptive-kl"):
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
    """

    def __init__(self, model, reward_funcs=None, args=None, *more, diversity_embedder=None, **kwargs):
        args = resolve_args(GRPOTrainer, AdaptiveKLGRPOConfig, model, args, "AdaptiveKLGRPOTrainer", "GRPO")
        check_host(GRPOTrainer, args, "AdaptiveKLGRPOTrainer", own_loss=args.beta > 0)
        check_train_dataset(
            train_dataset_argument(more, kwargs), environment=kwargs.get("environment_factory") is not None
        )
        self._unsloth_module = unsloth_host_module(GRPOTrainer)
        if self._unsloth_module is not None:
            if args.kl_placement == "reward":
                raise ValueError(
                    "kl_placement='reward' is not supported on Unsloth's GRPOTrainer: its rollout scoring is its own "
                    "code, which this package does not hook. Use kl_placement='loss', or plain TRL."
                )
            install_capture_shim(self._unsloth_module)
        loads_no_reference = self._reference_never_scored(args, model, kwargs.get("peft_config"))
        with host_built_without_reference(self, args) if loads_no_reference else nullcontext():
            super().__init__(model, reward_funcs, args, *more, **kwargs)
        check_host_attributes(self)
        if args.beta > 0 and reference_is_base_despite_trained_adapter(self.model):
            warnings.warn(
                "The PEFT model carries a trained adapter, and the reference policy is the base model with the "
                "adapter disabled: the KL term pulls the policy back towards the base model, not towards the adapter "
                "you start from. To regularize towards the adapter, upgrade to peft>=0.20 (TRL then copies it as the "
                "reference), or merge it into the base model (merge_and_unload), save that and pass a new "
                "peft_config.",
                UserWarning,
                stacklevel=2,
            )
        self.beta_controller = BetaController.from_args(args)
        self.reference_resets = ReferenceResets(every_steps=args.ref_reset_steps, kl_threshold=args.ref_reset_kl)
        if self.reference_resets.enabled:
            self._prepare_reference_resets()
        self._kl_methods = args.kl_methods
        self._kl_transform = args.kl_transform
        self._generation_mean_reward = float("nan")
        if diversity_embedder is None and args.diversity_metrics:
            diversity_embedder = build_embedder(args.diversity_embedder)
        self.diversity_embedder = diversity_embedder
        self._step_stats: torch.Tensor | None = None  # summed statistics of the optimizer step in progress
        self._log_stats: dict[str, torch.Tensor | None] = {"train": None, "eval": None}
        self._last_beta: dict[str, tuple[float, float]] = {}
        self._warned: set[str] = set()  # the once-per-run warnings already given
        # While β is 0 for good (`skip_zero_beta_reference`): micro-batches [without reference, in all] since the last
        # log, the last monitoring window measured, whether this evaluation was measured, and whether the reference
        # model is gone (freed, or never loaded on a resume past the switch).
        self._reference_skips = {"train": [0, 0], "eval": [0, 0]}
        self._monitored_window: int | None = None
        self._eval_monitored = False
        self._reference_released = loads_no_reference
        if loads_no_reference and self.accelerator.is_main_process:
            logger.warning(
                f"Resuming from {args.resume_from_checkpoint}, where β is 0 for good (kl_adaptation_method='dynamic', "
                f"beta_schedule_steps={args.beta_schedule_steps}, beta_min=0) and kl_monitor_steps=0: the reference "
                "model is not loaded."
            )
        self.add_callback(AdaptiveKLStateCallback(self.beta_controller, resets=self.reference_resets))

    __init__.__signature__ = with_keyword_only(
        inspect.signature(GRPOTrainer.__init__),
        [inspect.Parameter("diversity_embedder", inspect.Parameter.KEYWORD_ONLY, default=None)],
    )

    # --- reference resets -------------------------------------------------------------------------------------------

    def _prepare_reference_resets(self) -> None:
        """Refuses what a reset cannot handle, and gives a PEFT policy the `"ref"` adapter a reset copies into."""
        if self.is_fsdp_enabled or (
            self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3
        ):
            raise ValueError(
                "Reference resets (ref_reset_steps, ref_reset_kl) are not supported with FSDP or DeepSpeed ZeRO-3, "
                "whose sharded parameters a reset would have to gather: use DDP or ZeRO-1/2, or no resets."
            )
        if self.args.ref_reset_optimizer and self.is_deepspeed_enabled:
            raise ValueError(
                "ref_reset_optimizer=True is not supported with DeepSpeed, whose optimizer state lives in its engine: "
                "set ref_reset_optimizer=False."
            )
        if isinstance(self.model, PeftModel) and REFERENCE_ADAPTER not in self.model.peft_config:
            config = self.model.peft_config[self.model.active_adapter]
            if getattr(config, "target_parameters", None) and Version(peft.__version__) < Version("0.20.0"):
                raise ValueError(
                    "Reference resets of a LoRA adapter with target_parameters need a second adapter, which "
                    "peft<0.20 cannot add (peft#3340): upgrade peft, or use no resets."
                )
            add_reference_adapter(self.model)

    def _reference_models(self):
        """The unwrapped policy and TRL's reference model (`None` for PEFT: the `"ref"` adapter)."""
        return self.accelerator.unwrap_model(self.model), self.ref_model

    def _reset_reference(self) -> None:
        """The reference becomes the policy (applied before a generation batch is scored; see `reference.py`)."""
        copy_policy_to_reference(*self._reference_models())
        if self.args.ref_reset_optimizer and self.optimizer is not None:
            self.optimizer.state.clear()  # each parameter's moments start afresh at its next step
        self.reference_resets.applied(self.state.global_step)

    def _on_checkpoint_loaded(self, checkpoint: str) -> None:
        policy = self.accelerator.unwrap_model(self.model)
        if isinstance(policy, PeftModel) and REFERENCE_ADAPTER in policy.peft_config:
            restore_trained_adapter(policy, checkpoint)

    def _on_generation_batch(self) -> None:
        if self.model.training and self.reference_resets.pending:
            self._reset_reference()

    def _on_checkpoint_saved(self, checkpoint: str) -> None:
        if self.reference_resets.num_resets > 0:  # the reference no longer equals the loaded model: save its weights
            save_reference(checkpoint, *self._reference_models())

    def _load_reset_reference(self, checkpoint: str, reset_state: dict | None) -> None:
        """On resume: the reference's weights saved in `checkpoint`, when its run (`reset_state`, checked) had reset
        the reference."""
        num_resets = int(reset_state["num_resets"]) if reset_state is not None else 0
        if num_resets == 0:
            return
        if not self.reference_resets.enabled:
            raise ValueError(
                f"{checkpoint} was saved after {num_resets} reference reset(s), but this run sets no resets "
                "(ref_reset_steps=0, ref_reset_kl=0): its reference would silently go back to the loaded model. "
                "Resume with the run's ref_reset_steps / ref_reset_kl."
            )
        load_reference(checkpoint, *self._reference_models())

    # --- the reference at β = 0 -------------------------------------------------------------------------------------

    def _reference_never_scored(self, args, model, peft_config) -> bool:
        """Before the host's `__init__`: whether a full-model reference would never be scored in this trainer's runs,
        so the host need not load it: `args.resume_from_checkpoint` starts past the switch (β is 0 for good) and
        nothing reads the reference there (no monitoring, resets or `sync_ref_model`). `train` then refuses to start
        anywhere else. A PEFT reference is the base model itself (nothing to save); Unsloth builds its own."""
        return (
            args.beta > 0
            and args.skip_zero_beta_reference
            and reference_unread_at_zero_beta(args)
            and peft_config is None
            and not isinstance(model, PeftModel)
            and self._unsloth_module is None
            and resumes_past_the_switch(args, args.resume_from_checkpoint)
        )

    def _scores_reference(self, mode: str) -> bool:
        """Whether the generation batch about to be scored needs the reference log-probabilities: not when β_t is 0
        for every optimizer step it serves (the first one decides: see `BetaController.is_zero_from`), unless the KL
        is monitored on this batch or a KL-triggered reference reset reads every step's KL."""
        args = self.args
        step = self.state.global_step + 1  # the first optimizer step the batch serves (the next one, in evaluation)
        if host_beta(self) == 0.0:  # stock TRL: no reference at all
            return True
        if (
            not args.skip_zero_beta_reference
            or args.ref_reset_kl > 0
            or not self.beta_controller.is_zero_from(step)
            or self._kl_monitor_due(mode, step)
        ):
            if self._reference_released:
                raise ValueError(
                    f"Optimizer step {step} needs the reference model (β is not 0 there), but {self._no_reference}"
                )
            return True
        self._release_reference_if_unused()
        return False

    def _kl_monitor_due(self, mode: str, step: int) -> bool:
        """Whether this skippable batch is measured anyway (`kl_monitor_steps`): the first one of each window of that
        many optimizer steps (windows aligned with the log lines by default), and the first one of each evaluation."""
        every = self.args.kl_monitor_steps
        if every is None:
            every = max(int(self.state.logging_steps or 1), 1)
        if every == 0:
            return False
        if mode == "eval":
            due, self._eval_monitored = not self._eval_monitored, True
            return due
        window = (step - 1) // every
        due, self._monitored_window = window != self._monitored_window, window
        return due

    @property
    def _no_reference(self) -> str:
        """Why this trainer holds no reference model, and what to do instead."""
        return (
            "this trainer holds no reference model: it was freed once β reached 0 for good, or not loaded because "
            "args.resume_from_checkpoint was past the switch (skip_zero_beta_reference=True, kl_monitor_steps=0). "
            f"Train from a checkpoint saved at step {self.args.beta_schedule_steps - 1} or later "
            "(train(resume_from_checkpoint=...)), build a new trainer to train from elsewhere, or set "
            "kl_monitor_steps > 0 to keep the reference."
        )

    def _release_reference_if_unused(self) -> None:
        """Frees a full-model reference once β is 0 for good and nothing else reads it: no monitoring, no reference
        resets, no `sync_ref_model`, no sharded engine that owns it. A PEFT reference is the base model itself."""
        args = self.args
        if (
            self._reference_released
            or self.ref_model is None
            or not reference_unread_at_zero_beta(args)
            or self.is_deepspeed_enabled
            or self.is_fsdp_enabled
        ):
            return
        release_reference_model(self)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self._reference_released = True
        if self.accelerator.is_main_process:
            logger.warning(
                f"β is 0 from optimizer step {self.state.global_step + 1} on (kl_adaptation_method='dynamic', "
                f"beta_schedule_steps={args.beta_schedule_steps}, beta_min=0) and kl_monitor_steps=0: the reference "
                "model is no longer scored, and its memory was freed."
            )

    # --- generation batches ---------------------------------------------------------------------------------------

    def _on_scored(self, output: dict, rewards_per_func: torch.Tensor, mode: str) -> None:
        self._warn_infinite_rewards(rewards_per_func)
        rewards = total_rewards(rewards_per_func, self.reward_weights)  # gathered over processes, as TRL logs them
        if mode == "train":
            self._generation_mean_reward = torch.nanmean(rewards).item()
        if self.args.kl_placement == "reward":
            self._penalize_rewards(output, rewards, mode)
        if self.args.diversity_metrics:
            self._log_diversity(output, mode)

    def _warn_infinite_rewards(self, rewards_per_func: torch.Tensor) -> None:
        counts = torch.isinf(rewards_per_func).sum(dim=0).tolist()  # per reward function
        if any(counts):
            named = ", ".join(f"{name} ({count})" for name, count in zip(self.reward_func_names, counts) if count)
            self._warn_once(
                "infinite_rewards",
                f"Reward functions returned ±inf for some of the {len(rewards_per_func)} completions of a generation "
                f"batch: {named}. TRL takes only None (NaN) as 'no reward'; an infinite reward makes the advantages "
                "of its group non-finite, so those completions do not train, and a reward-triggered β (dynamic) "
                "skips the step. Return finite rewards, or None where a function does not apply.",
            )

    def _on_callback_state_loaded(self) -> None:
        # With `restore_callback_states_from_checkpoint=True` Transformers re-instantiates callbacks from their
        # saved args; give the new instance our controller and resets (its `on_train_begin` then loads their state).
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, AdaptiveKLStateCallback) and callback.controller is None:
                callback.controller, callback.resets = self.beta_controller, self.reference_resets

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        # An exception (e.g. from a reward function) can interrupt an optimizer step after some of its micro-batches
        # were recorded: those partial sums must not leak into the next run. A run that does not resume starts from
        # step 1 with a new optimizer, so β starts afresh too; a resumed run gets the checkpoint's state.
        if self._reference_released and not resumes_past_the_switch(self.args, resume_from_checkpoint):
            start = f"resume_from_checkpoint={resume_from_checkpoint!r}"
            raise ValueError(f"Cannot train from {start}: {self._no_reference}")
        self._step_stats = None
        self._log_stats = {"train": None, "eval": None}
        self._reference_skips = {"train": [0, 0], "eval": [0, 0]}
        self._monitored_window, self._eval_monitored = None, False
        self._warned.clear()
        if resume_from_checkpoint:
            self._check_resumed_kl_state(resume_from_checkpoint)
        else:
            self.beta_controller.reset()
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _check_resumed_kl_state(self, resume_from_checkpoint) -> None:
        """Before anything is loaded: refuses a damaged saved β state, and a missing one (a stock TRL checkpoint)
        when β's trajectory depends on it, unless `resume_without_kl_state=True` (β then starts afresh)."""
        checkpoint = resolve_checkpoint(resume_from_checkpoint, self.args.output_dir)
        if checkpoint is None:
            return  # Transformers says so
        saved = read_checkpoint_kl_state(checkpoint)
        if saved is not None:
            self._load_reset_reference(checkpoint, saved["reference_reset_state"])
            return  # a sound state, which `on_train_begin` loads
        if self.beta_controller.has_training_state:
            if not self.args.resume_without_kl_state:
                raise ValueError(missing_kl_state_message(checkpoint, self.args.beta))
            self._warn_once(
                "fresh_beta",
                f"Resuming from {checkpoint}, which has no adaptive-KL controller state: β starts afresh at "
                f"beta={self.args.beta} (resume_without_kl_state=True).",
            )
        self.beta_controller.reset()  # a fixed β_base is a function of the step: nothing is lost

    def _warn_once(self, key: str, message: str) -> None:
        """A `UserWarning` given at most once per `train()` call, by the main process only."""
        if key not in self._warned:
            self._warned.add(key)
            if self.accelerator.is_main_process:
                warnings.warn(message, UserWarning, stacklevel=3)

    # --- KL in the reward -------------------------------------------------------------------------------------------

    def _sampling_policy_logps(self, output: dict, mode: str) -> torch.Tensor:
        """log π at the sampled tokens under the policy that sampled them: TRL's `old_per_token_logps` when it computed
        them, else one no-grad forward of the policy (on-policy, `num_iterations == 1`, where TRL skips it)."""
        if output.get("old_per_token_logps") is not None:
            return output["old_per_token_logps"]
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        multimodal = {key: output[key] for key in MULTIMODAL_INPUTS if key in output}
        with torch.no_grad():
            return score_policy(
                self, self.model, input_ids, attention_mask, output["completion_ids"].size(1), batch_size, **multimodal
            )

    def _penalize_rewards(self, output: dict, rewards: torch.Tensor, mode: str) -> None:
        """Replaces the advantages by those of the rewards minus the detached KL penalty β_t·Σ_t f(k)."""
        step = self.state.global_step + 1
        if "ref_per_token_logps" not in output:  # β = 0 for every step the batch serves: the penalty is 0, in the
            # dtype of the log-probabilities it would be computed from, so the advantages are those of the full path
            dtype = self.accelerator.unwrap_model(self.model).get_output_embeddings().weight.dtype
            if output.get("old_per_token_logps") is not None:
                dtype = output["old_per_token_logps"].dtype
            penalty = torch.zeros(len(output["completion_ids"]), device=rewards.device, dtype=dtype)
        else:
            penalty = self._kl_penalty(output, mode, step)
        penalties = self.accelerator.gather(penalty)  # in the global order of the rewards
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        advantages = group_advantages(rewards.to(penalties.dtype) - penalties, num_generations, self.scale_rewards)
        local = len(output["completion_ids"])
        start = self.accelerator.process_index * local
        output["advantages"] = advantages[start : start + local].to(output["advantages"].dtype)
        replace_logged_advantages(self, advantages)
        metric_store(self, mode)["adaptive_kl/reward_penalty"].append(penalties.nanmean().item())

    def _kl_penalty(self, output: dict, mode: str, step: int) -> torch.Tensor:
        """`(B,)` detached penalties β_t·Σ_t f(k) of the generation batch's sequences."""
        args = self.args
        return sequence_kl_penalty(
            self._sampling_policy_logps(output, mode),
            output["ref_per_token_logps"],
            completion_loss_mask(output),
            beta=self.beta_controller.beta(step),
            estimator=args.kl_estimator,
            transform=self._kl_transform,
            clip_threshold=args.kl_clip_threshold,
            target=args.kl_target,
            length_normalized="length_normalized" in self._kl_methods,
        )

    # --- diversity --------------------------------------------------------------------------------------------------

    def _log_diversity(self, output: dict, mode: str) -> None:
        """`diversity/*` of the generation batch, over every process's completions (groups may span processes)."""
        pad = self.processing_class.pad_token_id if hasattr(self.processing_class, "pad_token_id") else None
        ids = []
        for row, mask in zip(output["completion_ids"], output["completion_mask"].bool()):
            if not mask.any() and pad is not None:  # masked whole by mask_truncated_completions: the tokens, unpadded
                mask = row != pad
            ids.append(row[mask].tolist())
        ids = gather_object(ids)
        texts = self.processing_class.batch_decode(ids, skip_special_tokens=True)
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        metrics = diversity_metrics(ids, texts, num_generations, embedder=self.diversity_embedder)
        for name, value in metrics.items():
            metric_store(self, mode)[name].append(value)

    # --- loss --------------------------------------------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if host_beta(self) == 0.0:  # nothing adaptive was asked for (the config enforces it): stock TRL
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        step = self.state.global_step + 1  # the optimizer step in progress (the next one, in evaluation)
        with self.host_loss_without_kl() as captured:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        beta, scale = self.beta_controller.beta(step), self.beta_controller.scale(step)
        skipped = "ref_per_token_logps" not in inputs  # `_scores_reference`: β_t = 0, the term adds exactly 0
        self._reference_skips[mode][0] += int(skipped)
        self._reference_skips[mode][1] += 1
        if skipped:
            self._record(None, mode, step, beta, scale)
            return loss
        host_inputs = self._host_kl_inputs(
            captured, inputs, mode, training=torch.is_grad_enabled() and mode == "train"
        )
        if self.args.kl_placement == "reward":
            # The KL is in the advantages: measured here, without a graph, for the metrics and controllers only.
            with torch.no_grad():
                _, stats = self._adapted_kl_term({**host_inputs, "use_bias_correction": False})
            self._record(stats, mode, step, beta, scale)
            return loss
        kl_term, stats = self._adapted_kl_term(host_inputs)
        self._record(stats, mode, step, beta, scale)
        return loss + beta * kl_term  # Unsloth's backward ignores its incoming gradient: add, never scale its loss

    def _host_kl_inputs(self, captured: dict, inputs: dict, mode: str, training: bool) -> dict:
        """The log-probabilities, mask and aggregation of the host's loss that the KL term must share."""
        if self._unsloth_module is not None:
            if "efficient_grpo" not in captured:
                raise unsupported_unsloth("its GRPO loss no longer calls UnslothEfficientGRPO.apply")
            kl_inputs = unsloth_kl_term_inputs(captured["efficient_grpo"])
            check_carries_gradient(kl_inputs["per_token_logps"], training, "Unsloth's policy log-probabilities")
            return kl_inputs
        per_token_logps = self.captured_policy_logps(captured, training)
        args = self.args
        mask = completion_loss_mask(inputs)
        accumulation_steps = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        token_normalizer = None
        if self.loss_type in TOKEN_SUM_LOSS_TYPES:
            token_normalizer = token_sum_normalizer(
                inputs["num_items_in_batch"],
                self.accelerator.num_processes,
                accumulation_steps,
                args.steps_per_generation if mode == "train" else None,
            )
        return dict(
            per_token_logps=per_token_logps,
            ref_per_token_logps=inputs["ref_per_token_logps"],
            mask=mask.to(per_token_logps.dtype),
            old_per_token_logps=inputs.get("old_per_token_logps"),
            loss_type=self.loss_type,
            accumulation_steps=accumulation_steps,
            max_completion_length=self.max_completion_length,
            token_normalizer=token_normalizer,
            use_bias_correction=args.use_bias_correction_kl,
            importance_sampling_level=self.importance_sampling_level,
        )

    def _adapted_kl_term(self, host_inputs: dict):
        """Agg(f(k)) for one micro-batch, with the host's normalizers, and its statistics summed over processes."""
        args = self.args
        term, stats = adapted_kl_term(
            **host_inputs,
            estimator=args.kl_estimator,
            transform=self._kl_transform,
            clip_threshold=args.kl_clip_threshold,
            target=args.kl_target,
            length_normalized="length_normalized" in self._kl_methods,
        )
        return term, self.accelerator.reduce(stats, reduction="sum")

    def _record(self, stats, mode, step, beta, scale):
        """Accumulates the statistics for logging and, at the end of an optimizer step, updates the controller.
        `stats` is None for a micro-batch scored without the reference (β_t = 0: only the reward rule can apply)."""
        self._last_beta[mode] = (beta, scale)
        if stats is not None:
            self._log_stats[mode] = stats if self._log_stats[mode] is None else self._log_stats[mode] + stats
        if mode != "train":
            return
        if stats is not None:
            self._step_stats = stats if self._step_stats is None else self._step_stats + stats
        if self.accelerator.sync_gradients:  # last micro-batch of the optimizer step: β changes for the next one
            step_stats = self._step_stats if self._step_stats is not None else torch.zeros(len(STAT_INDEX))
            tokens = step_stats[STAT_INDEX["tokens"]].item()
            mean_kl = step_stats[STAT_INDEX["raw_kl"]].item() / tokens if tokens > 0 else float("nan")
            controller = self.beta_controller
            skipped = controller.num_skipped_updates
            controller.update(
                step,
                mean_reward=self._generation_mean_reward,
                mean_kl=mean_kl,
                num_sequences=int(step_stats[STAT_INDEX["sequences"]].item()),
            )
            if controller.num_skipped_updates > skipped:
                statistic = (
                    f"mean reward {self._generation_mean_reward}" if controller.dynamic else f"mean KL {mean_kl}"
                )
                self._warn_once(
                    "skipped_update",
                    f"β was not updated after optimizer step {step}: its {statistic} is not finite (a reward function "
                    "returned ±inf, no completion was scored or had a token, or the log-probabilities overflowed). β "
                    f"stays at {controller.beta_base:g} until a step gives a finite value; "
                    "adaptive_kl/skipped_updates counts such steps. Warned once per run.",
                )
            self.reference_resets.end_of_step(step, mean_kl)
            self._step_stats = None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        metrics = metric_store(self, mode)
        if self.args.diversity_metrics and metrics.get("entropy"):
            metrics["diversity/entropy"] = list(metrics["entropy"])  # TRL's, on the panel
        stats = self._log_stats.get(mode)
        skipped, scored = self._reference_skips[mode]
        if scored:  # micro-batches went through our loss since the last log
            beta, scale = self._last_beta[mode]
            if stats is not None:  # the KL metrics: from the micro-batches scored with the reference only
                for key, value in kl_metrics(stats, beta=beta, beta_scale=scale).items():
                    metrics[key] = [value]  # TRL averages and prefixes (`eval_`) its metrics
            else:
                metrics["adaptive_kl/current_beta"], metrics["adaptive_kl/beta_scale"] = [beta], [scale]
            metrics["adaptive_kl/reference_skipped"] = [skipped / scored]
            if mode == "train" and self.beta_controller.has_training_state:
                metrics["adaptive_kl/skipped_updates"] = [float(self.beta_controller.num_skipped_updates)]
            if mode == "train" and self.reference_resets.enabled:
                metrics["adaptive_kl/ref_resets"] = [float(self.reference_resets.num_resets)]
                metrics["adaptive_kl/ref_reset_step"] = [float(self.reference_resets.last_reset_step)]
            self._log_stats[mode] = None
            self._reference_skips[mode] = [0, 0]
        if mode == "eval":
            self._eval_monitored = False  # the next evaluation measures its first batch again
        super().log(logs, start_time)
