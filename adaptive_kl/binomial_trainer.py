"""`BinomialKLConfig` and `BinomialKLTrainer`: the binomial-KL ("SPO") objective on `trl.GRPOTrainer`'s rollouts.

The host generates, scores and batches completions as usual; this trainer changes two things (see
`adaptive_kl.binomial_kl` for the math):

- advantages: TRL's group-normalized advantages are replaced by the raw total reward of each sequence (the reward
  TRL logs as `reward`: Σ_k w_k·r_k, NaN when every reward function returned None); the loss uses A = r·m and trains
  only on correct sequences (r > `correct_reward_threshold`).
- loss: `_compute_loss` is replaced by Σ_{i correct} (1/L_i) Σ_t A_it·ℓ_it / N_correct, with ℓ the per-token
  binomial KL and N_correct the correct sequences of the whole optimizer step, over all micro-batches and
  processes. It is a plain likelihood-style objective: GRPO's importance ratio, PPO clip (`epsilon`, `delta`,
  `importance_sampling_level`), `loss_type`, `scale_rewards` and `multi_objective_aggregation` play no part, nor do
  the entropy mask/bonus or an MoE router auxiliary loss.

Normalization. TRL marks its loss as already scaled for gradient accumulation (`loss_is_scaled_for_ga`; on
transformers < 5.19 through `model_accepts_loss_kwargs`/`compute_loss_func`), and Transformers builds its Accelerator
with `num_steps=1`: the gradients of the losses `compute_loss` returns are summed, unscaled, over the micro-batches of
a step, then averaged over processes by DDP. So each micro-batch returns P·Σ_{its correct i}(…)/N_correct (P the
process count), and the step's gradient is exactly ∇[Σ_{all correct i}(…)/N_correct]. N_correct is known before the
first micro-batch's backward because every micro-batch of a step comes from the same generation batch
(`steps_per_generation` must be a multiple of `gradient_accumulation_steps`; TRL's default is equal): the trainer
counts the correct sequences of the step's slots of TRL's generation buffer and sums that count over processes.

Memory. The policy forward returns only the logits of the completion positions (`logits_to_keep` as an index
tensor, so there is no slice and no extra position), in row chunks of `per_device_train_batch_size` rows, and
`token_log_probs_from_logits` keeps no copy of them: one `(B, T, V)` logits tensor per micro-batch is all the graph
holds at vocabulary size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import trl
from trl import GRPOConfig, GRPOTrainer

from .binomial_kl import (
    BINOMIAL_KL_TARGETS,
    BinomialLogProbs,
    binomial_kl_loss,
    binomial_kl_per_token,
    spo_advantages,
    token_log_probs_from_logits,
)
from .compat import MULTIMODAL_INPUTS, SUPPORTED_TRL, completion_loss_mask
from .placement import replace_logged_advantages, total_rewards
from .unsloth_backend import check_import_order, is_unsloth_class
from .validation import is_finite_number, require

# Host methods this trainer overrides or relies on; without them the objective would silently not be the study's.
HOST_HOOKS = ("_compute_loss", "_calculate_rewards", "_generate_and_score_completions", "_prepare_inputs")

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
            f"beta must be 0 for BinomialKLConfig, got {self.beta!r}: the binomial-KL objective has no reference-model "
            "KL term (its KL is toward p_max or 0.5 under the current policy).",
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
                f"{name} must be {inert!r} for BinomialKLConfig (got {value!r}): the binomial-KL loss does not apply it.",
            )


class BinomialKLTrainer(GRPOTrainer):
    """[`~trl.GRPOTrainer`] with the binomial-KL ("SPO") objective; takes a [`BinomialKLConfig`].

    Logs, next to TRL's metrics: `binomial_kl/loss` (the step objective), `binomial_kl/num_correct` (N_correct of the
    step), `binomial_kl/correct_fraction`, `binomial_kl/active_token_fraction` (completion tokens that enter the loss:
    of correct sequences, and with p > 0.5 for target "half"), `binomial_kl/p_chosen` and `binomial_kl/p_max` (means
    over completion tokens).
    """

    _tag_names = [*GRPOTrainer._tag_names, "binomial-kl"]

    def __init__(self, model, reward_funcs, args: BinomialKLConfig | None = None, *more, **kwargs):
        check_import_order(GRPOTrainer, trl.GRPOTrainer, "GRPOTrainer")
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = BinomialKLConfig(f"{name.split('/')[-1]}-BinomialKL")
        elif not isinstance(args, BinomialKLConfig):
            raise TypeError(
                f"BinomialKLTrainer needs a BinomialKLConfig, got {type(args).__name__}. It accepts every GRPOConfig "
                "argument: replace GRPOConfig(...) by BinomialKLConfig(...)."
            )
        check_binomial_host(GRPOTrainer, args)
        super().__init__(model, reward_funcs, args, *more, **kwargs)
        self._spo_rewards: torch.Tensor | None = None  # total reward per sequence, all processes, set while scoring

    # --- advantages -----------------------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._spo_rewards = total_rewards(rewards_per_func, self.reward_weights)  # [N_global], as TRL logs `reward`
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._spo_rewards = None
        output = super()._generate_and_score_completions(inputs)
        if self._spo_rewards is None:
            raise RuntimeError(
                "BinomialKLTrainer could not capture the rewards: the installed GRPOTrainer no longer calls "
                f"_calculate_rewards from _generate_and_score_completions (supported: trl{SUPPORTED_TRL})."
            )
        # This process's rows, sliced as TRL slices its advantages.
        start = self.accelerator.process_index * len(inputs)
        output["advantages"] = self._spo_rewards[start : start + len(inputs)]  # (B,), raw reward (NaN: unscorable)
        replace_logged_advantages(self._logs["advantages"], self._spo_rewards)
        self._spo_rewards = None
        return output

    # --- loss ---------------------------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        args = self.args
        mask = completion_loss_mask(inputs)
        log_probs = self._token_log_probs(model, inputs, mode)
        per_token_kl, active = binomial_kl_per_token(
            log_probs, args.binomial_kl_target, detach_target=args.binomial_kl_detach_target
        )
        advantages, correct = spo_advantages(inputs["advantages"], mask, args.correct_reward_threshold)
        step_correct_local = self._step_correct_local(inputs, correct, mode)
        mask_f = mask.to(per_token_kl.dtype)
        # One collective for the normalizer and every metric.
        with torch.no_grad():
            lengths = mask_f.sum(-1).clamp(min=1.0)
            seq_terms = ((advantages * per_token_kl).detach() * mask_f).sum(-1) / lengths
            stats = torch.stack(
                [
                    step_correct_local.to(mask_f.dtype),
                    correct.sum().to(mask_f.dtype),
                    torch.tensor(float(correct.numel()), device=mask.device, dtype=mask_f.dtype),
                    (mask_f * active * correct.unsqueeze(-1)).sum(),
                    mask_f.sum(),
                    (log_probs.log_p.detach().exp() * mask_f).sum(),
                    (log_probs.log_p_max.detach().exp() * mask_f).sum(),
                    seq_terms[correct].sum(),
                ]
            )
            stats = self.accelerator.reduce(stats, reduction="sum")
        num_correct = stats[0]
        loss = binomial_kl_loss(per_token_kl, advantages, mask, correct, num_correct)
        # DDP averages gradients over the P processes: scale by P so the step's gradient is the global sum / N_correct.
        loss = loss * self.accelerator.num_processes
        accumulation = self._accumulation_steps() if mode == "train" else 1
        metrics = self._metrics[mode]
        # × accumulation: TRL averages the appended values over the step's micro-batches, whose sum is the objective.
        metrics["binomial_kl/loss"].append((stats[7] / num_correct.clamp(min=1.0)).item() * accumulation)
        metrics["binomial_kl/num_correct"].append(num_correct.item())
        metrics["binomial_kl/correct_fraction"].append((stats[1] / stats[2].clamp(min=1.0)).item())
        tokens = stats[4].clamp(min=1.0)
        metrics["binomial_kl/active_token_fraction"].append((stats[3] / tokens).item())
        metrics["binomial_kl/p_chosen"].append((stats[5] / tokens).item())
        metrics["binomial_kl/p_max"].append((stats[6] / tokens).item())
        return loss

    def _accumulation_steps(self) -> int:
        # Set by Trainer.train (smaller for a last partial step); the configured value before training starts.
        return getattr(self, "current_gradient_accumulation_steps", None) or self.args.gradient_accumulation_steps

    def _token_log_probs(self, model, inputs, mode: str) -> BinomialLogProbs:
        """The four `(B, T)` log-probabilities of the policy at the sampling temperature, forward in row chunks."""
        # Multimodal inputs are sliced per row chunk in TRL's own forward; this trainer does not reimplement that.
        if any(inputs.get(key) is not None for key in MULTIMODAL_INPUTS):
            raise NotImplementedError("BinomialKLTrainer supports text-only models; multimodal inputs were given.")
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        length, total = completion_ids.size(1), input_ids.size(1)
        # The positions whose logits predict the completion tokens: an index tensor, so the model returns exactly
        # (b, T, V) logits (an int `logits_to_keep` would return T + 1 positions and a slice would copy in backward).
        keep = torch.arange(total - length - 1, total - 1, device=input_ids.device)
        args = self.args
        rows = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
        rows = max(1, rows or input_ids.size(0))
        parts = []
        for start in range(0, input_ids.size(0), rows):
            end = min(start + rows, input_ids.size(0))
            with self.accelerator.autocast():
                # Without `fused_lm_head=True`, TRL's patched forward is the model's own, which returns the logits.
                logits = model(
                    input_ids=input_ids[start:end],
                    attention_mask=attention_mask[start:end],
                    logits_to_keep=keep,
                    use_cache=False,
                ).logits
            if logits.size(1) != length:  # a model that ignores an index `logits_to_keep` returns every position
                logits = logits[:, total - length - 1 : total - 1]
            parts.append(token_log_probs_from_logits(logits, completion_ids[start:end], self.temperature))
            del logits
        return BinomialLogProbs(*(torch.cat(fields) for fields in zip(*parts, strict=True)))

    def _step_correct_local(self, inputs, correct: torch.Tensor, mode: str) -> torch.Tensor:
        """This process's correct sequences in the optimizer step that `inputs` belongs to.

        In training, `inputs` is one slot of TRL's generation buffer (the object `_prepare_inputs` returned), and
        the step is the `current_gradient_accumulation_steps` consecutive slots that contain it. Anything else
        (evaluation, or a batch passed to `compute_loss` directly) is a whole step by itself.
        """
        buffer = getattr(self, "_buffered_inputs", None) if mode == "train" else None
        slot = next((i for i, batch in enumerate(buffer or ()) if batch is inputs), None)
        if slot is None:
            if any(batch is not None for batch in buffer or ()):
                # Normalizing by this micro-batch alone would scale the step's gradient by up to the accumulation.
                raise RuntimeError(
                    "BinomialKLTrainer could not find this micro-batch in GRPOTrainer's generation buffer, so it cannot "
                    f"count the correct sequences of the optimizer step (supported: trl{SUPPORTED_TRL})."
                )
            return correct.sum()
        accumulation = self._accumulation_steps()
        first = slot - slot % accumulation
        threshold = self.args.correct_reward_threshold
        return sum(
            spo_advantages(batch["advantages"], completion_loss_mask(batch), threshold)[1].sum()
            for batch in buffer[first : first + accumulation]
        )


def check_binomial_host(host: type, args: BinomialKLConfig) -> None:
    """Refuses, before anything is loaded, a host whose loss would not go through `BinomialKLTrainer._compute_loss`.

    Raises:
        TypeError: the host lacks a method of `HOST_HOOKS` (a TRL outside the supported range).
        NotImplementedError: the host is Unsloth's generated trainer (its `compute_loss` never calls `_compute_loss`).
        ValueError: `use_liger_kernel=True` on a host that computes its loss with Liger's fused GRPO loss
            (`_compute_liger_loss`). TRL 1.15 and 1.16 have none: there Liger only swaps layer kernels (TRL forces
            `fused_linear_cross_entropy=False`), the model still returns logits, and the loss is this trainer's.
    """
    missing = [name for name in HOST_HOOKS if not callable(getattr(host, name, None))]
    if missing:
        raise TypeError(
            f"{host.__module__}.{host.__qualname__} has no {missing}, which BinomialKLTrainer overrides: install a "
            f"supported TRL (trl{SUPPORTED_TRL})."
        )
    if is_unsloth_class(host):
        raise NotImplementedError("BinomialKLTrainer does not support Unsloth's GRPOTrainer; use plain TRL.")
    if args.use_liger_kernel and hasattr(host, "_compute_liger_loss"):
        raise ValueError(
            "use_liger_kernel=True makes this GRPOTrainer compute its loss with Liger's fused GRPO loss, which never "
            "calls the binomial-KL loss. Set use_liger_kernel=False."
        )
