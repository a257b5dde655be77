"""`AdaptiveKLRun`: the base `AdaptiveKLGRPOTrainer` and `AdaptiveKLRLOOTrainer` share: what a generation batch, a
micro-batch, an optimizer step, a log line and a run do, whatever the host.

A trainer is `class T(AdaptiveKLRun, HostHooks, <TRL trainer>)` and adds only what differs between hosts. Through one
generation batch:

1. Before the host generates (`_before_scoring`): a reference reset that fell due is applied, and the batch is scored
   without the reference where β_t is 0 for good (`reference.ZeroBetaReference`).
2. After the host scored it (`_on_scored`): where something reads them (a penalty in the reward, the zero-std mask, a
   β that adapts), the task rewards and their statistics, as one `ScoredBatch`; then the trainer's `_score_kl`.
3. Each micro-batch (`compute_loss`): the trainer's `_loss_and_kl_sums` (the host's loss, with the KL term where it
   belongs there) and the `(5, B)` per-sequence sums of the KL's statistics, which `KLMonitor` keeps.
4. The optimizer step's last micro-batch (`_end_of_step`): β's update, and the KL-triggered reset's decision.
5. Each log line (`log`): the `adaptive_kl/*` metrics of the micro-batches since the last, in one reduction.

β, the reference resets and the zero-β skip hold their own state (`kl.controller`, `reference`); a feature that is
off is `None` or never called. `AdaptiveKLStateCallback` keeps β's state in every checkpoint.
"""

from __future__ import annotations

import gc
import math
import os
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import peft
import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..kl.controller import BetaController
from ..kl.groups import zero_std_group_fraction
from ..kl.metrics import STAT_NAMES, kl_metrics, statistics_of_sequences
from ..kl.placement import sequence_kl_penalty, total_rewards
from .callbacks import DriftCallback
from .hooks import (
    HostScoring,
    check_host_attributes,
    host_built_without_reference,
    host_models,
    resolve_args,
)
from .reference import (
    ReferenceResets,
    ZeroBetaReference,
    copy_policy_to_reference,
    load_reference,
    prepare_reference_resets,
    reference_unread_at_zero_beta,
    restore_trained_adapter,
    save_reference,
    warn_if_reference_is_base,
)
from .state import STATE_CALLBACK, check_resumed_kl_state, resumes_past_the_switch, saved_attribute


@dataclass(frozen=True)
class ScoredBatch:
    """One generation batch as the trainer scored it: what every optimizer step it serves reads.

    Attributes:
        beta (`float`), scale (`float`): β_t and its schedule factor at the first optimizer step it serves (the next
            one, in evaluation); a penalty in the reward is computed with it, for every step the batch serves.
        rewards (`torch.Tensor` of shape `(N,)`): every process's total task rewards, as TRL logs `reward` (NaN where
            none was scored).
        mean_reward (`float`): their mean (NaN if none was scored): what a reward-triggered β (`dynamic`) reads.
        zero_std_fraction (`float`): the fraction of groups whose rewards all agree, NaN when no group has two scored:
            what a saturation-triggered β reads, and a target-KL controller's hold.
    """

    beta: float
    scale: float
    rewards: torch.Tensor
    mean_reward: float
    zero_std_fraction: float


