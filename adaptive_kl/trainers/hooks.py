"""The seam between this package's trainers and TRL's `GRPOTrainer` and `RLOOTrainer`: everything they take from the
host, in one place.

The GRPO trainers (`AdaptiveKLGRPOTrainer` and the experimental `BinomialKLTrainer`) subclass whatever
`trl.GRPOTrainer` is (TRL's own, or Unsloth's generated trainer), `AdaptiveKLRLOOTrainer` subclasses TRL's
`RLOOTrainer`, and they reach into their host only through this module:

- `HOST_INTERNALS`: every name of the host (`trl.GRPOTrainer`, its base `transformers.Trainer`, their
  `ProgressCallback` and `Accelerator`) that the package overrides, calls, reads or writes and that they do not
  document as public API: private names and undocumented attributes alike (`loss_type`, `scale_rewards`,
  `current_gradient_accumulation_steps`, ...), each with what the package does with it and its accessor here. No other
  module names one (`tests/trainers/test_seam.py` checks the whole package's source); Unsloth's own internals have
  their table in `adaptive_kl.trainers.unsloth`. `host_internals` selects the entries a host class must have: those
  owned by `trl.RLOOTrainer`, and `RLOO_SHARED_INTERNALS`, for RLOO; every other entry for GRPO;
- `check_trl_version`: the supported TRL range, read from the package metadata before TRL is imported;
- `resolve_args`: the trainer's config (a default one for `args=None`, a `TypeError` for a plain `GRPOConfig`), after
  refusing a host that Unsloth replaced once our classes were built on TRL's own;
- `check_host` (before any model is loaded) and `check_host_attributes` (right after the host's `__init__`): refuse a
  host that lacks any name of the table (where its kind says: `INTERNAL_KINDS`), or that computes its loss with
  Liger's fused loss (which never calls ours);
- `HostHooks`, the mixin that overrides the host's private methods and hands the trainers named extension points
  (`_on_generation_batch`, `_on_scored`, `_micro_batch_loss`, `_on_checkpoint_saved`, `_on_checkpoint_loaded`,
  `_on_callback_state_loaded`); it captures each generation batch's rewards and the log-probabilities the host scored
  it with (`generation_logps`) and, while the host's loss runs with β = 0, the policy log-probabilities it computes:
  exactly one scoring per loss, carrying a gradient in training;
- accessors, the only way the package reaches an entry of the table: the host's loss settings (`host_loss_settings`,
  `accumulation_steps`), its rollouts (`group_size`, `scale_rewards`, `reward_weights`, `reward_func_names`,
  `sampling_temperature`, `checking_reward_outputs`; RLOO's `normalizes_advantages`, `reward_clip_range`), its state
  (`host_beta`, `host_built_without_reference`, `reference_model`, `release_reference_model`, `sharding_engine`,
  `host_optimizer`, `metric_store`, `generation_buffer`, `score_policy`, `replace_logged_advantages`), what the
  command touches (`set_wrapped_model`, `close_progress_bars`), and the layout of TRL's batches
  (`completion_loss_mask`, `MULTIMODAL_INPUTS`).

No module reads a host attribute with a default (`getattr(trainer, name, None)`): a host that lacks an entry fails at
construction, naming it, rather than falling back silently.

A host that does not behave as these hooks expect raises `UnsupportedTRLError`, naming the installed TRL and the
supported range. `ADAPTIVE_KL_ALLOW_UNSUPPORTED_TRL=1` lets an unsupported TRL be imported, to try a new release; it
never lets one train on without the hooks (for instance without the KL term's gradient).
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import os
import re
import sys
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .inputs import check_drawn_prompts, checked_reward_funcs
from .unsloth import capturing_efficient_grpo, check_import_order


# Keep equal to the `trl` requirement in pyproject.toml (a test checks it).
SUPPORTED_TRL = ">=1.15,<1.17"
ALLOW_UNSUPPORTED_ENV = "ADAPTIVE_KL_ALLOW_UNSUPPORTED_TRL"


class UnsupportedTRLError(RuntimeError):
    """The installed TRL's `GRPOTrainer` does not call the methods this package hooks as it expects."""


