"""The reference model through a run: reset to the policy every so often, skipped and released while β is 0 for
good, and what a checkpoint keeps of it.

Resets. ProRL (Liu et al., 2025, arXiv:2505.24864 §2.3.1, which also resets the optimizer: `ref_reset_optimizer`)
resets the reference periodically, so that a long run is regularized towards where it is now rather than where it
started (slime's `--ref-update-interval`). TRL's `sync_ref_model` is the soft version and refuses PEFT models; a reset
works for both: a full model's reference parameters are overwritten by the policy's, a PEFT model's adapter is copied
into the frozen `"ref"` adapter TRL scores the reference with (`add_reference_adapter` creates it where TRL would use
the adapter-disabled base). A reset due at the end of optimizer step t is applied before the next generation batch is
scored, so no buffered batch mixes two references; with one generation per optimizer step (TRL's default) step t + 1
measures a KL of 0. The reset reference's weights are saved in every checkpoint (`REFERENCE_FILE`).

The zero-β skip (`skip_zero_beta_reference`). A generation batch whose first optimizer step has β_t = 0 for good
(`BetaController.is_zero_from`: `dynamic` past its schedule with `beta_min=0`) is scored without the reference: its
KL term is exactly 0 (`ZeroBetaReference`). Some batches are measured anyway (`kl_monitor_steps`); when nothing else
reads the reference (no monitoring, resets or `sync_ref_model`), a full-model reference is freed, or not loaded at all
on a resume past the switch.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

import peft
import torch
from safetensors.torch import load_file, save_file
from transformers.utils import logging

from ..kl.controller import BetaController
from ..kl.validation import is_finite_number


REFERENCE_ADAPTER = "ref"  # the name TRL scores a PEFT model's reference with, when that adapter exists
REFERENCE_FILE = "adaptive_kl_reference.safetensors"  # in a checkpoint: the reference's weights after a reset
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")  # PEFT's names for an adapter's weights

# The trainer's logger, where its users already filter these messages.
logger = logging.get_logger("adaptive_kl.trainers.grpo")


@dataclass
class ReferenceResets:
    """When the reference is reset (`every_steps`: `ref_reset_steps`, `kl_threshold`: `ref_reset_kl`; 0: never), and
    how often it was. `last_reset_step`: the optimizer step after which the last reset was applied (0: none);
    `pending`: a reset fell due, to apply before the next generation batch is scored."""

    every_steps: int = 0
    kl_threshold: float = 0.0
    num_resets: int = 0
    last_reset_step: int = 0
    pending: bool = False
    enabled: bool = field(init=False)
    reads_kl: bool = field(init=False)

    def __post_init__(self):
        self.reads_kl = self.kl_threshold > 0
        self.enabled = self.every_steps > 0 or self.reads_kl

    def end_of_step(self, step: int, mean_kl: float) -> None:
        """Called once per finished optimizer step with its global mean raw KL: marks a reset as due."""
        if self.every_steps > 0 and step % self.every_steps == 0:
            self.pending = True
        if self.reads_kl and mean_kl > self.kl_threshold:  # False for NaN: a broken step triggers nothing
            self.pending = True

    def applied(self, step: int) -> None:
        """Records a reset applied after optimizer step `step`."""
        self.num_resets += 1
        self.last_reset_step = step
        self.pending = False

    def state_dict(self) -> dict:
        return {"num_resets": self.num_resets, "last_reset_step": self.last_reset_step, "pending": self.pending}

    def load_state_dict(self, state: dict) -> None:
        """Restores `state_dict()`'s output; a damaged one raises `ValueError` naming the entry, changing nothing."""
        if not isinstance(state, dict):
            raise ValueError(f"Invalid saved reference-reset state: expected a mapping, got {state!r}.")
        counters = {name: state.get(name) for name in ("num_resets", "last_reset_step")}
        for name, value in counters.items():
            if not (is_finite_number(value) and value >= 0 and float(value).is_integer()):
                raise ValueError(f"Invalid saved reference-reset state: {name}={value!r} (a whole number >= 0).")
        if not isinstance(state.get("pending"), bool):
            raise ValueError(f"Invalid saved reference-reset state: pending={state.get('pending')!r} (True or False).")
        self.num_resets, self.last_reset_step = (int(v) for v in counters.values())
        self.pending = state["pending"]


# --- a reset: the reference's parameters -----------------------------------------------------------------------------


