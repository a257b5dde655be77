"""`RolloutScoring`: what the trainer does with each generation batch the host scored.

The host hands over its output and the gathered `(N, K)` rewards (`HostHooks._on_scored`); from them come the mean
reward and the fraction of zero-std groups that a reward- or saturation-triggered β reads, a warning for infinite
rewards, the advantages of KL in the reward (rewards minus the detached penalty β_t·Σ_t f(k)), the KL mask of the
zero-std groups (`kl_mask_zero_std_groups`), and the `diversity/*` metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from accelerate.utils import gather_object

from ..kl.groups import group_reward_std, zero_std_group_fraction, zero_std_groups
from ..kl.placement import group_advantages, total_rewards
from ..metrics.diversity import diversity_metrics
from .hooks import (
    MULTIMODAL_INPUTS,
    group_size,
    metric_store,
    replace_logged_advantages,
    reward_func_names,
    reward_weights,
    scale_rewards,
    score_policy,
)
from .run_warnings import RunWarnings


@dataclass
class RolloutScoring:
    """The generation batches of one trainer, as they are scored.

    Args:
        trainer (`AdaptiveKLGRPOTrainer` or `AdaptiveKLRLOOTrainer`): the trainer whose batches these are.
        warnings (`RunWarnings`): the run's once-per-run warnings (infinite rewards).
        mean_reward (`float`): the mean total reward of the last training generation batch (NaN before the first):
            what a reward-triggered β (`dynamic`) reads at the end of each optimizer step.
        zero_std_fraction (`float`): the fraction of groups of that batch whose total rewards all agree (NaN before
            the first): what a saturation-triggered β (`dynamic_trigger="saturation"`) reads.
    """

    trainer: object = field(repr=False)
    warnings: RunWarnings = field(repr=False)
    mean_reward: float = float("nan")
    zero_std_fraction: float = float("nan")

    def total_rewards(self, rewards_per_func: torch.Tensor, mode: str) -> torch.Tensor:
        """The `(N,)` total rewards of a scored batch's `(N, K)` rewards (gathered over processes), as TRL logs them;
        warns once per run about infinite ones."""
        self._warn_infinite_rewards(rewards_per_func)
        rewards = total_rewards(rewards_per_func, reward_weights(self.trainer))
        if mode == "train":
            self.mean_reward = torch.nanmean(rewards).item()
            self.zero_std_fraction = zero_std_group_fraction(rewards, group_size(self.trainer, mode))
        return rewards

    def _warn_infinite_rewards(self, rewards_per_func: torch.Tensor) -> None:
        counts = torch.isinf(rewards_per_func).sum(dim=0).tolist()  # per reward function
        if any(counts):
            names = reward_func_names(self.trainer)
            named = ", ".join(f"{name} ({count})" for name, count in zip(names, counts) if count)
            self.warnings.warn(
                "infinite_rewards",
                f"Reward functions returned ±inf for some of the {len(rewards_per_func)} completions of a generation "
                f"batch: {named}. TRL takes only None (NaN) as 'no reward'; an infinite reward makes the advantages "
                "of its group non-finite, so those completions do not train, and a reward-triggered β (dynamic) "
                "skips the step. Return finite rewards, or None where a function does not apply.",
            )

    def sampling_policy_logps(self, output: dict, mode: str) -> torch.Tensor:
        """`(B, T)` log π at the sampled tokens under the policy that sampled them: TRL's `old_per_token_logps` when
        it computed them, else one no-grad forward of the policy (on-policy, `num_iterations == 1`: TRL skips it)."""
        if output.get("old_per_token_logps") is not None:
            return output["old_per_token_logps"]
        trainer, args = self.trainer, self.trainer.args
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        batch_size = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
        multimodal = {key: output[key] for key in MULTIMODAL_INPUTS if key in output}
        with torch.no_grad():
            return score_policy(
                trainer, trainer.model, input_ids, attention_mask, output["completion_ids"].size(1), batch_size,
                **multimodal,
            )  # fmt: skip

    def penalize(
        self,
        output: dict,
        rewards: torch.Tensor,
        penalty: torch.Tensor | None,
        mode: str,
        advantages_of: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Replaces the advantages of `output` by those of the `rewards` minus the `(B,)` detached KL `penalty` of this
        process's sequences; `None` when the batch was scored without the reference (β_t = 0 for every step it
        serves): a penalty of 0, in the dtype of the log-probabilities it would be computed from, so the advantages
        are those of the full path. `advantages_of` maps the `(N,)` penalized rewards to advantages: GRPO's group
        advantages by default (RLOO passes its leave-one-out ones). Returns the `(N,)` penalized rewards."""
        trainer = self.trainer
        if penalty is None:
            dtype = trainer.accelerator.unwrap_model(trainer.model).get_output_embeddings().weight.dtype
            if output.get("old_per_token_logps") is not None:
                dtype = output["old_per_token_logps"].dtype
            penalty = torch.zeros(len(output["completion_ids"]), device=rewards.device, dtype=dtype)
        penalties = trainer.accelerator.gather(penalty)  # in the global order of the rewards
        if advantages_of is None:
            advantages_of = lambda penalized: group_advantages(  # noqa: E731
                penalized, group_size(trainer, mode), scale_rewards(trainer)
            )
        penalized = rewards.to(penalties.dtype) - penalties
        advantages = advantages_of(penalized)
        local = len(output["completion_ids"])
        start = trainer.accelerator.process_index * local
        output["advantages"] = advantages[start : start + local].to(output["advantages"].dtype)
        replace_logged_advantages(trainer, advantages)
        metric_store(trainer, mode)["adaptive_kl/reward_penalty"].append(penalties.nanmean().item())
        return penalized

    def replace_logged_zero_std_fraction(self, rewards: torch.Tensor, mode: str) -> None:
        """Replaces the `frac_reward_zero_std` the host just logged for a generation batch by that of `rewards` (the
        `(N,)` rewards the advantages use), computed as TRL computes it: the share of groups whose std is close to 0
        (a group with fewer than two scored rewards is not), as a float32 mean."""
        std = group_reward_std(rewards, group_size(self.trainer, mode))
        logged = metric_store(self.trainer, mode)["frac_reward_zero_std"]
        logged[-1] = torch.isclose(std, torch.zeros_like(std)).float().mean().item()

    def kl_group_mask(self, output: dict, rewards: torch.Tensor, mode: str) -> torch.Tensor:
        """`kl_mask_zero_std_groups`: the `(B,)` bool mask of this process's completions whose KL counts, False for
        those of a group whose total `rewards` (`(N,)`, every process's) all agree. It is decided here, per group of
        the whole generation batch, and put in `output["kl_group_mask"]`: a tensor of first dimension B, it follows
        each completion through TRL's shuffle and split into micro-batches. Logs the fraction of completions masked."""
        trainer = self.trainer
        masked = zero_std_groups(rewards, group_size(trainer, mode))  # (N,): groups may span processes
        local = len(output["completion_ids"])
        start = trainer.accelerator.process_index * local
        keep = ~masked[start : start + local].to(output["completion_ids"].device)
        output["kl_group_mask"] = keep
        metric_store(trainer, mode)["adaptive_kl/kl_masked_fraction"].append(masked.double().mean().item())
        return keep

    def log_diversity(self, output: dict, mode: str) -> None:
        """`diversity/*` of the generation batch, over every process's completions (groups may span processes)."""
        trainer = self.trainer
        tokenizer = trainer.processing_class
        pad = tokenizer.pad_token_id if hasattr(tokenizer, "pad_token_id") else None
        ids = []
        for row, mask in zip(output["completion_ids"], output["completion_mask"].bool()):
            if not mask.any() and pad is not None:  # masked whole by mask_truncated_completions: the tokens, unpadded
                mask = row != pad
            ids.append(row[mask].tolist())
        ids = gather_object(ids)
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        metrics = diversity_metrics(ids, texts, group_size(trainer, mode), embedder=trainer.diversity_embedder)
        for name, value in metrics.items():
            metric_store(trainer, mode)[name].append(value)