def installed_trl_version() -> str:
    """The installed TRL's version, from its package metadata (TRL itself is not imported)."""
    try:
        return importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def check_trl_version(version: str | None = None) -> None:
    """Raises `ImportError` if the installed TRL (or `version`) is outside `SUPPORTED_TRL`.

    Reads the version from the package metadata, so TRL itself is not imported (Unsloth must be imported first).
    `ADAPTIVE_KL_ALLOW_UNSUPPORTED_TRL=1` turns the error into a warning.
    """
    if version is None:
        version = installed_trl_version()
        if version == "not installed":
            raise ImportError(f"adaptive-kl needs TRL: pip install 'trl{SUPPORTED_TRL}'")
    if Version(version) in SpecifierSet(SUPPORTED_TRL, prereleases=True):
        return
    message = (
        f"adaptive-kl supports trl{SUPPORTED_TRL}, but trl {version} is installed. Install a supported version: "
        f"pip install 'trl{SUPPORTED_TRL}'."
    )
    if os.environ.get(ALLOW_UNSUPPORTED_ENV) == "1":
        warnings.warn(f"{message} Continuing because {ALLOW_UNSUPPORTED_ENV}=1.", UserWarning, stacklevel=2)
        return
    raise ImportError(f"{message} To try this version anyway, set {ALLOW_UNSUPPORTED_ENV}=1.")


def unsupported_trl(problem: str) -> UnsupportedTRLError:
    """The error for a host that does not behave as the hooks expect: what happened, and which TRL to install."""
    return UnsupportedTRLError(
        f"{problem}. The installed TRL (trl {installed_trl_version()}) does not behave as adaptive-kl expects; it "
        f"supports trl{SUPPORTED_TRL}: pip install 'trl{SUPPORTED_TRL}'. ({ALLOW_UNSUPPORTED_ENV} does not lift this "
        "check: training on would silently change the objective.)"
    )


# --- the host's internals --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostInternal:
    """A name of the host that this package uses and that the host does not document as public API: a private one, or
    an attribute its classes set without documenting it (e.g. `GRPOTrainer.loss_type`, a copy of `args.loss_type`)."""

    name: str
    owner: str  # the class that defines it
    kind: str  # where it lives, hence how it is checked at construction: one of `INTERNAL_KINDS`
    use: str  # what the package does with it, and the accessor of this module that reaches it


# How each kind of entry is checked when a trainer is built (`check_host`, then `check_host_attributes`).
INTERNAL_KINDS = {
    "method": "overridden or called: the host class has it",
    "class attribute": "the host class has it",
    "attribute": "set by the host's `__init__`: the built trainer has it",
    "training attribute": "set by the host's training loop, not by `__init__`: a class of the host's MRO assigns it",
    "accelerator attribute": "of the `Accelerator` the host's `__init__` builds: it has it",
    "callback attribute": "of the host's `ProgressCallback`, set by its `__init__`: each one in the handler has it",
}