def prepare_reference_resets(policy, sharding_engine: str | None, zero_stage: int | None, clears_optimizer: bool):
    """Before a run with resets: refuses what a reset cannot handle, and gives a PEFT `policy` (unwrapped) the `"ref"`
    adapter a reset copies into.

    Raises:
        ValueError: FSDP or DeepSpeed ZeRO-3 (sharded parameters), `ref_reset_optimizer` under DeepSpeed (its
            optimizer state lives in its engine), or a LoRA adapter with `target_parameters` on peft < 0.20.
    """
    from packaging.version import Version

    if sharding_engine == "fsdp" or (sharding_engine == "deepspeed" and zero_stage == 3):
        raise ValueError(
            "Reference resets (ref_reset_steps, ref_reset_kl) are not supported with FSDP or DeepSpeed ZeRO-3, "
            "whose sharded parameters a reset would have to gather: use DDP or ZeRO-1/2, or no resets."
        )
    if clears_optimizer and sharding_engine == "deepspeed":
        raise ValueError(
            "ref_reset_optimizer=True is not supported with DeepSpeed, whose optimizer state lives in its engine: "
            "set ref_reset_optimizer=False."
        )
    if isinstance(policy, peft.PeftModel) and REFERENCE_ADAPTER not in policy.peft_config:
        config = policy.peft_config[policy.active_adapter]
        if getattr(config, "target_parameters", None) and Version(peft.__version__) < Version("0.20.0"):
            raise ValueError(
                "Reference resets of a LoRA adapter with target_parameters need a second adapter, which "
                "peft<0.20 cannot add (peft#3340): upgrade peft, or use no resets."
            )
        add_reference_adapter(policy)


def add_reference_adapter(model) -> None:
    """Gives a PEFT `model` a frozen `"ref"` adapter equal to its active adapter, as TRL does for a model that
    arrives with a trained adapter. For a new LoRA adapter (B = 0) the reference is unchanged: the base model, to the
    bit (the adapter adds an exact 0)."""
    active = model.active_adapter
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # its random init is overwritten: leave sampling's streams alone
        model.add_adapter(REFERENCE_ADAPTER, model.peft_config[active])
    model.set_adapter(active)  # PEFT marks only the active adapter trainable: `"ref"` is frozen
    copy_policy_to_reference(model, None)


def restore_trained_adapter(model, checkpoint: str) -> None:
    """Loads the trained (active) adapter of a PEFT `model` with a `"ref"` adapter from `checkpoint`'s root.

    PEFT saves every adapter but the default one in a sub-folder, and Transformers 5.17's resume then loads only those:
    the policy would silently restart from its initial adapter (5.23 loads both; loading it again is harmless).
    """
    if not isinstance(model, peft.PeftModel) or REFERENCE_ADAPTER not in model.peft_config:
        return
    if not any(os.path.isfile(os.path.join(checkpoint, name)) for name in ADAPTER_FILES):
        return
    active = model.active_adapter
    model.load_adapter(checkpoint, active, is_trainable=True)
    model.set_adapter(active)  # and `"ref"` frozen again


def reference_parameter_pairs(policy, ref_model) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """`(name, reference parameter, policy parameter)` for every parameter a reset overwrites: of TRL's full-model
    `ref_model`, or, when it is `None`, of the `"ref"` adapter of the (unwrapped) PEFT `policy`.

    Raises:
        ValueError: the two models' parameters do not correspond name for name.
    """
    if ref_model is not None:
        policy_params, reference_params = dict(policy.named_parameters()), dict(ref_model.named_parameters())
        if policy_params.keys() != reference_params.keys():
            different = sorted(policy_params.keys() ^ reference_params.keys())[:5]
            raise ValueError(
                "Cannot reset the reference: the reference model's parameters do not correspond to the policy's "
                f"(e.g. {different}). Pass the policy as a model name or path, so that TRL builds the reference "
                "from the same checkpoint."
            )
        return [(name, reference_params[name], param) for name, param in policy_params.items()]
    marker = f".{policy.active_adapter}."
    return [
        (name, policy.get_parameter(name.replace(marker, f".{REFERENCE_ADAPTER}.")), param)
        for name, param in policy.named_parameters()
        if marker in name
    ]


@torch.no_grad()
def copy_policy_to_reference(policy, ref_model) -> None:
    """Overwrites the reference's parameters with the policy's (see `reference_parameter_pairs`)."""
    for _, reference, param in reference_parameter_pairs(policy, ref_model):
        reference.copy_(param)


