"""`AdaptiveKLRun`: the base `AdaptiveKLGRPOTrainer` and `AdaptiveKLRLOOTrainer` share, where one generation batch goes
from the host's hook to the loss.

A trainer is `class T(AdaptiveKLRun, HostHooks, <TRL trainer>)` and adds only what differs between hosts. Through one
generation batch:

1. The host is about to generate (`_on_generation_batch`): a reference reset that fell due is applied.
2. `_scores_reference`: whether the host scores the reference (not while β_t is 0 for good: `zero_beta`).
3. The host scored the batch (`_on_scored`): the task rewards are summed, with what the β controllers read (the mean
   reward, the fraction of zero-std groups) and the β of the first optimizer step the batch serves; the trainer then
   names its host's log-probabilities and, where the KL is in the reward, subtracts the penalty (`_kl_penalty`) from
   the rewards and replaces the host's advantages (`_penalize`). The result is one `ScoredBatch`, kept per mode in
   `scored_batches` for the steps it serves.
4. Each micro-batch (`compute_loss`): the trainer's `_loss_and_kl_sums` (the host's loss, plus the KL term
   where the KL is in the loss) and the per-sequence sums of the KL's statistics, or, where no step reads them, what
   they are made of (`monitoring.PendingSums`, measured at the log line), which `kl_monitor` keeps.
5. The optimizer step's last micro-batch (`_end_of_step`): the controller's update from the step's KL statistics (read
   only where a controller or a reset reads the KL) or
   the scored batch's mean reward or zero-std fraction, and the KL-triggered reference reset's decision.

The collaborators hold their own state and take the values they use, never the trainer: `beta_controller` (β_t),
`reference_resets` (when the reference is reset), `zero_beta` (the reference skipped while β is 0), `kl_monitor` (the
KL statistics per step and per log line) and `run_warnings`. What is done to the host's models goes through `hooks`.
"""

from __future__ import annotations

import functools
import gc
import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..kl.controller import BetaController
from ..kl.groups import zero_std_group_fraction
from ..kl.metrics import STAT_NAMES
from ..kl.placement import sequence_kl_penalty, total_rewards, zero_penalty
from .hooks import (
    HostScoring,
    check_host_attributes,
    host_beta,
    host_built_without_reference,
    host_models,
    host_rewards,
    metric_store,
    release_reference_model,
    replace_logged_advantages,
    resolve_args,
)
from .monitoring import KLMonitor, PendingSums
from .reference import (
    ReferenceResets,
    apply_reference_reset,
    load_reference,
    prepare_reference_resets,
    restore_trained_adapter,
    save_reference,
    warn_if_reference_is_base,
)
from .run_warnings import RunWarnings
from .state import AdaptiveKLStateCallback, check_resumed_kl_state
from .zero_beta import ZeroBetaReference, reference_never_scored


@dataclass(frozen=True)
class ScoredBatch:
    """One generation batch as the trainer scored it: what every optimizer step it serves reads.

    Attributes:
        step (`int`): the first optimizer step it serves (the next one, in evaluation).
        beta (`float`): β_t of that step; a penalty in the reward is computed with it, for every step the batch serves.
        scale (`float`): β_t's schedule factor at that step.
        rewards (`torch.Tensor` of shape `(N,)`): the total task rewards of every process's completions, as TRL logs
            `reward` (NaN where no reward function scored one).
        mean_reward (`float`): their mean, NaN when none was scored: what a reward-triggered β (`dynamic`) reads.
        zero_std_fraction (`float`): the fraction of groups whose rewards all agree, NaN when no group has two scored:
            what a saturation-triggered β reads.
        penalty (`torch.Tensor` of shape `(N,)` or `None`): the KL penalties subtracted from the rewards, every
            process's, where the KL is in the reward.
    """

    step: int
    beta: float
    scale: float
    rewards: torch.Tensor
    mean_reward: float
    zero_std_fraction: float
    penalty: torch.Tensor | None = None


def local_rows(values: torch.Tensor, rows: int, process_index: int) -> torch.Tensor:
    """This process's `rows` rows of `values` `(N, ...)`, gathered over processes in process order, as TRL slices its
    advantages."""
    start = process_index * rows
    return values[start : start + rows]


