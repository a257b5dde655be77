"""The seam's mixin, `HostHooks`, and the few functions that do something with the host's undocumented names (the
table of those names, and its checks, are `internals`').
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

from ..inputs import check_drawn_prompts, checked_reward_func
from .internals import unsupported_trl


# Multimodal inputs of a batch from `GRPOTrainer._generate_and_score_completions` that a policy forward needs.
MULTIMODAL_INPUTS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)  # fmt: skip


@dataclass
class PassLog:
    """What one pass of the host (a generation batch scored, a micro-batch's loss) logs under some names, written once
    by the trainer (`one_pass_log`): `host(name)` is what the host logged under `name` in this pass, `write(name,
    entries)` what the pass logs instead.

    Attributes:
        stores (`dict[str, dict]`): name → the host's store that logs it (TRL's `_metrics[mode]`, or its completions
            table `_logs`).
    """

    stores: dict[str, dict]
    written: dict[str, list] = field(default_factory=dict)

    def host(self, name: str) -> list:
        return list(self.stores[name].get(name, ()))

    def write(self, name: str, entries) -> None:
        self.written[name] = list(entries)


@contextmanager
def one_pass_log(stores: dict[str, dict]):
    """Sets aside the host's entries under each name of `stores` (name → the store that logs it) while the host runs
    inside, so that what it logs meanwhile is this pass's alone, and yields the pass's `PassLog`. At the end each name
    holds its earlier entries and then the pass's (those written, else the host's), under the same key: no entry of
    the host's lists is edited by its position."""
    earlier = {}
    for name, store in stores.items():
        if name in store:
            earlier[name], store[name] = store[name], []
    log = PassLog(stores)
    try:
        yield log
    finally:
        for name, store in stores.items():
            entries = log.written[name] if name in log.written else list(store.get(name, ()))
            if name in earlier:
                earlier[name].extend(entries)  # a bounded deque (the completions table) keeps its bound
                store[name] = earlier[name]
            elif entries:
                store[name] = entries
            else:
                store.pop(name, None)


@dataclass(frozen=True)
class HostScoring:
    """One generation batch as the host scored it: what `HostHooks._on_scored` hands the trainer.

    Attributes:
        output (`dict`): the host's output for this process's B completions; editable (its advantages, added keys).
        rewards_per_func (`torch.Tensor` of shape `(N, K)`): every process's rewards per reward function, as
            `_calculate_rewards` gathered them (NaN where a function returned None).
        logps (`tuple[torch.Tensor, ...]`): each `(B, T)` log-probability tensor the host computed while it scored the
            batch, in order; which is which is the host's own layout (GRPO keeps them in its output, RLOO does not).
        reference_scored (`bool`): whether the host scored the reference (its β is not 0 and `_before_scoring` asked
            for it).
        log (`PassLog`): the batch's `advantages` in the completions table and `frac_reward_zero_std`, as the host
            logged them, which the trainer may write instead (the advantages its loss uses, ...).
    """

    output: dict
    mode: str
    rewards_per_func: torch.Tensor
    logps: tuple[torch.Tensor, ...]
    reference_scored: bool
    log: PassLog


