"""`BinomialKLTrainer`: the binomial-KL ("SPO") objective on `trl.GRPOTrainer`'s rollouts.

The host generates, scores and batches completions as usual; this trainer changes two things (see
`adaptive_kl.experimental.binomial.loss` for the math):

- advantages: TRL's group-normalized advantages are replaced by the raw total reward of each sequence (the reward
  TRL logs as `reward`: Σ_k w_k·r_k, NaN when every reward function returned None); the loss uses A = r·m and trains
  only on correct sequences (r > `correct_reward_threshold`).
- loss: the host's micro-batch loss (TRL's `_compute_loss`) is replaced by
  Σ_{i correct} (1/L_i) Σ_t A_it·ℓ_it / N_correct, with ℓ the per-token
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

import torch
from trl import GRPOTrainer

from ...kl.placement import total_rewards
from ...trainers.hooks import (
    MULTIMODAL_INPUTS,
    HostHooks,
    HostScoring,
    accumulation_steps,
    check_host,
    check_host_attributes,
    completion_loss_mask,
    resolve_args,
    unsupported_trl,
)
from ...trainers.inputs import check_train_dataset
from ...trainers.unsloth import is_unsloth_class
from .config import BinomialKLConfig
from .loss import (
    BinomialLogProbs,
    binomial_kl_loss,
    binomial_kl_per_token,
    spo_advantages,
    token_log_probs_from_logits,
)
from .statistics import MicroBatchSums


class BinomialKLTrainer(HostHooks, GRPOTrainer, hub_tag="binomial-kl"):
    """[`~trl.GRPOTrainer`] with the binomial-KL ("SPO") objective; takes a [`BinomialKLConfig`].

    Logs, next to TRL's metrics: `binomial_kl/loss` (the step objective), `binomial_kl/num_correct` (N_correct of the
    step), `binomial_kl/correct_fraction`, `binomial_kl/active_token_fraction` (completion tokens that enter the loss:
    of correct sequences, and with p > 0.5 for target "half"), `binomial_kl/p_chosen` and `binomial_kl/p_max` (means
    over completion tokens).
    """

    def __init__(self, model, reward_funcs=None, args=None, *more, **kwargs):
        args = resolve_args(GRPOTrainer, "grpo", BinomialKLConfig, model, args, "BinomialKLTrainer", "BinomialKL")
        check_host(GRPOTrainer, "grpo", args, "BinomialKLTrainer", own_loss=True)
        if is_unsloth_class(GRPOTrainer):  # its compute_loss never calls the host's micro-batch loss
            raise NotImplementedError("BinomialKLTrainer does not support Unsloth's GRPOTrainer; use plain TRL.")
        check_train_dataset(
            more[0] if more else kwargs.get("train_dataset"),  # GRPOTrainer's argument after `args`
            environment=kwargs.get("environment_factory") is not None,
        )
        super().__init__(model, reward_funcs, args, *more, **kwargs)
        check_host_attributes(self, "grpo")

    # --- advantages -----------------------------------------------------------------------------------------------

    def _on_scored(self, scoring: HostScoring) -> None:
        rewards = total_rewards(scoring.rewards_per_func, self.reward_weights)  # (N_global,), as TRL logs `reward`
        # This process's rows, sliced as TRL slices its advantages: (B,), the raw reward (NaN: unscorable)
        rows = len(scoring.output["completion_ids"])
        start = self.accelerator.process_index * rows
        scoring.output["advantages"] = rewards[start : start + rows]
        scoring.log.write("advantages", rewards.tolist())

    # --- loss --------------------------------------------------------------------------------------------------------

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
        with torch.no_grad():  # one collective for the normalizer and every metric
            lengths = mask_f.sum(-1).clamp(min=1.0)
            seq_terms = ((advantages * per_token_kl).detach() * mask_f).sum(-1) / lengths
            local = MicroBatchSums(
                step_correct=step_correct_local.to(mask_f.dtype),
                correct=correct.sum().to(mask_f.dtype),
                sequences=torch.tensor(float(correct.numel()), device=mask.device, dtype=mask_f.dtype),
                active_tokens=(mask_f * active * correct.unsqueeze(-1)).sum(),
                tokens=mask_f.sum(),
                p_chosen=(log_probs.log_p.detach().exp() * mask_f).sum(),
                p_max=(log_probs.log_p_max.detach().exp() * mask_f).sum(),
                objective=seq_terms[correct].sum(),
            )
            sums = MicroBatchSums(*self.accelerator.reduce(torch.stack(local), reduction="sum"))
        loss = binomial_kl_loss(per_token_kl, advantages, mask, correct, sums.step_correct)
        # DDP averages gradients over the P processes: scale by P so the step's gradient is the global sum / N_correct.
        loss = loss * self.accelerator.num_processes
        sums.write_metrics(self._metrics[mode], accumulation_steps(self) if mode == "train" else 1)
        return loss

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
        temperature = self.temperature
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
            parts.append(token_log_probs_from_logits(logits, completion_ids[start:end], temperature))
            del logits
        return BinomialLogProbs(*(torch.cat(fields) for fields in zip(*parts, strict=True)))

    def _step_correct_local(self, inputs, correct: torch.Tensor, mode: str) -> torch.Tensor:
        """This process's correct sequences in the optimizer step that `inputs` belongs to.

        In training, `inputs` is one slot of TRL's generation buffer (`_buffered_inputs`), and the step is the
        `hooks.accumulation_steps` consecutive slots that contain it. Anything else (evaluation, or a batch
        passed to `compute_loss` directly) is a whole step by itself.
        """
        buffer = self._buffered_inputs if mode == "train" else None  # None before the first generation
        slot = next((i for i, batch in enumerate(buffer or ()) if batch is inputs), None)
        if slot is None:
            if any(batch is not None for batch in buffer or ()):
                # Normalizing by this micro-batch alone would scale the step's gradient by up to the accumulation.
                raise unsupported_trl(
                    "BinomialKLTrainer could not find this micro-batch in GRPOTrainer's generation buffer, so it "
                    "cannot count the correct sequences of the optimizer step"
                )
            return correct.sum()
        accumulation = accumulation_steps(self)
        first = slot - slot % accumulation
        threshold = self.args.correct_reward_threshold
        return sum(
            spo_advantages(batch["advantages"], completion_loss_mask(batch), threshold)[1].sum()
            for batch in buffer[first : first + accumulation]
        )