@dataclass
class KLMonitor:
    """The KL statistics of one trainer's loss, between optimizer steps and between log lines.

    Each micro-batch's `(5, B)` per-sequence sums (`kl.metrics.kl_sequence_sums`, this process's) are kept as they
    are, or only counted when it was scored without the reference (β_t = 0). They become statistics
    (`kl.metrics.STAT_NAMES`), summed over processes in one reduction, only when read: at the end of an optimizer step
    if anything reads its KL (`reads_steps`; `end_step`), and at each log line (`write_metrics`, a collective: every
    process logs at the same steps).
    """

    reads_steps: bool = True
    step_sums: list[torch.Tensor] = field(default_factory=list)  # the optimizer step in progress's, in training
    log_sums: dict[str, list[torch.Tensor]] = field(default_factory=lambda: {"train": [], "eval": []})
    # per mode, since the last log: [micro-batches recorded, of them scored without the reference]
    counts: dict[str, list[int]] = field(default_factory=lambda: {"train": [0, 0], "eval": [0, 0]})
    last_beta: dict[str, tuple[float, float]] = field(default_factory=dict)  # per mode: the last (β_t, its scale)
    zero_std_fractions: list[float] = field(default_factory=list)  # what a saturation trigger read since the last log

    def record(self, sums: torch.Tensor | None, mode: str, beta: float, scale: float) -> None:
        """Keeps one micro-batch's sums (None: scored without the reference) and the β it applied."""
        self.last_beta[mode] = (beta, scale)
        self.counts[mode][0] += 1
        if sums is None:
            self.counts[mode][1] += 1
            return
        self.log_sums[mode].append(sums)
        if mode == "train" and self.reads_steps:
            self.step_sums.append(sums)

    def end_step(self, sum_over_processes) -> torch.Tensor | None:
        """The statistics of the optimizer step that just ended, summed by `sum_over_processes`; None when none of its
        micro-batches was scored with the reference."""
        sums, self.step_sums = self.step_sums, []
        return sum_over_processes(statistics_of_sequences(torch.cat(sums, 1))) if sums else None

    def write_metrics(self, metrics: dict[str, list[float]], mode: str, sum_over_processes) -> bool:
        """Writes the `adaptive_kl/*` metrics of the micro-batches since the last log into TRL's `metrics` of `mode`
        (which it averages, and prefixes with `eval_` in evaluation), their statistics summed by `sum_over_processes`,
        and starts the next log's. Returns whether it wrote any: False when no micro-batch went through the loss."""
        scored, skipped = self.counts[mode]
        if not scored:
            return False
        beta, scale = self.last_beta[mode]
        if self.log_sums[mode]:  # the KL metrics: of the micro-batches scored with the reference only
            stats = sum_over_processes(statistics_of_sequences(torch.cat(self.log_sums[mode], 1)))
            for key, value in kl_metrics(stats, beta=beta, beta_scale=scale).items():
                metrics[key] = [value]
        else:
            metrics["adaptive_kl/current_beta"], metrics["adaptive_kl/beta_scale"] = [beta], [scale]
        metrics["adaptive_kl/reference_skipped"] = [skipped / scored]
        if mode == "train" and self.zero_std_fractions:  # what the saturation trigger read, averaged like TRL's
            finite = [value for value in self.zero_std_fractions if not math.isnan(value)]  # NaN: nothing measured
            metrics["adaptive_kl/zero_std_fraction"] = [sum(finite) / len(finite) if finite else float("nan")]
            self.zero_std_fractions = []
        self.log_sums[mode], self.counts[mode] = [], [0, 0]
        return True