# Read in the host's source on trl 1.15.0 (transformers 5.17.0) and trl 1.16.0 (transformers 5.23.0 and 5.24.0).
HOST_INTERNALS_CHECKED_ON = ("trl 1.15.0, transformers 5.17.0", "trl 1.16.0, transformers 5.23.0 and 5.24.0")
HOST_INTERNALS = (
    HostInternal("_generate_and_score_completions", "trl.GRPOTrainer", "method",
                 "wrapped: a streamed batch's prompts are checked and a pending reference reset applied before it is "
                 "scored; run with β = 0 when the trainer needs no reference log-probabilities, which TRL then skips; "
                 "its rewards go to the trainer after (`_on_generation_batch`, `_scores_reference`, `_on_scored`)"),
    HostInternal("_calculate_rewards", "trl.GRPOTrainer", "method",
                 "wrapped: each reward function's output is checked and the gathered (N, K) rewards are kept"),
    HostInternal("_get_per_token_logps_and_entropies", "trl.GRPOTrainer", "method",
                 "wrapped inside the host's loss to capture the policy log-probabilities; called to score the "
                 "sampling policy for KL in the reward (`score_policy`)"),
    HostInternal("_compute_loss", "trl.GRPOTrainer", "method",
                 "the micro-batch loss: run with β = 0 inside ours; the binomial trainer replaces it "
                 "(`_micro_batch_loss`)"),
    HostInternal("_prepare_inputs", "trl.GRPOTrainer", "method",
                 "fills the generation buffer whose slots the binomial trainer counts correct sequences over"),
    HostInternal("_save_checkpoint", "transformers.Trainer", "method",
                 "extended: the reset reference's weights are saved in the checkpoint (`_on_checkpoint_saved`)"),
    HostInternal("_get_output_dir", "transformers.Trainer", "method",
                 "the directory `_save_checkpoint` wrote the checkpoint under"),
    HostInternal("_load_from_checkpoint", "transformers.Trainer", "method",
                 "extended: a PEFT model with a 'ref' adapter gets its trained adapter back "
                 "(`_on_checkpoint_loaded`)"),
    HostInternal("_load_callback_state", "transformers.Trainer", "method",
                 "extended: re-instantiated state callbacks get the trainer's controller "
                 "(`_on_callback_state_loaded`)"),
    HostInternal("_tag_names", "trl.GRPOTrainer", "class attribute",
                 "the model card's tags: each trainer appends its own (`HostHooks(hub_tag=...)`)"),
    HostInternal("_metrics", "trl.GRPOTrainer", "attribute",
                 "{'train'|'eval': {name: [values]}}: what is appended, TRL averages and logs (`metric_store`)"),
    HostInternal("_logs", "trl.GRPOTrainer", "attribute",
                 "the completions table: its 'advantages' become those the loss uses (`replace_logged_advantages`)"),
    HostInternal("_buffered_inputs", "trl.GRPOTrainer", "attribute",
                 "the generation buffer: a list of micro-batches, None before the first (`generation_buffer`)"),
    HostInternal("beta", "trl.GRPOTrainer", "attribute",
                 "TRL's β: set to 0 while the host's loss runs inside ours, and while it scores a generation batch "
                 "without the reference; read to know whether the KL is on (`host_beta`). The host's `__init__` reads "
                 "it from `args.beta` and builds no reference model when it is 0 (`host_built_without_reference`)"),
    HostInternal("ref_model", "trl.GRPOTrainer", "attribute",
                 "the full-model reference (None for PEFT): dropped once β is 0 for good (`release_reference_model`)"),
    HostInternal("_models", "accelerate.Accelerator", "accelerator attribute",
                 "the models `prepare_model` keeps, the reference among them: it is removed there too when released"),
    HostInternal("loss_type", "trl.GRPOTrainer", "attribute",
                 "the loss's aggregation, which the KL term shares (`host_loss_settings`)"),
    HostInternal("importance_sampling_level", "trl.GRPOTrainer", "attribute",
                 "token or sequence: how the KL term's bias correction weights tokens (`host_loss_settings`)"),
    HostInternal("max_completion_length", "trl.GRPOTrainer", "attribute",
                 "dr_grpo's constant normalizer, which the KL term shares (`host_loss_settings`)"),
    HostInternal("current_gradient_accumulation_steps", "transformers.Trainer", "training attribute",
                 "the micro-batches of the optimizer step in progress (fewer for a last partial step): the KL term's "
                 "normalizer and the binomial trainer's step (`accumulation_steps`)"),
    HostInternal("scale_rewards", "trl.GRPOTrainer", "attribute",
                 "how KL-in-the-reward's group advantages are scaled, as the host's (`scale_rewards`)"),
    HostInternal("num_generations", "trl.GRPOTrainer", "attribute",
                 "the group size in training: advantages and diversity groups (`group_size`)"),
    HostInternal("num_generations_eval", "trl.GRPOTrainer", "attribute",
                 "the group size in evaluation (`group_size`)"),
    HostInternal("reward_weights", "trl.GRPOTrainer", "attribute",
                 "the (K,) weights of the total reward TRL logs as `reward` (`reward_weights`)"),
    HostInternal("reward_funcs", "trl.GRPOTrainer", "attribute",
                 "swapped for checking wrappers while a batch is scored, the user's list again after "
                 "(`checking_reward_outputs`)"),
    HostInternal("reward_func_names", "trl.GRPOTrainer", "attribute",
                 "the names TRL logs each reward function under: named in warnings and errors (`reward_func_names`)"),
    HostInternal("temperature", "trl.GRPOTrainer", "attribute",
                 "the sampling temperature the binomial trainer's log-probabilities use (`sampling_temperature`)"),
    HostInternal("is_deepspeed_enabled", "transformers.Trainer", "attribute",
                 "a DeepSpeed engine owns the models: no reset under ZeRO-3, no release (`sharding_engine`)"),
    HostInternal("is_fsdp_enabled", "transformers.Trainer", "attribute",
                 "FSDP shards the models: no reset, no release (`sharding_engine`)"),
    HostInternal("optimizer", "transformers.Trainer", "attribute",
                 "its moments are cleared by a reset with `ref_reset_optimizer` (`host_optimizer`)"),
    HostInternal("model_wrapped", "transformers.Trainer", "attribute",
                 "documented for reading only; the command sets it back to the model to drop the DDP wrapper before "
                 "the process group ends (`set_wrapped_model`)"),
    HostInternal("training_bar", "transformers.ProgressCallback", "callback attribute",
                 "the progress bar a run interrupted by a bad reward output leaves open: closed before the message "
                 "(`close_progress_bars`)"),
    HostInternal("_ChunkedLogProbFunction", "trl.trainer.utils", "module attribute",
                 "TRL's fused LM-head scorer (1.15: Triton only, None without it; 1.16: a torch fallback off a GPU): "
                 "replaced by a plain-torch stand-in where it fails for "
                 "training on a CPU (`host_log_prob_scorer`, `replace_host_log_prob_scorer`; `trainers.scorer`)"),
    HostInternal("normalize_advantages", "trl.RLOOTrainer", "attribute",
                 "whether RLOO standardizes its leave-one-out advantages over the batch, as the penalized ones are "
                 "(`normalizes_advantages`)"),
    HostInternal("reward_clip_range", "trl.RLOOTrainer", "attribute",
                 "the range RLOO clamps total rewards to before its KL penalty, as the penalized ones are "
                 "(`reward_clip_range`)"),
)  # fmt: skip
# Not in the table, because its *absence* is what is checked: `_compute_liger_loss` (see `check_host`).