class AdaptiveKLRun:
    """Base placed before `hooks.HostHooks` and the host trainer in an adaptive-KL trainer's bases.

    A trainer sets `host_class` (the TRL trainer it subclasses), `host_family` (`"grpo"` or `"rloo"`), `config_class`,
    `kl_in_reward` (its KL is a penalty in the reward, computed once per generation batch) and `logs_host_kl` (it logs
    TRL's `kl` itself, because its host's loss runs without the KL); and implements `_prepare_host` (its checks before
    the host is built), `_score_kl` (what the KL does to a scored batch) and `_loss_and_kl_sums` (a micro-batch's
    loss with its KL).

    Attributes (set at construction):
        beta_controller (`BetaController`): owns β_t; saved in every checkpoint and restored on resume.
        reference_resets (`ReferenceResets`): when the reference is reset; saved in every checkpoint too.
        scored_batches (`dict[str, ScoredBatch]`): per mode, the generation batch in use.
    """

    host_class: type
    host_family: str
    config_class: type
    kl_in_reward: bool
    logs_host_kl: bool
    host_log_ratio_clip: float | None = None  # the clamp of the log-ratio the host's own loss applies (Unsloth: ±20)
    _unsloth_module = None  # the generated module of Unsloth's trainer the host is, if it is one

    def __init__(self, model, reward_funcs=None, args=None, *more, **kwargs):
        name = type(self).__name__
        args = resolve_args(
            self.host_class, self.host_family, self.config_class, model, args, name, self.host_family.upper()
        )
        self._prepare_host(args, more, kwargs)
        on_unsloth = self._unsloth_module is not None
        loads_no_reference = reference_never_scored(args, model, kwargs.get("peft_config"), on_unsloth)
        with host_built_without_reference(self, args) if loads_no_reference else nullcontext():
            super().__init__(model, reward_funcs, args, *more, **kwargs)
        check_host_attributes(self, self.host_family)
        if args.beta > 0:
            warn_if_reference_is_base(self.model)
        self.beta_controller = BetaController.from_args(args)
        self.reference_resets = ReferenceResets(every_steps=args.ref_reset_steps, kl_threshold=args.ref_reset_kl)
        if self.reference_resets.enabled:
            models = host_models(self)
            prepare_reference_resets(
                models.policy, models.sharding_engine, models.zero_stage, clears_optimizer=args.ref_reset_optimizer
            )
        self.run_warnings = RunWarnings(is_main_process=self.accelerator.is_main_process)
        main = self.accelerator.is_main_process
        self.zero_beta = ZeroBetaReference(args, self.beta_controller, main, released=loads_no_reference)
        self.kl_monitor = KLMonitor(reads_steps=self.reads_step_kl)
        self.scored_batches: dict[str, ScoredBatch] = {}
        self.add_callback(AdaptiveKLStateCallback(self.beta_controller, resets=self.reference_resets))

    def _prepare_host(self, args, more: tuple, kwargs: dict) -> None:
        """Before the host's `__init__`: the trainer's checks of its host and arguments (`hooks.check_host` first)."""
        raise NotImplementedError

    # --- how f(k) is computed --------------------------------------------------------------------------------------

    @functools.cached_property
    def kl_transform_options(self) -> dict:
        """The per-token estimate k and transform f of the config: `estimator`, `transform`, `clip_threshold`,
        `target`, `log_ratio_clip` (the keyword arguments of `kl.placement` and `kl.term`). Read from the config once,
        at its first use, as TRL reads its own settings once: every micro-batch passes them."""
        args = self.args
        clip = args.kl_log_ratio_clip if args.kl_log_ratio_clip is not None else self.host_log_ratio_clip
        return dict(
            estimator=args.kl_estimator,
            transform=args.kl_transform,
            clip_threshold=args.kl_clip_threshold,
            target=args.kl_target,
            log_ratio_clip=clip,
        )

    @functools.cached_property
    def kl_options(self) -> dict:
        """`kl_transform_options`, and whether each sequence's KL is its per-token mean (`length_normalized`)."""
        return dict(self.kl_transform_options, length_normalized="length_normalized" in self.args.kl_methods)

    # --- a generation batch ----------------------------------------------------------------------------------------

    def _on_generation_batch(self, mode: str) -> None:
        if self.model.training and self.reference_resets.pending:
            models = host_models(self)
            optimizer = models.optimizer if self.args.ref_reset_optimizer else None
            apply_reference_reset(models.policy, models.reference, optimizer)
            self.reference_resets.applied(self.state.global_step)

    def _scores_reference(self, mode: str) -> bool:
        step = self.state.global_step + 1  # the first optimizer step the batch serves (the next one, in evaluation)
        if self.zero_beta.scores_reference(mode, step, self.state.logging_steps):
            return True
        if self.zero_beta.may_release(host_models(self)):
            release_reference_model(self)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.zero_beta.mark_released(step)
        return False

    def _on_scored(self, scoring: HostScoring) -> None:
        mode = scoring.mode
        step = self.state.global_step + 1  # the first optimizer step the batch serves (the next one, in evaluation)
        rewards_of = host_rewards(self, mode)
        self._warn_infinite_rewards(scoring.rewards_per_func, rewards_of.names)
        rewards = total_rewards(scoring.rewards_per_func, rewards_of.weights)  # (N,)
        batch = ScoredBatch(
            step=step,
            beta=self.beta_controller.beta(step),
            scale=self.beta_controller.scale(step),
            rewards=rewards,
            mean_reward=torch.nanmean(rewards).item(),
            zero_std_fraction=zero_std_group_fraction(rewards, rewards_of.group_size),
        )
        self.scored_batches[mode] = self._score_kl(scoring, batch)

    def _score_kl(self, scoring: HostScoring, batch: ScoredBatch) -> ScoredBatch:
        """What the trainer's KL does to the scored batch: its penalty in the reward and the advantages it changes, in
        `scoring.output`; returns `batch` with its penalty."""
        raise NotImplementedError

    def _kl_penalty(self, policy_logps, ref_logps, mask, beta: float, logps_dtype: torch.dtype) -> torch.Tensor:
        """The `(B,)` detached penalties β_t·Σ_t f(k) of this process's sequences (`kl.placement.sequence_kl_penalty`);
        for a batch scored without the reference (`ref_logps` is `None`: β_t = 0 for every step it serves), the zero
        penalty in the dtype the full path would have from log-probabilities of `logps_dtype` (`zero_penalty`), so
        that the run is bitwise the one without the skip, on every dtype."""
        if ref_logps is None:
            return zero_penalty(len(mask), logps_dtype, mask.device)
        return sequence_kl_penalty(policy_logps, ref_logps, mask, beta=beta, **self.kl_options)

    def _penalize(self, output: dict, rewards: torch.Tensor, penalty: torch.Tensor, mode: str, advantages_of):
        """Replaces the advantages of `output` by those of the `(N,)` `rewards` minus the `(B,)` `penalty` of this
        process's sequences, gathered; `advantages_of` maps the `(N,)` penalized rewards to advantages (GRPO's group
        advantages, RLOO's leave-one-out ones). Returns the `(N,)` penalties and penalized rewards."""
        penalties = self._gather_penalties(penalty, mode)
        penalized = rewards.to(penalties.dtype) - penalties
        advantages = advantages_of(penalized)
        rows = len(output["completion_ids"])
        output["advantages"] = local_rows(advantages, rows, self.accelerator.process_index).to(
            output["advantages"].dtype
        )
        replace_logged_advantages(self, advantages)
        return penalties, penalized

    def _gather_penalties(self, penalty: torch.Tensor, mode: str) -> torch.Tensor:
        """The `(N,)` penalties of every process's `(B,)` `penalty`, in the global order of the rewards; their mean is
        logged as `adaptive_kl/reward_penalty`, whether the host or we subtract them."""
        penalties = self.accelerator.gather(penalty)
        metric_store(self, mode)["adaptive_kl/reward_penalty"].append(penalties.nanmean().item())
        return penalties

    def _warn_infinite_rewards(self, rewards_per_func: torch.Tensor, names: list[str]) -> None:
        counts = torch.isinf(rewards_per_func).sum(dim=0).tolist()  # per reward function
        if any(counts):
            named = ", ".join(f"{name} ({count})" for name, count in zip(names, counts) if count)
            self.run_warnings.warn(
                "infinite_rewards",
                f"Reward functions returned ±inf for some of the {len(rewards_per_func)} completions of a generation "
                f"batch: {named}. TRL takes only None (NaN) as 'no reward'; an infinite reward makes the advantages "
                "of its group non-finite, so those completions do not train, and a reward-triggered β (dynamic) "
                "skips the step. Return finite rewards, or None where a function does not apply.",
            )

    # --- checkpoints -------------------------------------------------------------------------------------------------

    def _on_checkpoint_saved(self, checkpoint: str) -> None:
        if self.reference_resets.num_resets > 0:  # the reference's weights now differ from the loaded model's
            models = host_models(self)
            save_reference(checkpoint, models.policy, models.reference)

    def _on_checkpoint_loaded(self, checkpoint: str) -> None:
        restore_trained_adapter(host_models(self).policy, checkpoint)

    def _on_callback_state_loaded(self) -> None:
        # With `restore_callback_states_from_checkpoint=True` Transformers re-instantiates callbacks from their
        # saved args; give the new instance our controller and resets (its `on_train_begin` then loads their state).
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, AdaptiveKLStateCallback) and callback.controller is None:
                callback.controller, callback.resets = self.beta_controller, self.reference_resets

    # --- each micro-batch --------------------------------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if host_beta(self) == 0.0:  # nothing adaptive was asked for (the configs enforce it): stock TRL
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        step = self.state.global_step + 1  # the optimizer step in progress (the next one, in evaluation)
        beta, scale = self.applied_beta(mode, step)
        metrics = metric_store(self, mode)
        host_logged = len(metrics.get("kl", ()))
        loss, sums = self._loss_and_kl_sums(model, inputs, return_outputs, num_items_in_batch, mode, beta)
        if self.logs_host_kl and len(metrics.get("kl", ())) > host_logged:
            # The host's loss ran with β = 0: a `kl` it logged then (Unsloth's logs 0) is not the KL
            del metrics["kl"][host_logged:]
        self.kl_monitor.record(sums, mode, beta, scale)
        if mode == "train" and self.accelerator.sync_gradients:  # its last micro-batch: β changes for the next step
            self._end_of_step(step)
        return loss

    def applied_beta(self, mode: str, step: int) -> tuple[float, float]:
        """`(β_t, its schedule factor)` that the KL of a micro-batch of `mode` at optimizer step `step` is applied
        with: in the loss, the step's own; in the reward, that of the first step its generation batch serves, which
        the penalty was computed with (they differ when one batch serves several optimizer steps and β changes)."""
        if self.kl_in_reward and mode in self.scored_batches:
            batch = self.scored_batches[mode]
            return batch.beta, batch.scale
        return self.beta_controller.beta_and_scale(step)

    def host_compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The host's own `compute_loss`, with the β the host holds (what `_loss_and_kl_sums` builds on)."""
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _loss_and_kl_sums(
        self, model, inputs, return_outputs, num_items_in_batch, mode: str, beta: float
    ) -> tuple[torch.Tensor, torch.Tensor | PendingSums | None]:
        """The micro-batch's loss, with the KL term at `beta` where the KL is in the loss, and the `(5, B)`
        per-sequence sums of the KL's statistics (`kl.metrics.kl_sequence_sums`, this process's sequences), or, where
        no step reads them (`reads_step_kl`), `PendingSums` that make them at the log line; None when the batch was
        scored without the reference."""
        raise NotImplementedError

    @property
    def reads_step_kl(self) -> bool:
        """Whether each optimizer step reads its KL statistics: the controller (a target KL) or the KL-triggered
        reference resets. Otherwise they are only logged, and a micro-batch's sums can wait for the log line."""
        return self.beta_controller.reads_kl or self.reference_resets.reads_kl

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
        stats = self.kl_monitor.end_step(self.sum_over_processes if self.reads_step_kl else None)
        sums = dict(zip(STAT_NAMES, stats.tolist())) if stats is not None else dict.fromkeys(STAT_NAMES, 0.0)
        tokens = sums["tokens"]
        mean_kl = sums["raw_kl"] / tokens if tokens > 0 else math.nan  # NaN too where nothing reads it
        scored = self.scored_batches.get("train")
        mean_reward = scored.mean_reward if scored is not None else math.nan
        zero_std_fraction = scored.zero_std_fraction if scored is not None else math.nan
        skipped = controller.num_skipped_updates
        saturation = controller.dynamic and controller.dynamic_trigger == "saturation"
        if saturation:
            self.kl_monitor.note_zero_std_fraction(zero_std_fraction)
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
            self.run_warnings.warn(
                "skipped_update",
                f"β was not updated after optimizer step {step}: its {statistic} is not finite ({why}). β "
                f"stays at {controller.beta_base:g} until a step gives a finite value; "
                "adaptive_kl/skipped_updates counts such steps. Warned once per run.",
            )
        self.reference_resets.end_of_step(step, mean_kl)

    # --- each log line -----------------------------------------------------------------------------------------------

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        metrics = metric_store(self, mode)
        written = self.kl_monitor.write_metrics(metrics, mode, self.sum_over_processes, host_kl=self.logs_host_kl)
        if written and mode == "train":
            controller, resets = self.beta_controller, self.reference_resets
            if controller.has_training_state:
                metrics["adaptive_kl/skipped_updates"] = [float(controller.num_skipped_updates)]
            if controller.kl_controller != "fixed":
                metrics["adaptive_kl/held_updates"] = [float(controller.num_held_updates)]
            if resets.enabled:
                metrics["adaptive_kl/ref_resets"] = [float(resets.num_resets)]
                metrics["adaptive_kl/ref_reset_step"] = [float(resets.last_reset_step)]
        if mode == "eval":
            self.zero_beta.evaluation_logged()
        super().log(logs, start_time)

    # --- a run -------------------------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        # A run that does not resume starts from step 1 with a new optimizer, so β starts afresh too; a resumed run
        # gets the checkpoint's state. Nothing measured by an earlier (perhaps interrupted) run carries over.
        self.zero_beta.start_run(resume_from_checkpoint)
        self.kl_monitor.start_run()
        self.run_warnings.start_run()
        self.scored_batches = {}
        resumed = None
        if resume_from_checkpoint:
            resumed = check_resumed_kl_state(self.args, self.beta_controller, resume_from_checkpoint)
        if resumed is not None and resumed.saved is not None:  # its state is loaded by the state callback
            self._load_saved_reference(resumed.checkpoint, resumed.reference_reset_state)
        else:
            if resumed is not None and self.beta_controller.has_training_state:
                self.run_warnings.warn(
                    "fresh_beta",
                    f"Resuming from {resumed.checkpoint}, which has no adaptive-KL controller state: β starts afresh "
                    f"at beta={self.args.beta} (resume_without_kl_state=True).",
                )
            self.beta_controller.reset()  # a fixed β_base is a function of the step: nothing is lost
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _load_saved_reference(self, checkpoint: str, reset_state: dict | None) -> None:
        """On resume: the reference's weights saved in `checkpoint`, when its run (`reset_state`) had reset the
        reference.

        Raises:
            ValueError: the checkpoint's run reset the reference, but this run sets no resets.
        """
        num_resets = int(reset_state["num_resets"]) if reset_state is not None else 0
        if num_resets == 0:
            return
        if not self.reference_resets.enabled:
            raise ValueError(
                f"{checkpoint} was saved after {num_resets} reference reset(s), but this run sets no resets "
                "(ref_reset_steps=0, ref_reset_kl=0): its reference would silently go back to the loaded model. "
                "Resume with the run's ref_reset_steps / ref_reset_kl."
            )
        models = host_models(self)
        load_reference(checkpoint, models.policy, models.reference)