@dataclass(eq=False)
class AdaptiveKLStateCallback(TrainerCallback, ExportableState):
    """Saves the `BetaController` state (and the `ReferenceResets` state when resets are on) in every checkpoint's
    `trainer_state.json`, under `stateful_callbacks["AdaptiveKLStateCallback"]`, and restores it in `on_train_begin`
    of a resumed run (`state.check_resumed_kl_state` checked it), whatever `restore_callback_states_from_checkpoint`
    says. `on_save` hands each saved checkpoint directory to `on_saved`.
    """

    controller: BetaController | None = None
    controller_state: dict | None = None
    resets: ReferenceResets | None = None
    reference_reset_state: dict | None = None
    on_saved: Callable[[str], None] | None = None
    drift: DriftCallback | None = None  # the drift controller's held-out texts, kept as token ids
    drift_texts: list | None = None

    def state(self) -> dict:
        attributes = {"controller_state": self.controller.state_dict()}
        if self.resets is not None and self.resets.enabled:
            attributes["reference_reset_state"] = self.resets.state_dict()
        if self.drift is not None and self.drift.rows is not None:
            attributes["drift_texts"] = self.drift.state_dict()
        return {"args": {}, "attributes": attributes}

    def on_train_begin(self, args, state, control, **kwargs):
        # A state resumed from a checkpoint without ours (stock TRL's) has no entry, and Transformers' save would
        # fail with a KeyError before writing trainer_state.json: give it the entry every later save updates.
        saved = state.stateful_callbacks.setdefault(STATE_CALLBACK, self.state())
        if state.global_step == 0:  # a run from the start: the entry is this run's own
            return
        controller_state = saved_attribute(saved, "controller_state") or self.controller_state
        if controller_state is not None:
            self.controller.load_state_dict(controller_state)
        reset_state = saved_attribute(saved, "reference_reset_state") or self.reference_reset_state
        if reset_state is not None and self.resets is not None:
            self.resets.load_state_dict(reset_state)
        drift_texts = saved_attribute(saved, "drift_texts") or self.drift_texts
        if self.drift is not None and drift_texts is not None:
            self.drift.load_state_dict(drift_texts)
        elif self.drift is not None and controller_state is not None and not args.resume_without_kl_state:
            raise ValueError(
                "The checkpoint has no drift texts (stateful_callbacks['AdaptiveKLStateCallback']['attributes']"
                "['drift_texts']), which kl_controller='drift' measures on: it was not saved by a drift-controlled "
                "run. Resume it with its own kl_controller, or set resume_without_kl_state=True to measure the "
                "eval_dataset's texts from here on."
            )

    def on_save(self, args, state, control, **kwargs):
        # Under a hyperparameter search Transformers saves in a run directory per trial, not here: say so rather than
        # write beside it.
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR  # not at import: see `check_trl_version`

        if self.on_saved is None or not args.should_save:
            return
        checkpoint = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if not os.path.isdir(checkpoint):
            warnings.warn(
                f"{checkpoint} was not saved where Transformers saves checkpoints outside a hyperparameter search: "
                "what adaptive-kl adds to a checkpoint (a reset reference's weights) is not in it.",
                UserWarning,
                stacklevel=2,
            )
            return
        self.on_saved(checkpoint)


