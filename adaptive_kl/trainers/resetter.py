"""`ReferenceResetter`: applies the reference resets that `reference.ReferenceResets` schedules to a trainer's models
and checkpoints.

A reset falls due at the end of an optimizer step and is applied before the next training generation batch is scored;
after the first one, every checkpoint saves the reference's weights, and a resumed run loads them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import peft
from packaging.version import Version
from peft import PeftModel

from .hooks import host_optimizer, reference_model, sharding_engine
from .reference import (
    REFERENCE_ADAPTER,
    ReferenceResets,
    add_reference_adapter,
    copy_policy_to_reference,
    load_reference,
    restore_trained_adapter,
    save_reference,
)


@dataclass
class ReferenceResetter:
    """The reference resets of one trainer.

    Args:
        trainer (`AdaptiveKLGRPOTrainer` or `AdaptiveKLRLOOTrainer`): the trainer whose reference is reset.
        resets (`ReferenceResets`): when, and how often so far (every checkpoint saves it: `AdaptiveKLStateCallback`).
    """

    trainer: object = field(repr=False)
    resets: ReferenceResets

    @classmethod
    def from_args(cls, trainer, args) -> ReferenceResetter:
        """The resetter of `args.ref_reset_steps` / `args.ref_reset_kl`, its trainer prepared when resets are on."""
        resetter = cls(trainer, ReferenceResets(every_steps=args.ref_reset_steps, kl_threshold=args.ref_reset_kl))
        if resetter.resets.enabled:
            resetter.prepare()
        return resetter

    def prepare(self) -> None:
        """Refuses what a reset cannot handle, and gives a PEFT policy the `"ref"` adapter a reset copies into."""
        trainer = self.trainer
        engine = sharding_engine(trainer)
        if engine == "fsdp" or (engine == "deepspeed" and trainer.accelerator.state.deepspeed_plugin.zero_stage == 3):
            raise ValueError(
                "Reference resets (ref_reset_steps, ref_reset_kl) are not supported with FSDP or DeepSpeed ZeRO-3, "
                "whose sharded parameters a reset would have to gather: use DDP or ZeRO-1/2, or no resets."
            )
        if trainer.args.ref_reset_optimizer and engine == "deepspeed":
            raise ValueError(
                "ref_reset_optimizer=True is not supported with DeepSpeed, whose optimizer state lives in its engine: "
                "set ref_reset_optimizer=False."
            )
        model = trainer.model
        if isinstance(model, PeftModel) and REFERENCE_ADAPTER not in model.peft_config:
            config = model.peft_config[model.active_adapter]
            if getattr(config, "target_parameters", None) and Version(peft.__version__) < Version("0.20.0"):
                raise ValueError(
                    "Reference resets of a LoRA adapter with target_parameters need a second adapter, which "
                    "peft<0.20 cannot add (peft#3340): upgrade peft, or use no resets."
                )
            add_reference_adapter(model)

    def models(self):
        """The unwrapped policy and TRL's reference model (`None` for PEFT: the `"ref"` adapter)."""
        trainer = self.trainer
        return trainer.accelerator.unwrap_model(trainer.model), reference_model(trainer)

    def before_generation(self) -> None:
        """Before a generation batch is scored: applies a pending reset, in training (the reference becomes the
        policy, and with `ref_reset_optimizer` each parameter's moments start afresh at its next step)."""
        trainer = self.trainer
        if not (trainer.model.training and self.resets.pending):
            return
        copy_policy_to_reference(*self.models())
        optimizer = host_optimizer(trainer)
        if trainer.args.ref_reset_optimizer and optimizer is not None:
            optimizer.state.clear()
        self.resets.applied(trainer.state.global_step)

    def checkpoint_saved(self, checkpoint: str) -> None:
        """After the host saved `checkpoint`: the reference's weights too, once a reset made them differ from the
        loaded model's."""
        if self.resets.num_resets > 0:
            save_reference(checkpoint, *self.models())

    def checkpoint_loaded(self, checkpoint: str) -> None:
        """After the host loaded the model from `checkpoint`: a PEFT policy with the `"ref"` adapter gets its trained
        adapter back."""
        policy = self.trainer.accelerator.unwrap_model(self.trainer.model)
        if isinstance(policy, PeftModel) and REFERENCE_ADAPTER in policy.peft_config:
            restore_trained_adapter(policy, checkpoint)

    def load_saved_reference(self, checkpoint: str, reset_state: dict | None) -> None:
        """On resume: the reference's weights saved in `checkpoint`, when its run (`reset_state`, checked) had reset
        the reference.

        Raises:
            ValueError: the checkpoint's run reset the reference, but this run sets no resets.
        """
        num_resets = int(reset_state["num_resets"]) if reset_state is not None else 0
        if num_resets == 0:
            return
        if not self.resets.enabled:
            raise ValueError(
                f"{checkpoint} was saved after {num_resets} reference reset(s), but this run sets no resets "
                "(ref_reset_steps=0, ref_reset_kl=0): its reference would silently go back to the loaded model. "
                "Resume with the run's ref_reset_steps / ref_reset_kl."
            )
        load_reference(checkpoint, *self.models())
