"""Checkpoints and resume of the demo's runs (`--save-every N`, `--resume`): a run killed mid-way goes on from its
latest complete checkpoint and reports what the uninterrupted run reports.

Transformers' checkpoint restores the model, optimizer, scheduler, random states and log history, and the trainer's
own `AdaptiveKLStateCallback` the β controller; `RunRecord` adds what the demo's callbacks recorded, in the same
`trainer_state.json`. The starting policy that the retention callbacks measure drift from is not in a checkpoint: the
runner measures it (`RetentionCallback.record_start`) before the resume loads the trained weights.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..trainers.state import TRAINER_STATE_FILE, saved_attribute


@dataclass(eq=False)
class RunRecord(TrainerCallback, ExportableState):
    """What a variant recorded beside the trainer's own state, saved in each checkpoint (`trainer_state.json`, under
    `stateful_callbacks["RunRecord"]`) so that a resumed run reports what an uninterrupted one does: the validation
    evaluations and texts, each retention callback's history, the KL-band monitor's state and the seconds spent
    before the resume (`seconds()` counts them in)."""

    started: float = 0.0  # `time.perf_counter()` at this process's start of the run
    validation: object = None  # the run's `runner.ValidationCallback`
    retentions: list = field(default_factory=list)  # its `RetentionCallback`s
    kl_health: object = None  # its `KLHealthCallback`
    seconds_before: float = 0.0
    resumed_at: list[int] = field(default_factory=list)  # the steps this run was resumed at, oldest first
    setup: dict | None = None  # what the run is trained with (`arguments.run_setup`): a resume must match it

    def seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self.started

    def state(self) -> dict:
        attributes = {
            "seconds": self.seconds(),
            "resumed_at": list(self.resumed_at),
            "evaluations": self.validation.evaluations,
            "samples": self.validation.samples,
            "retention": {retention.prefix: retention.history for retention in self.retentions},
            "kl_health": self.kl_health.state_dict(),
            "setup": self.setup,
        }
        return {"args": {}, "attributes": attributes}

    def resume(self, checkpoint: str, step: int) -> None:
        """Takes up the record saved in `checkpoint` (made at optimizer step `step`)."""
        saved = saved_record(checkpoint)
        self.seconds_before = saved["seconds"]
        self.resumed_at = [*saved["resumed_at"], step]
        self.validation.evaluations, self.validation.samples = saved["evaluations"], saved["samples"]
        for retention in self.retentions:
            retention.history = saved["retention"][retention.prefix]
        self.kl_health.load_state_dict(saved["kl_health"])

    def on_train_begin(self, args, state, control, **kwargs):
        # A resumed state saved without this callback would fail Transformers' next save: give it the entry.
        state.stateful_callbacks.setdefault(type(self).__name__, self.state())


RECORD_ATTRIBUTES = ("seconds", "resumed_at", "evaluations", "samples", "retention", "kl_health")


def saved_record(checkpoint: str) -> dict:
    """The `RunRecord` attributes saved in `checkpoint` (`setup` None in one saved before runs recorded it);
    ValueError naming the file when it has none (a checkpoint this command did not save) or lacks some."""
    path = os.path.join(checkpoint, TRAINER_STATE_FILE)
    try:
        with open(path) as f:
            callbacks = json.load(f).get("stateful_callbacks")
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} cannot be read ({error}): remove the checkpoint, or drop --resume.") from None
    saved = callbacks.get(RunRecord.__name__) if isinstance(callbacks, dict) else None
    record = {name: saved_attribute(saved, name) for name in RECORD_ATTRIBUTES}
    missing = [name for name, value in record.items() if value is None]
    if missing:
        raise ValueError(
            f"{path} has no complete record of the run (stateful_callbacks['{RunRecord.__name__}'] lacks "
            f"{', '.join(missing)}): the checkpoint was not saved by `adaptive-kl compare/demo --save-every`. Remove "
            "it, or drop --resume."
        )
    return {**record, "setup": saved_attribute(saved, "setup")}


def checkpoint_setup(output_dir: str) -> tuple[str, dict | None] | None:
    """`(path, setup)` of the latest complete checkpoint in `output_dir`: the setup its run was trained with (None for
    one saved before runs recorded it); None without a checkpoint. ValueError for one `compare` did not save."""
    checkpoint = latest_checkpoint(output_dir)
    return None if checkpoint is None else (checkpoint[0], saved_record(checkpoint[0])["setup"])


def latest_checkpoint(output_dir: str) -> tuple[str, int] | None:
    """`(path, step)` of the newest complete checkpoint in `output_dir` (one whose `trainer_state.json`, written last,
    is there: a process killed while saving leaves an incomplete one), or None."""
    if not os.path.isdir(output_dir):
        return None
    steps = [
        int(name[len(PREFIX_CHECKPOINT_DIR) + 1 :])
        for name in os.listdir(output_dir)
        if name.startswith(PREFIX_CHECKPOINT_DIR + "-") and name[len(PREFIX_CHECKPOINT_DIR) + 1 :].isdigit()
    ]
    for step in sorted(steps, reverse=True):
        path = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if os.path.isfile(os.path.join(path, TRAINER_STATE_FILE)):
            return path, step
    return None