# The entries owned by `trl.GRPOTrainer` (or Transformers) that `trl.RLOOTrainer` has too and that
# `AdaptiveKLRLOOTrainer` (through `HostHooks`) uses; the entries owned by `trl.RLOOTrainer` are RLOO's alone.
RLOO_SHARED_INTERNALS = frozenset({
    "_generate_and_score_completions", "_calculate_rewards", "_get_per_token_logps_and_entropies", "_compute_loss",
    "_save_checkpoint", "_get_output_dir", "_load_from_checkpoint", "_load_callback_state", "_tag_names", "_metrics",
    "_logs", "beta", "num_generations", "num_generations_eval", "reward_weights", "reward_funcs", "reward_func_names",
    # the reference resets and the zero-β skip (`resetter`, `zero_beta`)
    "ref_model", "_models", "is_deepspeed_enabled", "is_fsdp_enabled", "optimizer",
})  # fmt: skip


def is_rloo_host(host: type) -> bool:
    """Whether `host` is (a subclass of) TRL's `RLOOTrainer` rather than its `GRPOTrainer`."""
    return any(cls.__name__ == "RLOOTrainer" for cls in host.__mro__)


def host_internals(host: type) -> tuple[HostInternal, ...]:
    """The entries of `HOST_INTERNALS` that the host trainer class `host` must have: RLOO's (its own and those it
    shares with GRPO, `RLOO_SHARED_INTERNALS`) or GRPO's (every entry not owned by `trl.RLOOTrainer`)."""
    if is_rloo_host(host):
        return tuple(i for i in HOST_INTERNALS if i.owner == "trl.RLOOTrainer" or i.name in RLOO_SHARED_INTERNALS)
    return tuple(i for i in HOST_INTERNALS if i.owner != "trl.RLOOTrainer")


def has_host_log_prob_scorer() -> bool:
    """Whether TRL names a fused LM-head scorer (`trl.trainer.utils._ChunkedLogProbFunction`: TRL 1.15 and 1.16)."""
    import trl.trainer.utils as trl_utils

    return "_ChunkedLogProbFunction" in vars(trl_utils)


