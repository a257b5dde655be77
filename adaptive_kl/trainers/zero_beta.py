"""The reference model while β is 0 for good: its scoring skipped, then its memory released.

With `skip_zero_beta_reference=True`, a generation batch whose first optimizer step has β_t = 0 for good
(`BetaController.is_zero_from`: a `dynamic` schedule that reached `beta_min=0`) is scored without the reference:
its KL term is exactly 0, so the reference forward would be wasted. Some batches are measured anyway
(`kl_monitor_steps`), and when nothing else ever reads the reference (no monitoring, resets or `sync_ref_model`), a
full-model reference is freed, or not loaded at all on a resume past the switch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from peft import PeftModel
from transformers.utils import logging

from ..kl.controller import BetaController
from .hooks import HostModels
from .kl_fields import AdaptiveKLFields
from .state import resumes_past_the_switch


# The trainer's logger, where its users already filter these messages.
logger = logging.get_logger("adaptive_kl.trainers.grpo")


def reference_unread_at_zero_beta(args) -> bool:
    """Whether nothing but the KL term reads the reference while β is 0 for good: no KL monitoring
    (`kl_monitor_steps=0`), no reference resets, no `sync_ref_model`."""
    return (
        args.kl_monitor_steps == 0 and args.ref_reset_steps == 0 and args.ref_reset_kl == 0 and not args.sync_ref_model
    )


def reference_never_scored(args, model, peft_config, on_unsloth: bool) -> bool:
    """Before the host's `__init__`: whether a full-model reference would never be scored in this trainer's runs, so
    the host need not load it: `args.resume_from_checkpoint` starts past the switch (β is 0 for good) and nothing
    reads the reference there (no monitoring, resets or `sync_ref_model`). `train` then refuses to start anywhere
    else. A PEFT reference is the base model itself (nothing to save); Unsloth builds its own."""
    return (
        args.beta > 0
        and args.skip_zero_beta_reference
        and reference_unread_at_zero_beta(args)
        and peft_config is None
        and not isinstance(model, PeftModel)
        and not on_unsloth
        and resumes_past_the_switch(args, args.resume_from_checkpoint)
    )


@dataclass
class ZeroBetaReference:
    """Decides, batch by batch, whether the reference is scored, and when a full-model reference may be freed.

    Args:
        args: the trainer's config (`skip_zero_beta_reference`, `kl_monitor_steps`, the resets, `beta`, ...).
        controller (`BetaController`): the trainer's β, which says from which step it is 0 for good.
        is_main_process (`bool`): whether this process tells what it did (once, for every process).
        released (`bool`): the reference model is gone: freed, or never loaded (`reference_never_scored`).
        monitored_window (`int` or `None`): the last window of `kl_monitor_steps` optimizer steps measured anyway.
        eval_monitored (`bool`): whether the evaluation in progress measured its first batch.
    """

    args: AdaptiveKLFields = field(repr=False)
    controller: BetaController = field(repr=False)
    is_main_process: bool = True
    released: bool = False
    monitored_window: int | None = None
    eval_monitored: bool = False

    def __post_init__(self):
        if self.released and self.is_main_process:
            args = self.args
            logger.warning(
                f"Resuming from {args.resume_from_checkpoint}, where β is 0 for good (kl_adaptation_method='dynamic', "
                f"beta_schedule_steps={args.beta_schedule_steps}, beta_min=0) and kl_monitor_steps=0: the reference "
                "model is not loaded."
            )

    def scores_reference(self, mode: str, step: int, logging_steps: int | None) -> bool:
        """Whether the generation batch about to be scored, whose first optimizer step is `step`, needs the reference
        log-probabilities: not when β_t is 0 for every optimizer step it serves (the first one decides: see
        `BetaController.is_zero_from`), unless the KL is monitored on this batch (`logging_steps`: the default
        monitoring interval) or a KL-triggered reference reset reads every step's KL.

        Raises:
            ValueError: the batch needs the reference, but it was released.
        """
        args = self.args
        if args.beta == 0.0:  # stock TRL: no reference at all
            return True
        if (
            not args.skip_zero_beta_reference
            or args.ref_reset_kl > 0
            or not self.controller.is_zero_from(step)
            or self.monitor_due(mode, step, logging_steps)
        ):
            if self.released:
                raise ValueError(
                    f"Optimizer step {step} needs the reference model (β is not 0 there), but {self.why_none}"
                )
            return True
        return False

    def monitor_due(self, mode: str, step: int, logging_steps: int | None) -> bool:
        """Whether this skippable batch is measured anyway (`kl_monitor_steps`): the first one of each window of that
        many optimizer steps (windows aligned with the log lines by default), and the first one of each evaluation."""
        every = self.args.kl_monitor_steps
        if every is None:
            every = max(int(logging_steps or 1), 1)
        if every == 0:
            return False
        if mode == "eval":
            due, self.eval_monitored = not self.eval_monitored, True
            return due
        window = (step - 1) // every
        due, self.monitored_window = window != self.monitored_window, window
        return due

    @property
    def why_none(self) -> str:
        """Why the trainer holds no reference model, and what to do instead."""
        return (
            "this trainer holds no reference model: it was freed once β reached 0 for good, or not loaded because "
            "args.resume_from_checkpoint was past the switch (skip_zero_beta_reference=True, kl_monitor_steps=0). "
            f"Train from a checkpoint saved at step {self.args.beta_schedule_steps - 1} or later "
            "(train(resume_from_checkpoint=...)), build a new trainer to train from elsewhere, or set "
            "kl_monitor_steps > 0 to keep the reference."
        )

    def may_release(self, models: HostModels) -> bool:
        """Whether a skipped batch's trainer may free its full-model reference now: it has one, and nothing else reads
        it (no monitoring, no reference resets, no `sync_ref_model`, no sharded engine that owns it). A PEFT
        reference is the base model itself."""
        return (
            not self.released
            and models.reference is not None
            and reference_unread_at_zero_beta(self.args)
            and models.sharding_engine is None
        )

    def mark_released(self, step: int) -> None:
        """The reference was freed before optimizer step `step`: no batch may ask for it again."""
        self.released = True
        if self.is_main_process:
            logger.warning(
                f"β is 0 from optimizer step {step} on (kl_adaptation_method='dynamic', "
                f"beta_schedule_steps={self.args.beta_schedule_steps}, beta_min=0) and kl_monitor_steps=0: the "
                "reference model is no longer scored, and its memory was freed."
            )

    def start_run(self, resume_from_checkpoint) -> None:
        """Before `train()`: refuses a start the released reference cannot serve, and measures afresh.

        Raises:
            ValueError: the reference is gone and the run does not resume past the switch.
        """
        if self.released and not resumes_past_the_switch(self.args, resume_from_checkpoint):
            raise ValueError(f"Cannot train from resume_from_checkpoint={resume_from_checkpoint!r}: {self.why_none}")
        self.monitored_window, self.eval_monitored = None, False