class HostHooks:
    """Mixin for the subclasses of `GRPOTrainer` and `RLOOTrainer` (listed before it).

    Extension points, internal because their signatures follow what TRL's private methods offer:

    - `_before_scoring(mode)`: before the host generates and scores a batch of `mode`; whether the batch needs the
      reference log-probabilities (default: yes). When not, the host scores it with β = 0, which skips the reference
      forward, and its output has no `ref_per_token_logps`;
    - `_on_scored(scoring)`: after it, with the batch as the host scored it (`HostScoring`). It has no default: every
      subclass defines it.

    A subclass names its model-card tag in its bases: `class MyTrainer(HostHooks, GRPOTrainer, hub_tag="my-tag")`.
    """

    _rewards_per_func: torch.Tensor | None = None  # set while a generation batch is scored
    _policy_scorings: list[torch.Tensor] | None = None  # open while the host's loss runs inside ours
    _generation_scorings: list[torch.Tensor] | None = None  # open while the host scores a generation batch

    def __init_subclass__(cls, hub_tag: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if hub_tag is not None:
            cls._tag_names = [*cls._tag_names, hub_tag]  # the host's tags, then ours

    def _before_scoring(self, mode: str) -> bool:
        return True

    # --- the host's methods -----------------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # While the host scores a batch, its reward functions check what they return (a bad output is named, not a
        # torch.tensor error), reward models aside; outside, the list is the user's own, object for object
        funcs = self.reward_funcs
        self.reward_funcs = [
            func if isinstance(func, torch.nn.Module) else checked_reward_func(func, name)
            for func, name in zip(funcs, self.reward_func_names, strict=True)
        ]
        try:
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        finally:
            self.reward_funcs = funcs
        self._rewards_per_func = rewards_per_func  # (N_global, K), gathered over processes; NaN where None
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        check_drawn_prompts(inputs)  # a streaming dataset's rows are first seen here
        mode = "train" if self.model.training else "eval"
        # TRL scores the reference only when its β is not 0, and reads β nowhere else while scoring a batch
        scores_reference = self._before_scoring(mode) and self.beta != 0.0
        self._rewards_per_func, self._generation_scorings = None, []
        # What the trainer may log in place of the host's: the batch's advantages and fraction of tied groups
        logged_here = {"advantages": self._logs, "frac_reward_zero_std": self._metrics[mode]}
        with one_pass_log(logged_here) as log:
            try:
                with nullcontext() if scores_reference else self._host_beta(0.0):
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
            self._on_scored(HostScoring(output, mode, rewards_per_func, logps, scores_reference, log))
        return output

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        outputs = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        for scorings in (self._policy_scorings, self._generation_scorings):
            if scorings is not None:
                scorings.append(outputs[0])
        return outputs

    # --- the host's loss --------------------------------------------------------------------------------------------

    @contextmanager
    def _host_beta(self, beta: float):
        """TRL's β is `beta` inside, and back to its value after."""
        host_beta, self.beta = self.beta, beta
        try:
            yield
        finally:
            self.beta = host_beta

    @contextmanager
    def host_loss_scoring(self, backend_capture=None, *, beta: float = 0.0):
        """Runs the host's loss at β = `beta` (0: without its KL term) and yields `{"policy_logps": [...]}`, every
        policy scoring of the loss. `backend_capture`, a context manager taking that dict (Unsloth's records its
        efficient loss's arguments under `"efficient_grpo"`), is entered around the loss too."""
        capture = {"policy_logps": []}
        self._policy_scorings = capture["policy_logps"]
        try:
            with self._host_beta(beta), backend_capture(capture) if backend_capture else nullcontext():
                yield capture
        finally:
            self._policy_scorings = None

    def captured_policy_logps(self, capture: dict, training: bool) -> torch.Tensor:
        """The `(B, T)` policy log-probabilities of the host's loss; `UnsupportedTRLError` when the loss scored the
        policy other than once (the KL term would not share them), or in training they carry no gradient."""
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


# --- what several modules do with the host's names ------------------------------------------------------------------


def completion_loss_mask(batch: dict):
    """The completion tokens a loss or a KL may count: `completion_mask`, times `tool_mask` when the batch has one
    (tool outputs in a completion were not sampled from the policy)."""
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask


def accumulation_steps(trainer) -> int:
    """The micro-batches of the optimizer step in progress, as Transformers' training loop set them (fewer for a last
    partial step); before any training step (a loss computed by hand), `gradient_accumulation_steps`, as for a full
    step. `check_host` checked that the loop sets it, so its absence means "not yet", never "renamed"."""
    if "current_gradient_accumulation_steps" in vars(trainer):
        return trainer.current_gradient_accumulation_steps
    return trainer.args.gradient_accumulation_steps


def metric_store(trainer, mode: str) -> dict[str, list[float]]:
    """`trainer`'s metrics of `mode` ("train" or "eval"): name → values, which TRL averages and logs at the next `log`
    (prefixing "eval_" in evaluation). For code that takes any GRPO or RLOO trainer (the callbacks, the tests)."""
    return trainer._metrics[mode]


@dataclass(frozen=True)
class HostModels:
    """The models and optimizer of a trainer that a reference reset or release touches: the unwrapped `policy`; TRL's
    full-model `reference` (`None` for a PEFT policy, and once released); the `optimizer` (`None` until `train` builds
    it); `sharding_engine`, `"deepspeed"` or `"fsdp"` when that engine owns the models, and DeepSpeed's `zero_stage`.
    """

    policy: torch.nn.Module
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer | None
    sharding_engine: str | None
    zero_stage: int | None


def host_models(trainer) -> HostModels:
    """`HostModels` of `trainer`, now."""
    engine = "deepspeed" if trainer.is_deepspeed_enabled else "fsdp" if trainer.is_fsdp_enabled else None
    accelerator = trainer.accelerator
    return HostModels(
        policy=accelerator.unwrap_model(trainer.model),
        reference=trainer.ref_model,
        optimizer=trainer.optimizer,
        sharding_engine=engine,
        zero_stage=accelerator.state.deepspeed_plugin.zero_stage if engine == "deepspeed" else None,
    )


@contextmanager
def host_built_without_reference(trainer, args):
    """The host's `__init__`, run inside, builds no reference model: it loads one only when `args.beta` is not 0, so
    `args.beta` is 0 inside; after, it and `trainer.beta` hold the configured β. Not for a PEFT policy (TRL also reads
    `args.beta` to copy its adapter as the reference), and only when the trainer will refuse to score the reference."""
    beta, args.beta = args.beta, 0.0
    try:
        yield
    finally:
        args.beta = beta
    trainer.beta = beta


def close_progress_bars(trainer) -> None:
    """Closes the training progress bar of each of `trainer`'s `ProgressCallback`s that has one open (a run that an
    exception interrupted leaves it open, and a message printed then lands inside it)."""
    from transformers.trainer_callback import ProgressCallback  # not at import: see `check_trl_version`

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, ProgressCallback) and callback.training_bar is not None:
            callback.training_bar.close()
            callback.training_bar = None
