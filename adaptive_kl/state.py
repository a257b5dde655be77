"""Checkpointing of the β controller through the Transformers stateful-callback mechanism."""

from __future__ import annotations

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from .controller import BetaController


class AdaptiveKLStateCallback(TrainerCallback, ExportableState):
    """Saves the `BetaController` state in every checkpoint's `trainer_state.json` and restores it on resume.

    Transformers writes `state()` under `stateful_callbacks["AdaptiveKLStateCallback"]` at each save. When training
    (re)starts, `on_train_begin` loads whatever state the `TrainerState` carries: the checkpoint's on resume, the
    current one otherwise. This does not depend on `restore_callback_states_from_checkpoint`.
    """

    def __init__(self, controller: BetaController | None = None, controller_state: dict | None = None):
        self.controller = controller
        self.controller_state = controller_state

    def state(self) -> dict:
        return {"args": {}, "attributes": {"controller_state": self.controller.state_dict()}}

    def on_train_begin(self, args, state, control, **kwargs):
        saved = state.stateful_callbacks.get(type(self).__name__)
        if isinstance(saved, list):  # several instances saved: ours is the last one registered
            saved = saved[-1]
        controller_state = (saved or {}).get("attributes", {}).get("controller_state") or self.controller_state
        if controller_state is not None:
            self.controller.load_state_dict(controller_state)