class AdaptiveKLRun:
    """Base placed before `hooks.HostHooks` and the host trainer in an adaptive-KL trainer's bases.

    A trainer sets `host_class` (the TRL trainer it subclasses), `host_family` (`"grpo"` or `"rloo"`) and
    `config_class`, and implements:

    - `_prepare_host(args, more, kwargs)`: before the host's `__init__`, its checks (`hooks.check_host` first) and
      what it decides of the config (`kl_in_reward`, ...);
    - `_score_kl(scoring, batch)`: what its KL does to a scored batch (a penalty in the reward, new advantages);
    - `_loss_and_kl_sums(model, inputs, return_outputs, num_items_in_batch, mode, beta) -> (loss, sums)`: the
      micro-batch's loss, with the KL term at `beta` where the KL is in the loss, and this process's `(5, B)`
      `kl.metrics.kl_sequence_sums` (None when the batch was scored without the reference).

    Besides the trainers' `beta_controller` and `reference_resets`, it sets `zero_beta` (a `ZeroBetaReference`, or
    `None` where β cannot reach 0 for good or `skip_zero_beta_reference=False`), `kl_monitor` (`KLMonitor`) and
    `scored_batches` (per mode, the `ScoredBatch` in use, where something reads it).
    """

    host_class: type
    host_family: str
    config_class: type
    kl_in_reward = False  # the trainer's KL is a penalty in the reward, computed once per generation batch
    kl_mask_zero_std_groups = False  # its KL leaves out the completions of zero-std groups
    host_log_ratio_clip: float | None = None  # the clamp of the log-ratio the host's own loss applies (Unsloth: ±20)
    _unsloth_module = None  # the generated module of Unsloth's trainer the host is, if it is one

    def __init__(self, model, reward_funcs=None, args=None, *more, **kwargs):
        name = type(self).__name__
        args = resolve_args(
            self.host_class, self.host_family, self.config_class, model, args, name, self.host_family.upper()
        )
        self._prepare_host(args, more, kwargs)
        # The host need not load a full-model reference that would never be scored: a resume past the switch, with
        # nothing else reading the reference (`train` then refuses to start anywhere else). A PEFT reference is the
        # base model itself; Unsloth builds its own.
        loads_no_reference = (
            args.beta > 0
            and args.skip_zero_beta_reference
            and reference_unread_at_zero_beta(args)
            and kwargs.get("peft_config") is None
            and not isinstance(model, peft.PeftModel)
            and self._unsloth_module is None
            and resumes_past_the_switch(args, args.resume_from_checkpoint)
        )
        with host_built_without_reference(self, args) if loads_no_reference else nullcontext():
            super().__init__(model, reward_funcs, args, *more, **kwargs)
        check_host_attributes(self, self.host_family)
        if args.beta > 0:
            warn_if_reference_is_base(self.model)
        controller = self.beta_controller = BetaController.from_args(args)
        resets = self.reference_resets = ReferenceResets(args.ref_reset_steps, args.ref_reset_kl)
        if resets.enabled:
            models = host_models(self)
            prepare_reference_resets(
                models.policy, models.sharding_engine, models.zero_stage, clears_optimizer=args.ref_reset_optimizer
            )
        self.zero_beta = None
        if args.beta > 0 and args.skip_zero_beta_reference and args.beta_min == 0 and controller.has_training_state:
            self.zero_beta = ZeroBetaReference(args, controller, self.accelerator.is_main_process, loads_no_reference)
        # What reads the KL of each optimizer step (else it is only logged), and the rewards of each generation batch
        self.reads_step_kl = controller.reads_kl or resets.reads_kl
        self.reads_rewards = self.kl_in_reward or self.kl_mask_zero_std_groups or controller.has_training_state
        # The per-token estimate k and transform f (keyword arguments of `kl.term` and `kl.placement`), read once
        clip = args.kl_log_ratio_clip if args.kl_log_ratio_clip is not None else self.host_log_ratio_clip
        self.kl_transform_options = dict(
            estimator=args.kl_estimator,
            transform=args.kl_transform,
            clip_threshold=args.kl_clip_threshold,
            target=args.kl_target,
            log_ratio_clip=clip,
        )
        self.kl_options = dict(self.kl_transform_options, length_normalized="length_normalized" in args.kl_methods)
        self.kl_monitor = KLMonitor(reads_steps=self.reads_step_kl)
        self.scored_batches: dict[str, ScoredBatch] = {}
        self.warned: set[str] = set()  # the run's warnings given, each at most once per `train()` call
        # The drift controller's measurement, after the state callback, which gives it a resumed run's texts first
        drift = None
        if controller.reads_drift:
            models = host_models(self)
            if models.sharding_engine == "fsdp" or models.zero_stage == 3:
                raise ValueError(
                    "kl_controller='drift' is not supported with FSDP or DeepSpeed ZeRO-3: it scores held-out texts "
                    "with the unwrapped policy and reference, whose sharded parameters it would have to gather. Use "
                    "DDP or ZeRO-1/2, or another kl_controller."
                )
            drift = DriftCallback(self, self.eval_dataset)
        self.add_callback(
            AdaptiveKLStateCallback(controller, resets=resets, on_saved=self._save_reference, drift=drift)
        )
        if drift is not None:
            self.add_callback(drift)

    # --- a generation batch ----------------------------------------------------------------------------------------

    def _before_scoring(self, mode: str) -> bool:
        if self.model.training and self.reference_resets.pending:
            models = host_models(self)
            copy_policy_to_reference(models.policy, models.reference)
            if self.args.ref_reset_optimizer:  # each parameter's moments start afresh at its next step
                models.optimizer.state.clear()
            self.reference_resets.applied(self.state.global_step)
        if self.zero_beta is None:
            return True
        step = self.state.global_step + 1  # the first optimizer step the batch serves (the next one, in evaluation)
        if self.zero_beta.scores_reference(mode, step, self.state.logging_steps):
            return True
        models = host_models(self)
        if self.zero_beta.may_release(models.reference, models.sharding_engine):
            # Dropped from the trainer and from the `Accelerator`'s hold on it, its memory is freed
            reference, self.ref_model = self.ref_model, None
            self.accelerator._models = [model for model in self.accelerator._models if model is not reference]
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.zero_beta.mark_released(step)
        return False

    def _on_scored(self, scoring: HostScoring) -> None:
        counts = torch.isinf(scoring.rewards_per_func).sum(dim=0).tolist()  # per reward function
        if any(counts):
            named = ", ".join(f"{name} ({n})" for name, n in zip(self.reward_func_names, counts) if n)
            self._warn_once(
                "infinite_rewards",
                f"Reward functions returned ±inf for some of the {len(scoring.rewards_per_func)} completions of a "
                f"generation batch: {named}. TRL takes only None (NaN) as 'no reward'; an infinite reward makes the "
                "advantages of its group non-finite, so those completions do not train, and a reward-triggered β "
                "(dynamic) skips the step. Return finite rewards, or None where a function does not apply.",
            )
        if not self.reads_rewards:
            return
        step = self.state.global_step + 1  # the first optimizer step the batch serves (the next one, in evaluation)
        group_size = self.num_generations if scoring.mode == "train" else self.num_generations_eval
        rewards = total_rewards(scoring.rewards_per_func, self.reward_weights)  # (N,), as TRL logs `reward`
        beta, scale = self.beta_controller.beta_and_scale(step)
        batch = self.scored_batches[scoring.mode] = ScoredBatch(
            beta=beta,
            scale=scale,
            rewards=rewards,
            mean_reward=torch.nanmean(rewards).item(),
            zero_std_fraction=zero_std_group_fraction(rewards, group_size),
        )
        self._score_kl(scoring, batch)

    def _kl_penalty(self, policy_logps, ref_logps, mask, beta: float, logps_dtype: torch.dtype) -> torch.Tensor:
        """The `(B,)` detached penalties β_t·Σ_t f(k) of this process's sequences; for a batch scored without the
        reference (`ref_logps` is `None`: β_t = 0 for every step it serves), exactly 0 in the dtype the full path would
        have from log-probabilities of `logps_dtype` (float32, or float64 for float64 ones: `sequence_kl_penalty`
        upcasts half precision before the estimate), so that the penalized rewards and their advantages are those of
        the run without the skip, bit for bit, on every dtype (in bfloat16 they would round)."""
        if ref_logps is None:
            return torch.zeros(len(mask), dtype=torch.promote_types(logps_dtype, torch.float32), device=mask.device)
        return sequence_kl_penalty(policy_logps, ref_logps, mask, beta=beta, **self.kl_options)

    def _penalize(self, scoring: HostScoring, rewards, penalty: torch.Tensor, advantages_of=None):
        """Gathers this process's `(B,)` `penalty` in the global order of the `(N,)` `rewards` and logs its mean
        (`adaptive_kl/reward_penalty`, whoever subtracts it). With `advantages_of` ((N,) rewards → advantages), the
        advantages of the scored batch become those of the penalized rewards, in its output and in the completions
        table; returns the penalized rewards (else None)."""
        penalties = self.accelerator.gather(penalty)
        self._metrics[scoring.mode]["adaptive_kl/reward_penalty"].append(penalties.nanmean().item())
        if advantages_of is None:
            return None
        penalized = rewards.to(penalties.dtype) - penalties
        advantages = advantages_of(penalized)
        output = scoring.output
        rows = len(output["completion_ids"])  # this process's rows, sliced as TRL slices its advantages
        start = self.accelerator.process_index * rows
        output["advantages"] = advantages[start : start + rows].to(output["advantages"].dtype)
        scoring.log.write("advantages", advantages.tolist())
        return penalized

    def _warn_once(self, key: str, message: str) -> None:
        """A `UserWarning` given at most once per `train()` call, by the main process only (every process sees the
        same reduced statistics)."""
        if key not in self.warned:
            self.warned.add(key)
            if self.accelerator.is_main_process:
                warnings.warn(message, UserWarning, stacklevel=3)

    # --- checkpoints -------------------------------------------------------------------------------------------------

    def _save_reference(self, checkpoint: str) -> None:
        if self.reference_resets.num_resets > 0:  # the reference's weights now differ from the loaded model's
            models = host_models(self)
            save_reference(checkpoint, models.policy, models.reference)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        restore_trained_adapter(host_models(self).policy, resume_from_checkpoint)

    def _load_callback_state(self):
        super()._load_callback_state()
        # With `restore_callback_states_from_checkpoint=True` Transformers re-instantiates callbacks from their
        # saved args; give the new instance our controller, resets and drift texts' holder (its `on_train_begin` then
        # loads their state).
        callbacks = self.callback_handler.callbacks
        drift = next((callback for callback in callbacks if isinstance(callback, DriftCallback)), None)
        for callback in callbacks:
            if isinstance(callback, AdaptiveKLStateCallback) and callback.controller is None:
                callback.controller, callback.resets = self.beta_controller, self.reference_resets
                callback.on_saved, callback.drift = self._save_reference, drift

    # --- each micro-batch --------------------------------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.beta == 0.0:  # nothing adaptive was asked for (the configs enforce it): stock TRL
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        step = self.state.global_step + 1  # the optimizer step in progress (the next one, in evaluation)
        if self.kl_in_reward and mode in self.scored_batches:
            # The β the penalty was computed with: that of the first step its generation batch serves (they differ
            # when one batch serves several optimizer steps and β changes)
            beta, scale = self.scored_batches[mode].beta, self.scored_batches[mode].scale
        else:
            beta, scale = self.beta_controller.beta_and_scale(step)
        loss, sums = self._loss_and_kl_sums(model, inputs, return_outputs, num_items_in_batch, mode, beta)
        self.kl_monitor.record(sums, mode, beta, scale)
        if mode == "train" and self.accelerator.sync_gradients:  # its last micro-batch: β changes for the next step
            self._end_of_step(step)
        return loss

    def sum_over_processes(self, values: torch.Tensor) -> torch.Tensor:
        """`values` summed over the processes (a collective: every process calls it); on one process, `values`
        (Accelerate's reduce would only copy them)."""
        if self.accelerator.num_processes == 1:
            return values
        return self.accelerator.reduce(values, reduction="sum")

    def _end_of_step(self, step: int) -> None:
        """After the last micro-batch of optimizer step `step`: the controller's update from the step's statistics
        (or the scored batch's mean reward, or its fraction of zero-std groups, for `dynamic`), the warning when it
        could not update, and the KL-triggered reference reset's decision."""
        controller = self.beta_controller
        if not (controller.has_training_state or self.reference_resets.enabled):
            controller.update(step)  # β is a function of the step: the update only records it (checkpoints save it)
            return
        stats = self.kl_monitor.end_step(self.sum_over_processes) if self.reads_step_kl else None
        sums = dict(zip(STAT_NAMES, stats.tolist())) if stats is not None else dict.fromkeys(STAT_NAMES, 0.0)
        mean_kl = sums["raw_kl"] / sums["tokens"] if sums["tokens"] > 0 else math.nan  # NaN where nothing reads it
        scored = self.scored_batches.get("train")
        mean_reward = scored.mean_reward if scored is not None else math.nan
        zero_std_fraction = scored.zero_std_fraction if scored is not None else math.nan
        skipped = controller.num_skipped_updates
        saturation = controller.dynamic and controller.dynamic_trigger == "saturation"
        if saturation:
            self.kl_monitor.zero_std_fractions.append(zero_std_fraction)
        controller.update(
            step,
            mean_reward=mean_reward,
            zero_std_fraction=zero_std_fraction,
            mean_kl=mean_kl,
            num_sequences=int(sums["sequences"]),
        )
        if controller.num_skipped_updates > skipped:
            statistic = f"mean reward {mean_reward}" if controller.dynamic else f"mean KL {mean_kl}"
            why = "a reward function returned ±inf, no completion was scored or had a token, or the log-probabilities "
            why += "overflowed"
            if saturation:
                statistic = f"fraction of zero-std groups {zero_std_fraction}"
                why = "no group of its generation batch had two completions scored"
            self._warn_once(
                "skipped_update",
                f"β was not updated after optimizer step {step}: its {statistic} is not finite ({why}). β "
                f"stays at {controller.beta_base:g} until a step gives a finite value; "
                "adaptive_kl/skipped_updates counts such steps. Warned once per run.",
            )
        if self.reference_resets.enabled:
            self.reference_resets.end_of_step(step, mean_kl)

    # --- each log line -----------------------------------------------------------------------------------------------

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        metrics = self._metrics[mode]
        written = self.kl_monitor.write_metrics(metrics, mode, self.sum_over_processes)
        if written and mode == "train":
            controller, resets = self.beta_controller, self.reference_resets
            if controller.has_training_state:
                metrics["adaptive_kl/skipped_updates"] = [float(controller.num_skipped_updates)]
            if controller.reads_kl:
                metrics["adaptive_kl/held_updates"] = [float(controller.num_held_updates)]
            if resets.enabled:
                metrics["adaptive_kl/ref_resets"] = [float(resets.num_resets)]
                metrics["adaptive_kl/ref_reset_step"] = [float(resets.last_reset_step)]
        if mode == "eval" and self.zero_beta is not None:  # the next evaluation measures its first batch again
            self.zero_beta.eval_monitored = False
        super().log(logs, start_time)

    # --- a run -------------------------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        # A run that does not resume starts from step 1 with a new optimizer, so β starts afresh too; a resumed run
        # gets the checkpoint's state. Nothing measured by an earlier (perhaps interrupted) run carries over.
        zero_beta = self.zero_beta
        if zero_beta is not None:  # a released reference serves only a resume past the switch; the run measures afresh
            if zero_beta.released and not resumes_past_the_switch(self.args, resume_from_checkpoint):
                raise ValueError(
                    f"Cannot train from resume_from_checkpoint={resume_from_checkpoint!r}: {zero_beta.why_none}"
                )
            zero_beta.monitored_window, zero_beta.eval_monitored = None, False
        # An exception (e.g. from a reward function) can interrupt an optimizer step after some of its micro-batches
        # were recorded: those partial sums must not leak into this run.
        self.kl_monitor = KLMonitor(reads_steps=self.reads_step_kl)
        self.warned.clear()
        self.scored_batches = {}
        resumed = None
        if resume_from_checkpoint:
            resumed = check_resumed_kl_state(self.args, self.beta_controller, resume_from_checkpoint)
        if resumed is not None and resumed[1] is not None:  # its state is loaded by the state callback
            checkpoint, reset_state = resumed[0], resumed[1]["reference_reset_state"]
            num_resets = int(reset_state["num_resets"]) if reset_state is not None else 0
            if num_resets > 0 and not self.reference_resets.enabled:
                raise ValueError(
                    f"{checkpoint} was saved after {num_resets} reference reset(s), but this run sets no resets "
                    "(ref_reset_steps=0, ref_reset_kl=0): its reference would silently go back to the loaded model. "
                    "Resume with the run's ref_reset_steps / ref_reset_kl."
                )
            if num_resets > 0:  # the reference's weights, as the checkpoint's run had reset them
                models = host_models(self)
                load_reference(checkpoint, models.policy, models.reference)
        else:
            if resumed is not None and self.beta_controller.has_training_state:
                self._warn_once(
                    "fresh_beta",
                    f"Resuming from {resumed[0]}, which has no adaptive-KL controller state: β starts afresh "
                    f"at beta={self.args.beta} (resume_without_kl_state=True).",
                )
            self.beta_controller.reset()  # a fixed β_base is a function of the step: nothing is lost
        return super().train(resume_from_checkpoint, *args, **kwargs)