def save_reference(directory: str, policy, ref_model) -> None:
    """Writes the reference's parameters to `directory/REFERENCE_FILE`."""
    tensors = {name: ref.detach().cpu().contiguous() for name, ref, _ in reference_parameter_pairs(policy, ref_model)}
    save_file(tensors, os.path.join(directory, REFERENCE_FILE))


@torch.no_grad()
def load_reference(directory: str, policy, ref_model) -> None:
    """Restores what `save_reference` wrote in checkpoint `directory`; `ValueError` naming the file when it is missing
    or does not hold exactly the reference's parameters."""
    path = os.path.join(directory, REFERENCE_FILE)
    if not os.path.isfile(path):
        raise ValueError(
            f"{path} is missing: the checkpoint records reference resets, so the reference's weights differ from the "
            "loaded model and are needed to resume. Restore the file from a copy, or resume from another checkpoint."
        )
    saved = load_file(path)
    pairs = reference_parameter_pairs(policy, ref_model)
    if saved.keys() != {name for name, _, _ in pairs}:
        raise ValueError(f"{path} does not hold this model's reference parameters (names differ).")
    for name, reference, _ in pairs:
        if saved[name].shape != reference.shape:
            raise ValueError(
                f"{path}: {name} has shape {tuple(saved[name].shape)}, expected {tuple(reference.shape)}."
            )
        reference.copy_(saved[name])


# --- the reference TRL scores a PEFT model with ----------------------------------------------------------------------


def reference_is_base_despite_trained_adapter(model) -> bool:
    """Whether the reference is scored with the adapter disabled (TRL's fallback for LoRA with `target_parameters` on
    peft < 0.20, where it cannot add a `"ref"` adapter) although the adapter changes the model (a `lora_B` != 0)."""
    if not isinstance(model, peft.PeftModel) or REFERENCE_ADAPTER in model.peft_config:
        return False
    return any(
        param.detach().abs().max().item() > 0
        for name, param in model.named_parameters()
        if "lora_B" in name or "lora_embedding_B" in name
    )


def warn_if_reference_is_base(model) -> None:
    """Warns the trainer's caller when the KL term would pull `model` back towards the base model rather than
    towards the trained adapter it starts from."""
    if reference_is_base_despite_trained_adapter(model):
        warnings.warn(
            "The PEFT model carries a trained adapter, and the reference policy is the base model with the "
            "adapter disabled: the KL term pulls the policy back towards the base model, not towards the adapter "
            "you start from. To regularize towards the adapter, upgrade to peft>=0.20 (TRL then copies it as the "
            "reference), or merge it into the base model (merge_and_unload), save that and pass a new "
            "peft_config.",
            UserWarning,
            stacklevel=3,
        )


# --- the zero-β skip -------------------------------------------------------------------------------------------------


def reference_unread_at_zero_beta(args) -> bool:
    """Whether nothing but the KL term reads the reference while β is 0 for good: no KL monitoring
    (`kl_monitor_steps=0`), no reference resets, no `sync_ref_model`, no drift controller (it measures against it)."""
    return (
        args.kl_monitor_steps == 0
        and args.ref_reset_steps == 0
        and args.ref_reset_kl == 0
        and not args.sync_ref_model
        and args.kl_controller != "drift"
    )


@dataclass
class ZeroBetaReference:
    """Decides, batch by batch, whether the reference is scored, and when a full-model reference may be freed.

    `released`: the reference model is gone (freed, or never loaded on a resume past the switch);
    `monitored_window`: the last window of `kl_monitor_steps` optimizer steps measured anyway; `eval_monitored`:
    whether the evaluation in progress measured its first batch. Only the main process logs what it did.
    """

    args: object = field(repr=False)
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
        log-probabilities: not when β_t is 0 for every step it serves (`BetaController.is_zero_from`), unless the KL is
        monitored on this batch (`logging_steps`: the default interval) or a KL-triggered reset reads every step's KL.
        `ValueError` when it needs a released reference."""
        if (
            self.args.ref_reset_kl > 0
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

    def may_release(self, reference, sharding_engine: str | None) -> bool:
        """Whether a skipped batch's trainer may free its full-model `reference` now: nothing else reads it, and no
        sharded engine owns it. A PEFT reference is the base model itself."""
        return (
            not self.released
            and reference is not None
            and reference_unread_at_zero_beta(self.args)
            and sharding_engine is None
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