def host_log_prob_scorer():
    """TRL's fused LM-head scorer: its kernel's autograd function, or `None` where TRL 1.15 found no Triton."""
    import trl.trainer.utils as trl_utils

    return trl_utils._ChunkedLogProbFunction


def replace_host_log_prob_scorer(scorer) -> None:
    """Makes TRL score log-probabilities with `scorer` (same `apply` call as `_ChunkedLogProbFunction`), for the whole
    process: stock trainers and ours alike."""
    import trl.trainer.utils as trl_utils

    if "_ChunkedLogProbFunction" not in vars(trl_utils):
        raise unsupported_trl("trl.trainer.utils has no _ChunkedLogProbFunction to replace")
    trl_utils._ChunkedLogProbFunction = scorer


# --- before anything is loaded ---------------------------------------------------------------------------------------


def check_host(host: type, args, trainer_name: str, own_loss: bool) -> None:
    """Refuses a host whose loss would not go through the trainer `trainer_name`, before any model is loaded.

    Args:
        host (`type`): the `GRPOTrainer` the trainer subclasses (bound when its module was first imported).
        args: the trainer's config.
        trainer_name (`str`): for the messages.
        own_loss (`bool`): whether the trainer's loss is in use (`AdaptiveKLGRPOTrainer`: only with β > 0).

    Raises:
        UnsupportedTRLError: the host lacks a method or class attribute of `HOST_INTERNALS`, or no class of its MRO
            sets one of its training attributes.
        ValueError: `use_liger_kernel=True` on a host that computes its loss with Liger's fused GRPO loss
            (`_compute_liger_loss`), which never calls ours. TRL 1.15 and 1.16 have no such path: there Liger only
            swaps layer kernels, and the loss is TRL's own.
    """
    missing = [
        internal.name
        for internal in host_internals(host)
        if (
            internal.kind == "method" and not (hasattr(host, internal.name) and callable(getattr(host, internal.name)))
        )
        or (internal.kind == "class attribute" and not hasattr(host, internal.name))
        or (internal.kind == "training attribute" and not assigned_in_host_source(host, internal.name))
    ]
    if missing:
        raise unsupported_trl(
            f"{host.__module__}.{host.__qualname__} has no {missing}, which {trainer_name} hooks into"
        )
    if own_loss and args.use_liger_kernel and hasattr(host, "_compute_liger_loss"):
        raise ValueError(
            f"use_liger_kernel=True makes this GRPOTrainer compute its loss with Liger's fused GRPO loss, which never "
            f"calls {trainer_name}'s loss. Set use_liger_kernel=False."
        )


@functools.cache  # once per process: it reads the modules' source
def assigned_in_host_source(host: type, name: str) -> bool:
    """Whether the module of a TRL or Transformers class of `host`'s MRO assigns `self.<name>`: how an attribute that
    only the training loop sets (so a trainer that has not trained lacks it) is checked before any model is loaded."""
    pattern = re.compile(rf"\bself\.{re.escape(name)}\s*=[^=]")
    modules = {cls.__module__ for cls in host.__mro__ if cls.__module__.split(".")[0] in ("trl", "transformers")}
    for module in modules:  # not ours, nor Unsloth's generated module (no source file), nor `builtins`
        try:
            if pattern.search(inspect.getsource(sys.modules[module])):
                return True
        except (OSError, TypeError):
            continue
    return False


def check_host_attributes(trainer) -> None:
    """Refuses, right after the host's `__init__`, a host that did not set an attribute of `HOST_INTERNALS`: on the
    trainer, on its `Accelerator`, and on each of its `ProgressCallback`s.

    Raises:
        UnsupportedTRLError: naming the missing attributes.
    """
    from transformers.trainer_callback import ProgressCallback  # not at import: see `check_trl_version`

    bars = [callback for callback in trainer.callback_handler.callbacks if isinstance(callback, ProgressCallback)]
    owners = {"attribute": [trainer], "accelerator attribute": [trainer.accelerator], "callback attribute": bars}
    missing = [
        internal.name
        for internal in host_internals(type(trainer))
        if any(not hasattr(owner, internal.name) for owner in owners.get(internal.kind, ()))
    ]
    if missing:
        raise unsupported_trl(f"the host's __init__ set no {missing}, which {type(trainer).__name__} uses")


