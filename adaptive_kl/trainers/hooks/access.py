"""The seam's readers and writers: the only way the package reaches an entry of `internals.HOST_INTERNALS`.

Each reader returns a named value that one caller needs whole (how the host aggregates its loss, how it turns rewards
into advantages, the models a reference reset or release touches), so that a trainer reads the host once, where it
decides, and every undocumented name stays in this file. The few one-line functions left each write to, or read, one
undocumented attribute that several callers share; their docstrings say which.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..inputs import checked_reward_funcs


# --- the layout of TRL's batches -------------------------------------------------------------------------------------


# Multimodal inputs of a batch from `GRPOTrainer._generate_and_score_completions` that a policy forward needs.
MULTIMODAL_INPUTS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


def completion_loss_mask(batch: dict):
    """The completion tokens a loss or a KL may count: `completion_mask`, times `tool_mask` when the batch has one
    (tool outputs in a completion were not sampled from the policy)."""
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask


# --- how the host computes its loss ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostLossSettings:
    """How the host aggregates the micro-batch loss that the KL term is added to, read when that loss is computed (a
    test or a user may change them on the trainer between steps)."""

    loss_type: str  # TRL's `loss_type` ("grpo", "dapo", ...)
    importance_sampling_level: str  # "token" or "sequence"
    max_completion_length: int | None  # dr_grpo's constant normalizer
    accumulation_steps: float  # the optimizer step's micro-batches (1.0 in evaluation: TRL does not accumulate there)
    temperature: float  # the temperature the host samples, and scores log-probabilities, at


def host_loss_settings(trainer, mode: str) -> HostLossSettings:
    """`trainer`'s loss aggregation for a micro-batch of `mode` ("train" or "eval")."""
    return HostLossSettings(
        loss_type=trainer.loss_type,
        importance_sampling_level=trainer.importance_sampling_level,
        max_completion_length=trainer.max_completion_length,
        accumulation_steps=accumulation_steps(trainer) if mode == "train" else 1.0,
        temperature=trainer.temperature,
    )


def accumulation_steps(trainer) -> int:
    """The micro-batches of the optimizer step in progress, as Transformers' training loop set them on `trainer` (fewer
    for a last partial step). A trainer that never ran a training step (a loss computed by hand) has none yet: then
    the configured `gradient_accumulation_steps`, what the loop sets for a full step. `check_host` has checked that the
    loop sets it, so its absence means "not yet", never "renamed"."""
    if "current_gradient_accumulation_steps" in vars(trainer):
        return trainer.current_gradient_accumulation_steps
    return trainer.args.gradient_accumulation_steps


def set_accumulation_steps(trainer, steps: int) -> None:
    """Sets what Transformers' training loop sets before each optimizer step (the micro-batches it accumulates over),
    for a loss computed outside that loop: the tests, the benchmarks and the GPU check share this one writer."""
    trainer.current_gradient_accumulation_steps = steps


def score_policy(trainer, model, input_ids, attention_mask, logits_to_keep: int, batch_size=None, **multimodal):
    """`(B, T)` log-probabilities of the `logits_to_keep` (T) last tokens of `input_ids` `(B, S)` under `model`, as
    the host scores a batch (`batch_size` rows per forward; None: all at once)."""
    outputs = trainer._get_per_token_logps_and_entropies(
        model, input_ids, attention_mask, logits_to_keep, batch_size, **multimodal
    )
    return outputs[0]  # (log-probabilities, entropies, ...): the rest is not asked for


def host_beta(trainer) -> float:
    """TRL's β of `trainer`: its config's `beta` as the host copied it at construction, unless set on the trainer since
    (a test's policy-only loss sets it to 0) or zeroed while the host's loss runs inside ours. At 0 the trainers hand
    the step to stock TRL; read from the trainer, not the config, because TRL's own loss reads it there."""
    return trainer.beta


# --- how the host turns rewards into advantages ----------------------------------------------------------------------


@dataclass(frozen=True)
class HostRewards:
    """What the host's scoring of a generation batch does with the rewards, for a trainer that recomputes its
    advantages from the same rewards.

    Attributes:
        group_size (`int`): completions per prompt in this mode (`num_generations`, `num_generations_eval`).
        weights (`torch.Tensor` of shape `(K,)`): the weights of the total reward TRL logs as `reward`.
        names (`list[str]`): the names TRL logs each reward function under, in order.
    """

    group_size: int
    weights: torch.Tensor
    names: list[str]


def host_rewards(trainer, mode: str) -> HostRewards:
    """`HostRewards` of `trainer`'s generation batches of `mode` ("train" or "eval")."""
    return HostRewards(
        group_size=trainer.num_generations if mode == "train" else trainer.num_generations_eval,
        weights=trainer.reward_weights,
        names=trainer.reward_func_names,
    )


def grpo_scale_rewards(trainer) -> str:
    """How TRL's GRPO scales its group advantages (`scale_rewards`, as its `__init__` normalized the config's)."""
    return trainer.scale_rewards


