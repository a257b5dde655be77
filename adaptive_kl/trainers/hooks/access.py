"""The seam's accessors: the only way the package reaches an entry of `internals.HOST_INTERNALS`. The host's loss
settings, its rollouts, its state, what the command touches, and the layout of TRL's batches.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..inputs import checked_reward_funcs


# --- the layout of TRL's batches and logs ----------------------------------------------------------------------------


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


# --- the host's state ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostLossSettings:
    """How the host aggregates the micro-batch loss that the KL term is added to, read when that loss is computed (a
    test or a user may change them on the trainer between steps)."""

    loss_type: str  # TRL's `loss_type` ("grpo", "dapo", ...)
    importance_sampling_level: str  # "token" or "sequence"
    max_completion_length: int | None  # dr_grpo's constant normalizer
    accumulation_steps: float  # the optimizer step's micro-batches (1.0 in evaluation: TRL does not accumulate there)


def host_loss_settings(trainer, mode: str) -> HostLossSettings:
    """`trainer`'s loss aggregation for a micro-batch of `mode` ("train" or "eval")."""
    return HostLossSettings(
        loss_type=trainer.loss_type,
        importance_sampling_level=trainer.importance_sampling_level,
        max_completion_length=trainer.max_completion_length,
        accumulation_steps=accumulation_steps(trainer) if mode == "train" else 1.0,
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
    for a loss computed outside that loop: tests, benchmarks, the GPU check."""
    trainer.current_gradient_accumulation_steps = steps


def group_size(trainer, mode: str) -> int:
    """The completions per prompt of a generation batch of `mode` ("train" or "eval")."""
    return trainer.num_generations if mode == "train" else trainer.num_generations_eval


def scale_rewards(trainer) -> str | bool:
    """How the host scales its group advantages (TRL's `scale_rewards`)."""
    return trainer.scale_rewards


def reward_weights(trainer) -> torch.Tensor:
    """The `(K,)` weights of the total reward TRL logs as `reward` (one per reward function)."""
    return trainer.reward_weights


def reward_func_names(trainer) -> list[str]:
    """The names TRL logs each reward function under, in order."""
    return trainer.reward_func_names


def sampling_temperature(trainer) -> float:
    """The temperature the host samples completions at (and scores their log-probabilities at)."""
    return trainer.temperature


def sharding_engine(trainer) -> str | None:
    """`"deepspeed"` or `"fsdp"` when that engine owns `trainer`'s models (a reset or a release must not touch them),
    else `None`."""
    if trainer.is_deepspeed_enabled:
        return "deepspeed"
    return "fsdp" if trainer.is_fsdp_enabled else None


def host_optimizer(trainer):
    """`trainer`'s optimizer: `None` until `train` builds it (unless one was passed in)."""
    return trainer.optimizer


def reference_model(trainer):
    """TRL's full-model reference of `trainer`: `None` for a PEFT policy (its reference is an adapter) and once
    released (`release_reference_model`)."""
    return trainer.ref_model


def set_wrapped_model(trainer, model) -> None:
    """Makes `model` the outermost model `trainer` holds (Transformers' `model_wrapped`), e.g. `trainer.model` to drop
    a DDP wrapper before the process group it holds is destroyed."""
    trainer.model_wrapped = model


def close_progress_bars(trainer) -> None:
    """Closes the training progress bar of each of `trainer`'s `ProgressCallback`s that has one open (a run that an
    exception interrupted leaves it open, and a message printed then lands inside it)."""
    from transformers.trainer_callback import ProgressCallback  # not at import: see `check_trl_version`

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, ProgressCallback) and callback.training_bar is not None:
            callback.training_bar.close()
            callback.training_bar = None


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


def normalizes_advantages(trainer) -> bool:
    """Whether the RLOO host standardizes its leave-one-out advantages over the batch (`normalize_advantages`)."""
    return trainer.normalize_advantages


def reward_clip_range(trainer) -> tuple[float, float] | None:
    """The `(low, high)` range the RLOO host clamps each total reward to before its KL penalty, `None` for none."""
    return trainer.reward_clip_range


def host_beta(trainer) -> float:
    """TRL's β of `trainer` (its config's `beta`; 0 while the host's loss runs inside ours)."""
    return trainer.beta


def metric_store(trainer, mode: str) -> dict[str, list[float]]:
    """`trainer`'s metrics of `mode` ("train" or "eval"): name → values, which TRL averages and logs at the next `log`
    (prefixing "eval_" in evaluation)."""
    return trainer._metrics[mode]


def has_metric_store(trainer) -> bool:
    """Whether `trainer` keeps TRL's metric store (a GRPO trainer, stock or ours): the question a callback that takes
    any trainer asks before it logs there, so a trainer without one is an answer, not an error."""
    return hasattr(trainer, "_metrics") and isinstance(trainer._metrics, dict) and "train" in trainer._metrics


def generation_buffer(trainer) -> list | None:
    """TRL's generation buffer: the micro-batches that `_prepare_inputs` returns in turn, `None` before the first."""
    return trainer._buffered_inputs


def score_policy(trainer, model, input_ids, attention_mask, logits_to_keep: int, batch_size=None, **multimodal):
    """`(B, T)` log-probabilities of the `logits_to_keep` (T) last tokens of `input_ids` `(B, S)` under `model`, as
    the host scores a batch (`batch_size` rows per forward; None: all at once)."""
    outputs = trainer._get_per_token_logps_and_entropies(
        model, input_ids, attention_mask, logits_to_keep, batch_size, **multimodal
    )
    return outputs[0]  # (log-probabilities, entropies, ...): the rest is not asked for


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


def replace_logged_advantages(trainer, advantages: torch.Tensor) -> None:
    """Replaces the last `len(advantages)` entries of TRL's `_logs["advantages"]` (a bounded deque that TRL just
    extended with its own advantages), so that the completions table shows the advantages the loss uses."""
    logged = trainer._logs["advantages"]
    for _ in range(min(len(advantages), len(logged))):
        logged.pop()
    logged.extend(advantages.tolist())
