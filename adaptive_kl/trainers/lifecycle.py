"""`AdaptiveKLRun`: what every adaptive-KL trainer does around its host's run, whatever the host (GRPO, RLOO).

It builds the collaborators that carry the KL state (`beta_controller`, `resetter`, `zero_beta`, `rollouts`,
`kl_monitor`, `run_warnings`), answers the host's extension points that concern them (`hooks.HostHooks`: a new
generation batch, whether it scores the reference, checkpoints saved and loaded), and starts each `train()` call
afresh or from a checkpoint's state. The trainers add what differs: where the KL enters (GRPO's loss or reward, RLOO's
reward) and their own metrics.
"""

from __future__ import annotations

from ..kl.controller import BetaController
from .monitoring import KLMonitor
from .reference import warn_if_reference_is_base
from .resetter import ReferenceResetter
from .rollouts import RolloutScoring
from .run_warnings import RunWarnings
from .state import AdaptiveKLStateCallback, check_resumed_kl_state
from .zero_beta import ZeroBetaReference


class AdaptiveKLRun:
    """Mixin placed before `hooks.HostHooks` and the host trainer in an adaptive-KL trainer's bases.

    Attributes (set by `_build_kl_state`):
        beta_controller (`BetaController`): owns β_t; saved in every checkpoint and restored on resume.
        reference_resets (`ReferenceResets`): when the reference is reset; saved in every checkpoint too.
    """

    def _build_kl_state(self, args, loads_no_reference: bool) -> None:
        """Builds the collaborators, once the host is built; `loads_no_reference`: the host was built without its
        reference (`zero_beta.reference_never_scored`)."""
        if args.beta > 0:
            warn_if_reference_is_base(self.model)
        self.beta_controller = BetaController.from_args(args)
        self.resetter = ReferenceResetter.from_args(self, args)
        self.reference_resets = self.resetter.resets
        # Parsed once: `kl_adaptation_method` is read at every generation batch and micro-batch.
        self._kl_shape = {"transform": args.kl_transform, "length_normalized": "length_normalized" in args.kl_methods}
        self.run_warnings = RunWarnings(is_main_process=self.accelerator.is_main_process)
        self.zero_beta = ZeroBetaReference(self, released=loads_no_reference)
        self.rollouts = RolloutScoring(self)
        self.kl_monitor = KLMonitor(self)
        self.add_callback(AdaptiveKLStateCallback(self.beta_controller, resets=self.reference_resets))

    # --- the host's extension points (`hooks.HostHooks`) -------------------------------------------------------------

    def _on_generation_batch(self) -> None:
        self.resetter.before_generation()

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

    # --- a run -------------------------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        # A run that does not resume starts from step 1 with a new optimizer, so β starts afresh too; a resumed run
        # gets the checkpoint's state. Nothing measured by an earlier (perhaps interrupted) run carries over.
        self.zero_beta.start_run(resume_from_checkpoint)
        self.kl_monitor.start_run()
        self.run_warnings.start_run()
        if resume_from_checkpoint:
            check_resumed_kl_state(self, resume_from_checkpoint)
        else:
            self.beta_controller.reset()
        return super().train(resume_from_checkpoint, *args, **kwargs)
