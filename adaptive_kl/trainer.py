"""`AdaptiveKLGRPOTrainer`: `trl.GRPOTrainer` with an adaptive KL term.

The host computes its own loss with β = 0 (the policy term, untouched), and this class adds
`β_t · Agg(f(k))` computed from the log-probabilities the host already computed for that loss: no copy of the
host's loss, no extra forward pass. The reference model is loaded as usual because `args.beta > 0`.

The host is whatever `trl.GRPOTrainer` is when this module is first imported: TRL's own, or, after `import unsloth`,
Unsloth's generated trainer, whose loss is reached through `adaptive_kl.unsloth_backend`.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch
import trl
from accelerate.utils import gather_object
from peft import PeftModel
from trl import GRPOTrainer

from .aggregation import TOKEN_SUM_LOSS_TYPES, token_sum_normalizer
from .compat import MULTIMODAL_INPUTS, SUPPORTED_TRL, completion_loss_mask
from .config import AdaptiveKLGRPOConfig
from .controller import BetaController
from .diversity import diversity_metrics
from .metrics import STAT_INDEX, kl_metrics
from .placement import group_advantages, replace_logged_advantages, sequence_kl_penalty, total_rewards
from .state import AdaptiveKLStateCallback
from .term import adapted_kl_term
from .unsloth_backend import (
    capturing_efficient_grpo,
    check_import_order,
    install_capture_shim,
    unsloth_host_module,
    unsloth_kl_term_inputs,
)


# The host's methods this trainer hooks into: if one is gone, the KL term would silently never be computed.
HOST_HOOKS = (
    "_compute_loss",
    "_get_per_token_logps_and_entropies",
    "_calculate_rewards",
    "_generate_and_score_completions",
)


def check_host_loss_path(host: type, args: AdaptiveKLGRPOConfig) -> None:
    """Refuses, before anything is loaded, a host or an option whose loss would not go through our KL term.

    Raises:
        TypeError: the host lacks a method of `HOST_HOOKS` (a TRL outside the supported range).
        ValueError: `use_liger_kernel=True` on a host that computes its loss with Liger's fused GRPO loss
            (`_compute_liger_loss`), which never calls ours. TRL 1.15 and 1.16 have no such path: there Liger only
            swaps layer kernels, and the loss is TRL's own.
    """
    missing = [name for name in HOST_HOOKS if not callable(getattr(host, name, None))]
    if missing:
        raise TypeError(
            f"{host.__module__}.{host.__qualname__} has no {missing}, which AdaptiveKLGRPOTrainer hooks into to add the "
            f"KL term: install a supported TRL (trl{SUPPORTED_TRL})."
        )
    if args.use_liger_kernel and args.beta > 0 and hasattr(host, "_compute_liger_loss"):
        raise ValueError(
            "use_liger_kernel=True makes this GRPOTrainer compute its loss with Liger's fused GRPO loss, which never "
            "calls the adaptive KL term. Set use_liger_kernel=False (or beta=0 for stock TRL)."
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


class AdaptiveKLGRPOTrainer(GRPOTrainer):
    """Drop-in replacement for [`~trl.GRPOTrainer`] that takes an [`AdaptiveKLGRPOConfig`].

    Every argument is passed to `GRPOTrainer` unchanged. With `beta = 0` the trainer is stock TRL; otherwise the KL
    term of the loss is computed here (identical to TRL's for method `"none"`, estimator `"k3"`) and the
    `adaptive_kl/*` metrics are logged through `Trainer.log`.

    Attributes:
        beta_controller (`BetaController`): owns β; saved in every checkpoint and restored on resume.
    """

    _tag_names = [*GRPOTrainer._tag_names, "adaptive-kl"]

    def __init__(
        self, model, reward_funcs, args: AdaptiveKLGRPOConfig | None = None, *more, diversity_embedder=None, **kwargs
    ):
        check_import_order(GRPOTrainer, trl.GRPOTrainer, "GRPOTrainer")
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = AdaptiveKLGRPOConfig(f"{name.split('/')[-1]}-GRPO")
        elif not isinstance(args, AdaptiveKLGRPOConfig):
            raise TypeError(
                f"AdaptiveKLGRPOTrainer needs an AdaptiveKLGRPOConfig, got {type(args).__name__}. It accepts every "
                "GRPOConfig argument: replace GRPOConfig(...) by AdaptiveKLGRPOConfig(...)."
            )
        check_host_loss_path(GRPOTrainer, args)
        self._unsloth_module = unsloth_host_module(GRPOTrainer)
        if self._unsloth_module is not None:
            if args.kl_placement == "reward":
                raise ValueError(
                    "kl_placement='reward' is not supported on Unsloth's GRPOTrainer: its rollout scoring is its own "
                    "code, which this package does not hook. Use kl_placement='loss', or plain TRL."
                )
            install_capture_shim(self._unsloth_module)
        super().__init__(model, reward_funcs, args, *more, **kwargs)
        if args.beta > 0 and reference_is_base_despite_trained_adapter(self.model):
            warnings.warn(
                "The PEFT model carries a trained adapter, and the reference policy is the base model with the adapter "
                "disabled: the KL term pulls the policy back towards the base model, not towards the adapter you "
                "start from. To regularize towards the adapter, upgrade to peft>=0.20 (TRL then copies it as the "
                "reference), or merge it into the base model (merge_and_unload), save that and pass a new peft_config.",
                UserWarning,
                stacklevel=2,
            )
        self.beta_controller = BetaController.from_args(args)
        self._kl_methods = args.kl_methods
        self._kl_transform = args.kl_transform
        self._capture: dict | None = None  # set while the host's loss runs
        self._generation_mean_reward = float("nan")
        self._generation_rewards: torch.Tensor | None = None  # total rewards of the batch being scored, all processes
        self.diversity_embedder = diversity_embedder
        self._step_stats: torch.Tensor | None = None  # summed statistics of the optimizer step in progress
        self._log_stats: dict[str, torch.Tensor | None] = {"train": None, "eval": None}
        self._last_beta: dict[str, tuple[float, float]] = {}
        self.add_callback(AdaptiveKLStateCallback(self.beta_controller))

    # --- host hooks ------------------------------------------------------------------------------------------------

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        outputs = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if self._capture is not None:
            self._capture.setdefault("per_token_logps", outputs[0])
        return outputs

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        rewards = total_rewards(rewards_per_func, self.reward_weights)  # gathered over processes, as TRL logs them
        self._generation_rewards = rewards
        if self.model.training:
            self._generation_mean_reward = torch.nanmean(rewards).item()
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._generation_rewards = None
        output = super()._generate_and_score_completions(inputs)
        if self._generation_rewards is None and self.args.kl_placement == "reward":
            raise RuntimeError(
                "AdaptiveKLGRPOTrainer could not capture the rewards to penalize: the installed GRPOTrainer no longer "
                f"calls _calculate_rewards from _generate_and_score_completions (supported: trl{SUPPORTED_TRL})."
            )
        mode = "train" if self.model.training else "eval"
        if self.args.kl_placement == "reward":
            self._penalize_rewards(output, mode)
        if self.args.diversity_metrics:
            self._log_diversity(output, mode)
        return output

    def _load_callback_state(self):
        super()._load_callback_state()
        # With `restore_callback_states_from_checkpoint=True` Transformers re-instantiates callbacks from their
        # saved args; give the new instance our controller (its `on_train_begin` then loads the saved state).
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, AdaptiveKLStateCallback) and callback.controller is None:
                callback.controller = self.beta_controller

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        # An exception (e.g. from a reward function) can interrupt an optimizer step after some of its micro-batches
        # were recorded: those partial sums must not leak into the next run. A run that does not resume starts from
        # step 1 with a new optimizer, so β starts afresh too; a resumed run gets the checkpoint's state.
        self._step_stats = None
        self._log_stats = {"train": None, "eval": None}
        if not resume_from_checkpoint:
            self.beta_controller.reset()
        return super().train(resume_from_checkpoint, *args, **kwargs)

    @contextmanager
    def _host_loss_without_kl(self):
        """Runs the host's loss with β = 0 and captures the policy log-probabilities it computes (on Unsloth, the
        arguments of its efficient loss, which the shim also runs with β = 0)."""
        host_beta, self.beta, self._capture = self.beta, 0.0, {}
        try:
            if self._unsloth_module is None:
                yield self._capture
            else:
                with capturing_efficient_grpo(self._capture) as capture:
                    yield capture
        finally:
            self.beta, self._capture = host_beta, None

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
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, output["completion_ids"].size(1), batch_size, **multimodal
            )
        return logps

    def _penalize_rewards(self, output: dict, mode: str) -> None:
        """Replaces the advantages by those of the rewards minus the detached KL penalty β_t·Σ_t f(k)."""
        args = self.args
        step = self.state.global_step + 1
        penalty = sequence_kl_penalty(
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
        penalties = self.accelerator.gather(penalty)  # in the global order of the rewards
        rewards = self._generation_rewards.to(penalties.dtype)
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        advantages = group_advantages(rewards - penalties, num_generations, self.scale_rewards)
        local = len(output["completion_ids"])
        start = self.accelerator.process_index * local
        output["advantages"] = advantages[start : start + local].to(output["advantages"].dtype)
        replace_logged_advantages(self._logs["advantages"], advantages)
        self._metrics[mode]["adaptive_kl/reward_penalty"].append(penalties.nanmean().item())

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
            self._metrics[mode][name].append(value)

    # --- loss --------------------------------------------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.beta == 0.0:  # nothing adaptive was asked for (the config enforces it): stock TRL
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        step = self.state.global_step + 1  # the optimizer step in progress (the next one, in evaluation)
        with self._host_loss_without_kl() as captured:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        beta, scale = self.beta_controller.beta(step), self.beta_controller.scale(step)
        host_inputs = self._host_kl_inputs(captured, inputs, mode)
        if self.args.kl_placement == "reward":
            # The KL is in the advantages: measured here, without a graph, for the metrics and controllers only.
            with torch.no_grad():
                _, stats = self._adapted_kl_term({**host_inputs, "use_bias_correction": False})
            self._record(stats, mode, step, beta, scale)
            return loss
        kl_term, stats = self._adapted_kl_term(host_inputs)
        self._record(stats, mode, step, beta, scale)
        return loss + beta * kl_term  # Unsloth's backward ignores its incoming gradient: add, never scale its loss

    def _host_kl_inputs(self, captured, inputs, mode) -> dict:
        """The log-probabilities, mask and aggregation of the host's loss that the KL term must share."""
        if self._unsloth_module is not None:
            if "efficient_grpo" not in captured:
                raise RuntimeError(
                    "AdaptiveKLGRPOTrainer could not capture the arguments of Unsloth's GRPO loss: the installed "
                    "Unsloth's compute_loss no longer calls UnslothEfficientGRPO.apply."
                )
            return unsloth_kl_term_inputs(captured["efficient_grpo"])
        if "per_token_logps" not in captured:
            raise RuntimeError(
                "AdaptiveKLGRPOTrainer could not capture the policy log-probabilities of the host loss: the installed "
                "GRPOTrainer.compute_loss no longer calls _get_per_token_logps_and_entropies."
            )
        per_token_logps = captured["per_token_logps"]
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
        """Accumulates the statistics for logging and, at the end of an optimizer step, updates the controller."""
        self._last_beta[mode] = (beta, scale)
        self._log_stats[mode] = stats if self._log_stats[mode] is None else self._log_stats[mode] + stats
        if mode != "train":
            return
        self._step_stats = stats if self._step_stats is None else self._step_stats + stats
        if self.accelerator.sync_gradients:  # last micro-batch of the optimizer step: β changes for the next one
            tokens = self._step_stats[STAT_INDEX["tokens"]].item()
            mean_kl = self._step_stats[STAT_INDEX["raw_kl"]].item() / tokens if tokens > 0 else float("nan")
            self.beta_controller.update(
                step,
                mean_reward=self._generation_mean_reward,
                mean_kl=mean_kl,
                num_sequences=int(self._step_stats[STAT_INDEX["sequences"]].item()),
            )
            self._step_stats = None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        if self.args.diversity_metrics and self._metrics[mode].get("entropy"):
            self._metrics[mode]["diversity/entropy"] = list(self._metrics[mode]["entropy"])  # TRL's, on the panel
        stats = self._log_stats.get(mode)
        if stats is not None:
            beta, scale = self._last_beta[mode]
            for key, value in kl_metrics(stats, beta=beta, beta_scale=scale).items():
                self._metrics[mode][key] = [value]  # TRL averages and prefixes (`eval_`) its metrics
            self._log_stats[mode] = None
        super().log(logs, start_time)