@dataclass(frozen=True)
class RLOOAdvantageSettings:
    """How TRL's RLOO turns a total reward into an advantage around its KL penalty."""

    normalize: bool  # `normalize_advantages`: standardized over the batch after the leave-one-out baseline
    reward_clip_range: tuple[float, float] | None  # each total reward clamped to it before the penalty; None: not


def rloo_advantage_settings(trainer) -> RLOOAdvantageSettings:
    """`RLOOAdvantageSettings` of a TRL `RLOOTrainer`."""
    return RLOOAdvantageSettings(normalize=trainer.normalize_advantages, reward_clip_range=trainer.reward_clip_range)


@contextmanager
def checking_reward_outputs(trainer):
    """While the host scores a batch: `trainer.reward_funcs` holds wrappers that check what each reward function
    returns (`inputs.checked_reward_funcs`), before TRL converts it. Outside, the list is the user's own, object for
    object."""
    funcs = trainer.reward_funcs
    trainer.reward_funcs = checked_reward_funcs(funcs, trainer.reward_func_names)
    try:
        yield
    finally:
        trainer.reward_funcs = funcs


# --- what the host logs ----------------------------------------------------------------------------------------------


def metric_store(trainer, mode: str) -> dict[str, list[float]]:
    """`trainer`'s metrics of `mode` ("train" or "eval"): name → values, which TRL averages and logs at the next `log`
    (prefixing "eval_" in evaluation). The one reader of TRL's undocumented `_metrics`, shared by the trainers, the
    binomial trainer and the callbacks."""
    return trainer._metrics[mode]


def has_metric_store(trainer) -> bool:
    """Whether `trainer` keeps TRL's metric store (a GRPO trainer, stock or ours): the question a callback that takes
    any trainer asks before it logs there, so a trainer without one is an answer, not an error."""
    return hasattr(trainer, "_metrics") and isinstance(trainer._metrics, dict) and "train" in trainer._metrics


def replace_logged_advantages(trainer, advantages: torch.Tensor) -> None:
    """Replaces the last `len(advantages)` entries of TRL's `_logs["advantages"]` (a bounded deque that TRL just
    extended with its own advantages), so that the completions table shows the advantages the loss uses."""
    logged = trainer._logs["advantages"]
    for _ in range(min(len(advantages), len(logged))):
        logged.pop()
    logged.extend(advantages.tolist())


def generation_buffer(trainer) -> list | None:
    """TRL's generation buffer: the micro-batches that `_prepare_inputs` returns in turn, `None` before the first. The
    binomial trainer's one reach into TRL's undocumented `_buffered_inputs`."""
    return trainer._buffered_inputs


# --- the models ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostModels:
    """The models and optimizer of a trainer that a reference reset or release touches.

    Attributes:
        policy: the unwrapped policy model.
        reference: TRL's full-model reference; `None` for a PEFT policy (its reference is an adapter) and once
            released (`release_reference_model`).
        optimizer: `None` until `train` builds it (unless one was passed in).
        sharding_engine (`str` or `None`): `"deepspeed"` or `"fsdp"` when that engine owns the models (a reset or a
            release must not touch them).
        zero_stage (`int` or `None`): DeepSpeed's ZeRO stage under DeepSpeed.
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
    """The host's `__init__`, run inside, builds no reference model: it reads `args.beta` into `trainer.beta` and
    loads a reference only when that is not 0, so `args.beta` is 0 inside; after, both hold the configured β again.
    Only for a policy that is not a PEFT model (TRL also reads `args.beta` to copy a PEFT adapter as the reference),
    and only when the reference will never be scored: the trainer must then refuse to score it."""
    beta, args.beta = args.beta, 0.0
    try:
        yield
    finally:
        args.beta = beta
    trainer.beta = beta


def release_reference_model(trainer) -> None:
    """Drops the full-model reference of `trainer` (its `ref_model` and the `Accelerator`'s hold on it), so that its
    memory is freed once nothing else refers to it. The host must not score the reference afterwards."""
    reference, trainer.ref_model = trainer.ref_model, None
    accelerator = trainer.accelerator
    accelerator._models = [model for model in accelerator._models if model is not reference]


# --- what the command touches ----------------------------------------------------------------------------------------


def set_wrapped_model(trainer, model) -> None:
    """Makes `model` the outermost model `trainer` holds (Transformers' `model_wrapped`, documented for reading only),
    e.g. `trainer.model` to drop a DDP wrapper before the process group it holds is destroyed."""
    trainer.model_wrapped = model


def close_progress_bars(trainer) -> None:
    """Closes the training progress bar of each of `trainer`'s `ProgressCallback`s that has one open (a run that an
    exception interrupted leaves it open, and a message printed then lands inside it)."""
    from transformers.trainer_callback import ProgressCallback  # not at import: see `check_trl_version`

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, ProgressCallback) and callback.training_bar is not None:
            callback.training_bar.close()
            callback.training_bar = None
