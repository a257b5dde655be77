"""`AdaptiveKLRun`: what every adaptive-KL trainer does around its host's run, whatever the host (GRPO, RLOO).

It builds the collaborators that carry the KL state (`beta_controller`, `resetter`, `zero_beta`, `rollouts`,
`kl_monitor`, `run_warnings`), answers the host's extension points that concern them (`hooks.HostHooks`: a new
generation batch, whether it scores the reference, checkpoints saved and loaded), and runs what is the same for every
host: the β each generation batch is scored with, each micro-batch's loss up to where the KL enters, the end of each
optimizer step (the controller's update, the warnings and the KL-triggered reset), the metrics at each log line, and
the start of each `train()` call, afresh or from a checkpoint's state. The collaborators do not reach into each other:
this base passes them what they need. The trainers add only what differs: where the KL enters (GRPO's loss or reward,
RLOO's reward) and what their host logs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kl.controller import BetaController
from ..kl.metrics import STAT_INDEX
from .hooks import host_beta, metric_store
from .monitoring import KLMonitor
from .reference import warn_if_reference_is_base
from .resetter import ReferenceResetter
from .rollouts import RolloutScoring
from .run_warnings import RunWarnings
from .state import AdaptiveKLStateCallback, check_resumed_kl_state
from .zero_beta import ZeroBetaReference


@dataclass(frozen=True)
class GenerationBatch:
    """The generation batch a mode is training (or evaluating) on: the first optimizer step it serves, and the β_t and
    schedule factor of that step, which a KL in the reward was computed with for every step the batch serves."""

    step: int
    beta: float
    scale: float


class AdaptiveKLRun:
    """Mixin placed before `hooks.HostHooks` and the host trainer in an adaptive-KL trainer's bases.

    A trainer implements `_loss_and_kl_statistics` (the micro-batch's loss with its KL, and the KL's statistics) and
    sets `kl_in_reward` (whether its KL is a penalty in the reward, computed once per generation batch).

    Attributes (set by `_build_kl_state`):
        beta_controller (`BetaController`): owns β_t; saved in every checkpoint and restored on resume.
        reference_resets (`ReferenceResets`): when the reference is reset; saved in every checkpoint too.
        generation_batches (`dict[str, GenerationBatch]`): per mode, the generation batch in use.
    """

    def _build_kl_state(self, args, loads_no_reference: bool) -> None:
        """Builds the collaborators, once the host is built; `loads_no_reference`: the host was built without its
        reference (`zero_beta.reference_never_scored`)."""
        if args.beta > 0:
            warn_if_reference_is_base(self.model)
        self.beta_controller = BetaController.from_args(args)
        self.resetter = ReferenceResetter.from_args(self, args)
        self.reference_resets = self.resetter.resets
        self.run_warnings = RunWarnings(is_main_process=self.accelerator.is_main_process)
        self.zero_beta = ZeroBetaReference(self, self.beta_controller, released=loads_no_reference)
        self.rollouts = RolloutScoring(self, self.run_warnings)
        self.kl_monitor = KLMonitor()
        self.generation_batches: dict[str, GenerationBatch] = {}
        self.add_callback(AdaptiveKLStateCallback(self.beta_controller, resets=self.reference_resets))

    # --- how f(k) is computed --------------------------------------------------------------------------------------

    def kl_transform_options(self) -> dict:
        """The per-token estimate k and transform f of the config: `estimator`, `transform`, `clip_threshold`,
        `target` (the keyword arguments of `kl.placement` and `kl.term`)."""
        args = self.args
        return dict(
            estimator=args.kl_estimator,
            transform=args.kl_transform,
            clip_threshold=args.kl_clip_threshold,
            target=args.kl_target,
        )

    def kl_options(self) -> dict:
        """`kl_transform_options`, and whether each sequence's KL is its per-token mean (`length_normalized`)."""
        return dict(self.kl_transform_options(), length_normalized="length_normalized" in self.args.kl_methods)

    # --- the host's extension points (`hooks.HostHooks`) -------------------------------------------------------------

    def _on_generation_batch(self, mode: str) -> None:
        self.resetter.before_generation()
        step = self.state.global_step + 1  # the first optimizer step the batch serves (the next one, in evaluation)
        controller = self.beta_controller
        self.generation_batches[mode] = GenerationBatch(step, controller.beta(step), controller.scale(step))

    def _scores_reference(self, mode: str) -> bool:
        return self.zero_beta.scores_reference(mode)

    def _on_checkpoint_saved(self, checkpoint: str) -> None:
        self.resetter.checkpoint_saved(checkpoint)

    def _on_checkpoint_loaded(self, checkpoint: str) -> None:
        self.resetter.checkpoint_loaded(checkpoint)

    def _on_callback_state_loaded(self) -> None:
        # With `restore_callback_states_from_checkpoint=True` Transformers re-instantiates callbacks from their
        # saved args; give the new instance our controller and resets (its `on_train_begin` then loads their state).
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, AdaptiveKLStateCallback) and callback.controller is None:
                callback.controller, callback.resets = self.beta_controller, self.reference_resets

    # --- each micro-batch --------------------------------------------------------------------------------------------

    kl_in_reward: bool  # set by each trainer: its KL is a penalty in the reward

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if host_beta(self) == 0.0:  # nothing adaptive was asked for (the configs enforce it): stock TRL
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        step = self.state.global_step + 1  # the optimizer step in progress (the next one, in evaluation)
        beta, scale = self.applied_beta(mode, step)
        loss, stats = self._loss_and_kl_statistics(model, inputs, return_outputs, num_items_in_batch, mode, beta)
        self.kl_monitor.record(stats, mode, beta, scale)
        if mode == "train" and self.accelerator.sync_gradients:  # its last micro-batch: β changes for the next step
            self._end_of_step(step)
        return loss

    def applied_beta(self, mode: str, step: int) -> tuple[float, float]:
        """`(β_t, its schedule factor)` that the KL of a micro-batch of `mode` at optimizer step `step` is applied
        with: in the loss, the step's own; in the reward, that of the first step its generation batch serves, which
        the penalty was computed with (they differ when one batch serves several optimizer steps and β changes)."""
        if self.kl_in_reward and mode in self.generation_batches:
            batch = self.generation_batches[mode]
            return batch.beta, batch.scale
        return self.beta_controller.beta(step), self.beta_controller.scale(step)

    def host_compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The host's own `compute_loss`, with the β the host holds (what `_loss_and_kl_statistics` builds on)."""
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _loss_and_kl_statistics(
        self, model, inputs, return_outputs, num_items_in_batch, mode: str, beta: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The micro-batch's loss, with the KL term at `beta` where the KL is in the loss, and the KL's statistics
        (`kl.metrics.STAT_NAMES`, summed over processes); None when the batch was scored without the reference."""
        raise NotImplementedError

    def _end_of_step(self, step: int) -> None:
        """After the last micro-batch of optimizer step `step`: the controller's update from the step's statistics
        (or the mean reward, or the fraction of zero-std groups, for `dynamic`), the warning when it could not update,
        and the KL-triggered reference reset's decision."""
        stats = self.kl_monitor.end_step()
        stats = stats if stats is not None else torch.zeros(len(STAT_INDEX))
        tokens = stats[STAT_INDEX["tokens"]].item()
        mean_kl = stats[STAT_INDEX["raw_kl"]].item() / tokens if tokens > 0 else float("nan")
        mean_reward, zero_std_fraction = self.rollouts.mean_reward, self.rollouts.zero_std_fraction
        controller = self.beta_controller
        skipped = controller.num_skipped_updates
        saturation = controller.dynamic and controller.dynamic_trigger == "saturation"
        if saturation:
            self.kl_monitor.note_zero_std_fraction(zero_std_fraction)
        controller.update(
            step,
            mean_reward=mean_reward,
            zero_std_fraction=zero_std_fraction,
            mean_kl=mean_kl,
            num_sequences=int(stats[STAT_INDEX["sequences"]].item()),
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
        kept = {key: metrics.pop(key) for key in self.host_metrics_kept if key in metrics}
        if self.kl_monitor.write_metrics(metrics, mode) and mode == "train":
            controller, resets = self.beta_controller, self.reference_resets
            if controller.has_training_state:
                metrics["adaptive_kl/skipped_updates"] = [float(controller.num_skipped_updates)]
            if resets.enabled:
                metrics["adaptive_kl/ref_resets"] = [float(resets.num_resets)]
                metrics["adaptive_kl/ref_reset_step"] = [float(resets.last_reset_step)]
        for key in self.host_metrics_kept:  # the host's value where it logged one, none where it did not
            metrics.pop(key, None)
        metrics.update(kept)
        if mode == "eval":
            self.zero_beta.evaluation_logged()
        super().log(logs, start_time)

    host_metrics_kept: tuple[str, ...] = ()  # the host's metrics that ours would replace, kept as the host logs them

    # --- a run -------------------------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        # A run that does not resume starts from step 1 with a new optimizer, so β starts afresh too; a resumed run
        # gets the checkpoint's state. Nothing measured by an earlier (perhaps interrupted) run carries over.
        self.zero_beta.start_run(resume_from_checkpoint)
        self.kl_monitor.start_run()
        self.run_warnings.start_run()
        self.generation_batches = {}
        if resume_from_checkpoint:
            check_resumed_kl_state(self, resume_from_checkpoint)
        else:
            self.beta_controller.reset()
        return super().train(resume_from_checkpoint, *args, **kwargs)
