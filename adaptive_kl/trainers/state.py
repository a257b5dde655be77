"""What a checkpoint saved of the β controller (and of the reference resets), read before a run resumes.

Every checkpoint's `trainer_state.json` carries the `BetaController` state, and the `ReferenceResets` state when
resets are on, under `stateful_callbacks["AdaptiveKLStateCallback"]` (`lifecycle.AdaptiveKLStateCallback` writes it
and loads it back), so a resumed run follows the β trajectory (and resets at the steps) of an uninterrupted run.
"""

from __future__ import annotations

import json
import os

from transformers.trainer_utils import get_last_checkpoint

from ..kl.controller import BetaController
from .reference import ReferenceResets


TRAINER_STATE_FILE = "trainer_state.json"  # Transformers' name for it
STATE_CALLBACK = "AdaptiveKLStateCallback"  # our entry of its `stateful_callbacks`: the callback's class name


def saved_attribute(saved, name: str):
    """Attribute `name` inside a `stateful_callbacks` entry of ours (the last one when several were saved)."""
    if isinstance(saved, list):
        saved = saved[-1] if saved else None
    if not isinstance(saved, dict):
        return None
    attributes = saved.get("attributes")
    return attributes.get(name) if isinstance(attributes, dict) else None


def resolve_checkpoint(resume_from_checkpoint, output_dir: str) -> str | None:
    """The checkpoint directory `Trainer.train(resume_from_checkpoint=...)` will resume from: the given path, or for
    `True` the last checkpoint in `output_dir`; `None` when there is none (Transformers then reports it)."""
    if isinstance(resume_from_checkpoint, bool):
        return get_last_checkpoint(output_dir) if resume_from_checkpoint and os.path.isdir(output_dir) else None
    return str(resume_from_checkpoint) if os.path.isdir(resume_from_checkpoint) else None


def read_checkpoint_kl_state(checkpoint: str) -> dict | None:
    """What `checkpoint` saved of ours, checked: `{"controller_state": ..., "reference_reset_state": ... or None,
    "global_step": the optimizer step it was saved at}`; `None` if the checkpoint carries none. `ValueError`, naming
    the file, when it is not valid JSON, our entry is damaged, or its `global_step` is not a whole number >= 0.
    """
    path = os.path.join(checkpoint, TRAINER_STATE_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            trainer_state = json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(f"Cannot read the checkpoint state {path}: {error}") from None
    callbacks = trainer_state.get("stateful_callbacks") if isinstance(trainer_state, dict) else None
    saved = callbacks.get(STATE_CALLBACK) if isinstance(callbacks, dict) else None
    if saved is None:
        return None
    controller_state = saved_attribute(saved, "controller_state")
    reset_state = saved_attribute(saved, "reference_reset_state")
    try:
        BetaController(1.0).load_state_dict(controller_state)  # the same checks as on resume, on scratch objects
        if reset_state is not None:
            ReferenceResets().load_state_dict(reset_state)
    except ValueError as error:
        raise ValueError(
            f"{path}: stateful_callbacks[{STATE_CALLBACK!r}] is damaged: {error} Restore the file "
            "from a copy, or resume from another checkpoint."
        ) from None
    global_step = trainer_state.get("global_step", 0)
    if isinstance(global_step, bool) or not isinstance(global_step, int) or global_step < 0:
        raise ValueError(
            f"{path}: global_step is {global_step!r}, not a whole number >= 0: resume from another checkpoint."
        )
    return {"controller_state": controller_state, "reference_reset_state": reset_state, "global_step": global_step}


def check_resumed_kl_state(args, controller: BetaController, resume_from_checkpoint) -> tuple[str, dict | None] | None:
    """Before a run resumes, before anything is loaded: the checkpoint, and what it saved of ours, checked
    (`read_checkpoint_kl_state`; `None`: nothing, and β starts afresh); `None` when there is no checkpoint
    (Transformers says so). A sound state is loaded later, by `lifecycle.AdaptiveKLStateCallback.on_train_begin`.

    Raises:
        ValueError: the state is damaged, or missing (a stock TRL checkpoint) where β's trajectory depends on it
            (`controller.has_training_state`) and `args.resume_without_kl_state` is not set.
    """
    checkpoint = resolve_checkpoint(resume_from_checkpoint, args.output_dir)
    if checkpoint is None:
        return None
    saved = read_checkpoint_kl_state(checkpoint)
    if saved is None and controller.has_training_state and not args.resume_without_kl_state:
        path = os.path.join(checkpoint, TRAINER_STATE_FILE)
        where = f"{path} does not exist"
        if os.path.isfile(path):
            where = f"{path} has no adaptive-KL controller state (stateful_callbacks['{STATE_CALLBACK}'])"
        raise ValueError(
            f"{where}: the checkpoint was saved by stock TRL's GRPOTrainer, or is damaged, so resuming would restart "
            f"the adapted β at beta={args.beta} instead of its saved value. To start β afresh from this checkpoint, "
            "set resume_without_kl_state=True."
        )
    return checkpoint, saved


def resumes_past_the_switch(args, resume_from_checkpoint) -> bool:
    """Whether a run of `args` resumed from `resume_from_checkpoint` (a path, or `True`: the last checkpoint in
    `args.output_dir`) has β_t = 0 for good from its first optimizer step on: `BetaController.is_zero_from` the step
    after the checkpoint's, with the controller state the checkpoint saved. False without such a checkpoint, or when
    it saved no state of ours (a resume from it is refused, or restarts β: see `resume_without_kl_state`)."""
    checkpoint = resolve_checkpoint(resume_from_checkpoint, args.output_dir) if resume_from_checkpoint else None
    saved = read_checkpoint_kl_state(checkpoint) if checkpoint is not None else None
    if saved is None:
        return False
    controller = BetaController.from_args(args)
    controller.load_state_dict(saved["controller_state"])
    return controller.is_zero_from(saved["global_step"] + 1)