def resolve_args(host: type, config_cls: type, model, args, trainer_name: str, run_suffix: str):
    """The trainer's config: `args`, or for `None` a default `config_cls` named after the model, as TRL does. The first
    check of every trainer's `__init__`.

    Raises:
        ImportError: Unsloth replaced `trl.GRPOTrainer` after the trainer was built on TRL's own `host` (import order).
        TypeError: `args` is not a `config_cls` (e.g. a plain `GRPOConfig`, which lacks this package's fields).
    """
    import trl  # already imported by the trainer's module; not at this module's import (see `check_trl_version`)

    family = "RLOO" if is_rloo_host(host) else "GRPO"
    check_import_order(host, getattr(trl, f"{family}Trainer"), f"{family}Trainer")
    if args is None:
        name = model if isinstance(model, str) else model.config.name_or_path
        return config_cls(f"{name.split('/')[-1]}-{run_suffix}")
    if not isinstance(args, config_cls):
        raise TypeError(
            f"{trainer_name} needs a {config_cls.__name__}, got {type(args).__name__}. It accepts every "
            f"{family}Config argument: replace {family}Config(...) by {config_cls.__name__}(...)."
        )
    return args


# --- while training --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoredBatch:
    """One generation batch as the host scored it: what `HostHooks._on_scored` hands the trainer.

    Attributes:
        output (`dict`): the host's output for this process's B completions; editable (its advantages, added keys).
        mode (`str`): `"train"` or `"eval"`.
        rewards_per_func (`torch.Tensor` of shape `(N, K)`): every process's rewards per reward function, gathered,
            NaN where a function returned None.
        policy_logps (`torch.Tensor` of shape `(B, T)` or `None`): log π at the sampled tokens under the policy that
            sampled them, as the host scored them; `None` when the host did not (TRL's GRPO when on-policy).
        ref_logps (`torch.Tensor` of shape `(B, T)` or `None`): log π_ref at the sampled tokens; `None` when the batch
            was scored without the reference (the host's β is 0, or `_scores_reference` said so).
        mask (`torch.Tensor` of shape `(B, T)`): the completion tokens a KL may count (`completion_loss_mask`).
    """

    output: dict
    mode: str
    rewards_per_func: torch.Tensor
    policy_logps: torch.Tensor | None
    ref_logps: torch.Tensor | None
    mask: torch.Tensor


