"""The seam's mixin: `HostHooks` overrides the host trainer's private methods and hands the trainers named extension
points, and `HostScoring` is what it hands them for each generation batch the host scored.
"""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from transformers import TrainerCallback

from ..inputs import check_drawn_prompts
from .access import checking_reward_outputs
from .internals import unsupported_trl


@dataclass(frozen=True)
class HostScoring:
    """One generation batch as the host scored it: what `HostHooks._on_scored` hands the trainer.

    Attributes:
        output (`dict`): the host's output for this process's B completions; editable (its advantages, added keys).
        mode (`str`): `"train"` or `"eval"`.
        rewards_per_func (`torch.Tensor` of shape `(N, K)`): every process's rewards per reward function, gathered,
            NaN where a function returned None.
        logps (`tuple[torch.Tensor, ...]`): each `(B, T)` log-probability tensor the host computed while it scored the
            batch (`_get_per_token_logps_and_entropies`), in order; which is which is the host's own layout, named by
            the trainer of that host.
        reference_scored (`bool`): whether the host scored the reference (its β is not 0 and `_scores_reference`
            asked for it).
    """

    output: dict
    mode: str
    rewards_per_func: torch.Tensor
    logps: tuple[torch.Tensor, ...]
    reference_scored: bool


class HostHooks:
    """Mixin for the subclasses of `GRPOTrainer` and `RLOOTrainer` (listed before it): the host hooks every trainer
    here shares.

    It overrides the host's private methods of `HOST_INTERNALS`, so that the trainers extend only these named points
    (each a no-op or the host's own behaviour unless overridden):

    - `_on_generation_batch(mode)`: before the host generates and scores a training or evaluation batch;
    - `_scores_reference(mode)`: whether that batch needs the reference log-probabilities (default: whenever the
      host computes them); when not, the host scores it with β = 0, which skips the reference forward, and its
      output has no `ref_per_token_logps`;
    - `_on_scored(scoring)`: after it, with the batch as the host scored it (`HostScoring`): its output (editable),
      the gathered `(N, K)` rewards that `_calculate_rewards` computed (after checking what each reward function
      returned), and every log-probability tensor the host computed while scoring it, in order: the trainer of each
      host names them (GRPO keeps them in its output, RLOO only scores them). A host that scored a batch without
      calling `_calculate_rewards` is refused;
    - `_micro_batch_loss(model, inputs)`: the loss of one micro-batch (the host's `_compute_loss`);
    - `_on_checkpoint_saved(checkpoint)`, `_on_checkpoint_loaded(checkpoint)` and `_on_callback_state_loaded()`:
      after the host saved a checkpoint directory, loaded the model from one, and restored its callbacks' state.

    These extension points are internal: their names are private because their signatures follow what TRL's private
    methods offer, and may change with a supported TRL release. Subclass the trainers' public API instead.

    Policy scoring: inside `host_loss_scoring()`, every `_get_per_token_logps_and_entropies` result of the host's loss
    is recorded, the loss running with β = 0 (its KL term left to the trainer) or with the trainer's β_t (the host's
    own term, at that β); `captured_policy_logps` checks that there was exactly one and that it carries a gradient in
    training.

    A subclass names its model-card tag in its bases: `class MyTrainer(HostHooks, GRPOTrainer, hub_tag="my-tag")`.
    """

    _rewards_per_func: torch.Tensor | None = None  # set while a generation batch is scored
    _policy_scorings: list[torch.Tensor] | None = None  # open while the host's loss runs inside ours
    _generation_scorings: list[torch.Tensor] | None = None  # open while the host scores a generation batch

    def __init_subclass__(cls, hub_tag: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if hub_tag is not None:
            cls._tag_names = [*cls._tag_names, hub_tag]  # the host's tags, then ours

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback(CheckpointSaved(self._on_checkpoint_saved))

    # --- extension points -----------------------------------------------------------------------------------------

    def _on_generation_batch(self, mode: str) -> None:
        """Called before the host generates and scores a batch of `mode` ("train" or "eval")."""

    def _scores_reference(self, mode: str) -> bool:
        """Whether the generation batch about to be scored in `mode` needs the reference log-probabilities."""
        return True

    def _on_scored(self, scoring: HostScoring) -> None:
        """Called once per scored generation batch, with what the host computed for it (`scoring.output` editable)."""

    def _micro_batch_loss(self, model, inputs):
        """The loss of one micro-batch: the host's. A trainer with another objective overrides it."""
        return super()._compute_loss(model, inputs)

    def _on_checkpoint_saved(self, checkpoint: str) -> None:
        """Called after the host saved the checkpoint directory `checkpoint` (on the processes that save)."""

    def _on_checkpoint_loaded(self, checkpoint: str) -> None:
        """Called after the host loaded the model from `checkpoint` on resume."""

    def _on_callback_state_loaded(self) -> None:
        """Called after the host restored its callbacks' state from a checkpoint."""

    # --- the host's methods -----------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        return self._micro_batch_loss(model, inputs)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        self._on_checkpoint_loaded(resume_from_checkpoint)

    def _load_callback_state(self):
        super()._load_callback_state()
        self._on_callback_state_loaded()

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        with checking_reward_outputs(self):  # a reward function's bad output is named, not a torch.tensor error
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards_per_func  # (N_global, K), gathered over processes; NaN where None
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        check_drawn_prompts(inputs)  # a streaming dataset's rows are first seen here
        mode = "train" if self.model.training else "eval"
        self._on_generation_batch(mode)
        self._rewards_per_func = None
        self._generation_scorings = []
        # TRL scores the reference only when its β is not 0, and reads β nowhere else while scoring a batch
        scores_reference = self._scores_reference(mode) and self.beta != 0.0
        try:
            with nullcontext() if scores_reference else self._host_beta_zero():
                output = super()._generate_and_score_completions(inputs)
            logps = tuple(self._generation_scorings)
        finally:
            self._generation_scorings = None
        rewards_per_func, self._rewards_per_func = self._rewards_per_func, None
        if rewards_per_func is None:
            raise unsupported_trl(
                f"{type(self).__name__} could not capture the rewards of a generation batch: the host's "
                "_generate_and_score_completions no longer calls _calculate_rewards"
            )
        self._on_scored(HostScoring(output, mode, rewards_per_func, logps, reference_scored=scores_reference))
        return output

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        outputs = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if self._policy_scorings is not None:
            self._policy_scorings.append(outputs[0])
        if self._generation_scorings is not None:
            self._generation_scorings.append(outputs[0])
        return outputs

    @contextmanager
    def _host_beta_zero(self):
        """TRL's β is 0 inside, and back to its value after."""
        beta, self.beta = self.beta, 0.0
        try:
            yield
        finally:
            self.beta = beta

    @contextmanager
    def host_loss_scoring(self, backend_capture=None, *, beta: float = 0.0):
        """Runs the host's loss and yields what it computed: `{"policy_logps": [...]}`, every policy scoring of the
        loss. The host's β is `beta` inside: 0 (its loss without its KL term, which the trainer adds) or the package's
        β_t (the host's own KL term, at that β). `backend_capture`, a context manager taking that dict (a backend whose
        loss scores the policy its own way passes one: Unsloth's records its efficient loss's arguments under
        `"efficient_grpo"`), is entered around the loss too."""
        capture = {"policy_logps": []}
        self._policy_scorings, host_beta = capture["policy_logps"], self.beta
        self.beta = beta
        try:
            if backend_capture is None:  # one context, not nested ones: this runs once per micro-batch
                yield capture
            else:
                with backend_capture(capture):
                    yield capture
        finally:
            self._policy_scorings, self.beta = None, host_beta

    def captured_policy_logps(self, capture: dict, training: bool) -> torch.Tensor:
        """The `(B, T)` policy log-probabilities of the host's loss, checked.

        Raises:
            UnsupportedTRLError: the loss scored the policy zero or several times (the KL term would not share the
                policy term's log-probabilities), or, in training, the captured log-probabilities carry no gradient
                (the KL term would not regularize).
        """
        scorings = capture["policy_logps"]
        if len(scorings) != 1:
            raise unsupported_trl(
                f"{type(self).__name__} expects the host's loss to score the policy exactly once "
                f"(_get_per_token_logps_and_entropies), but it did {len(scorings)} times"
            )
        return check_carries_gradient(scorings[0], training, "the host's policy log-probabilities")


def check_carries_gradient(logps: torch.Tensor, training: bool, what: str) -> torch.Tensor:
    """`logps`, after checking that in training (`training=True`) it carries a gradient."""
    if training and not logps.requires_grad:
        raise unsupported_trl(
            f"{what}, captured while training, carry no gradient (requires_grad=False), so the KL term added to the "
            "loss would not regularize the policy"
        )
    return logps


class CheckpointSaved(TrainerCallback):
    """Calls `on_saved(checkpoint directory)` after Transformers saved a checkpoint, on the processes that save
    (`TrainingArguments.should_save`): the public `on_save` event, at `<output_dir>/checkpoint-<step>`. Under a
    hyperparameter search Transformers saves elsewhere (a run directory per trial): the directory is then not there,
    and this says so rather than writing beside it."""

    def __init__(self, on_saved):
        self.on_saved = on_saved

    def on_save(self, args, state, control, **kwargs):
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR  # not at import: see `check_trl_version`

        if not args.should_save:
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