class HostHooks:
    """Mixin for the subclasses of `GRPOTrainer` and `RLOOTrainer` (listed before it): the host hooks every trainer
    here shares.

    It overrides the host's private methods of `HOST_INTERNALS`, so that the trainers extend only these named points
    (each a no-op or the host's own behaviour unless overridden):

    - `_on_generation_batch(mode)`: before the host generates and scores a training or evaluation batch;
    - `_scores_reference(mode)`: whether that batch needs the reference log-probabilities (default: whenever the
      host computes them); when not, the host scores it with β = 0, which skips the reference forward, and its
      output has no `ref_per_token_logps`;
    - `_on_scored(batch)`: after it, with the batch as the host scored it (`ScoredBatch`): its output (editable), the
      gathered `(N, K)` rewards that `_calculate_rewards` computed (after checking what each reward function
      returned), and the log-probabilities of the sampling policy and of the reference the host computed for it,
      named whatever the host (GRPO keeps them in its output, RLOO only scores them, in an order this seam knows). A
      host that scored a batch without calling `_calculate_rewards`, or RLOO's scoring another number of times, is
      refused;
    - `_micro_batch_loss(model, inputs)`: the loss of one micro-batch (the host's `_compute_loss`);
    - `_on_checkpoint_saved(checkpoint)`, `_on_checkpoint_loaded(checkpoint)` and `_on_callback_state_loaded()`:
      after the host saved a checkpoint directory, loaded the model from one, and restored its callbacks' state.

    These extension points are internal: their names are private because their signatures follow what TRL's private
    methods offer, and may change with a supported TRL release. Subclass the trainers' public API instead.

    Policy scoring: inside `host_loss_without_kl()`, the host's loss runs with β = 0 and every
    `_get_per_token_logps_and_entropies` result is recorded; `captured_policy_logps` checks that there was exactly one
    and that it carries a gradient in training.

    A subclass names its model-card tag in its bases: `class MyTrainer(HostHooks, GRPOTrainer, hub_tag="my-tag")`.
    """

    _rewards_per_func: torch.Tensor | None = None  # set while a generation batch is scored
    _policy_scorings: list[torch.Tensor] | None = None  # open while the host's loss runs inside ours
    _generation_scorings: list[torch.Tensor] | None = None  # open while the host scores a generation batch

    def __init_subclass__(cls, hub_tag: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if hub_tag is not None:
            cls._tag_names = [*cls._tag_names, hub_tag]  # the host's tags, then ours

    # --- extension points -----------------------------------------------------------------------------------------

    def _on_generation_batch(self, mode: str) -> None:
        """Called before the host generates and scores a batch of `mode` ("train" or "eval")."""

    def _scores_reference(self, mode: str) -> bool:
        """Whether the generation batch about to be scored in `mode` needs the reference log-probabilities."""
        return True

    def _on_scored(self, batch: ScoredBatch) -> None:
        """Called once per scored generation batch, with what the host computed for it (`batch.output` editable)."""

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

    def _save_checkpoint(self, model, trial):
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR  # not at import: see `check_trl_version`

        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            checkpoint = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            self._on_checkpoint_saved(os.path.join(self._get_output_dir(trial=trial), checkpoint))

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
        scores_reference = self._scores_reference(mode) and host_beta(self) != 0.0
        try:
            with nullcontext() if scores_reference else self._host_beta_zero():
                output = super()._generate_and_score_completions(inputs)
            scorings = tuple(self._generation_scorings)
        finally:
            self._generation_scorings = None
        rewards_per_func, self._rewards_per_func = self._rewards_per_func, None
        if rewards_per_func is None:
            raise unsupported_trl(
                f"{type(self).__name__} could not capture the rewards of a generation batch: the host's "
                "_generate_and_score_completions no longer calls _calculate_rewards"
            )
        self._on_scored(self._scored_batch(output, rewards_per_func, mode, scorings, scores_reference))
        return output

    def _scored_batch(
        self, output: dict, rewards_per_func: torch.Tensor, mode: str, scorings: tuple, scores_reference: bool
    ) -> ScoredBatch:
        """What the host computed for a generation batch, named. TRL's GRPO keeps its log-probabilities in its output
        (`old_per_token_logps` when it needs them, `ref_per_token_logps` when it scored the reference); TRL's RLOO
        keeps only their sums, and scores the sampling policy, then the reference when its β is not 0: its
        `scorings` (every `_get_per_token_logps_and_entropies` result while it scored the batch) are named by that
        order.

        Raises:
            UnsupportedTRLError: RLOO scored the batch another number of times.
        """
        if is_rloo_host(type(self)):
            expected = 2 if scores_reference else 1
            if len(scorings) != expected:
                what = "the policy, then the reference" if scores_reference else "the policy only (β = 0)"
                raise unsupported_trl(
                    f"{type(self).__name__} expects the host to score a generation batch with {what} "
                    f"(_get_per_token_logps_and_entropies, {expected} times), but it did {len(scorings)}"
                )
            policy_logps, ref_logps = scorings[0], scorings[1] if scores_reference else None
        else:
            policy_logps, ref_logps = output.get("old_per_token_logps"), output.get("ref_per_token_logps")
        return ScoredBatch(
            output=output,
            mode=mode,
            rewards_per_func=rewards_per_func,
            policy_logps=policy_logps,
            ref_logps=ref_logps,
            mask=completion_loss_mask(output),
        )

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
        host_beta, self.beta = self.beta, 0.0
        try:
            yield
        finally:
            self.beta = host_beta

    @contextmanager
    def host_loss_without_kl(self):
        """Runs the host's loss with β = 0 and yields what it computed: `{"policy_logps": [...]}`, and on Unsloth
        `"efficient_grpo"`, the arguments of its efficient loss (which the shim, if installed, runs with β = 0)."""
        capture = {"policy_logps": []}
        self._policy_scorings = capture["policy_logps"]
        try:
            with self._host_beta_zero(), capturing_efficient_grpo(capture):  # the capture: Unsloth's shim only
                yield capture
        finally:
            self._policy_scorings = None

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
