"""The seam's table and checks: the supported TRL, the host's undocumented names the package uses (`HOST_INTERNALS`)
and the checks that refuse a host lacking one (`check_host`, `check_host_attributes`); whether Unsloth generated the
host (`is_unsloth_class`, `check_import_order`), and the trainers' config (`resolve_args`).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import re
import sys
import warnings
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version


# Keep equal to the `trl` requirement in pyproject.toml (a test checks it).
SUPPORTED_TRL = ">=1.15,<1.17"
ALLOW_UNSUPPORTED_ENV = "ADAPTIVE_KL_ALLOW_UNSUPPORTED_TRL"


class UnsupportedTRLError(RuntimeError):
    """The installed TRL's `GRPOTrainer` or `RLOOTrainer` does not call the methods this package hooks as expected."""


def installed_trl_version() -> str:
    """The installed TRL's version, from its package metadata (TRL itself is not imported)."""
    try:
        return importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def check_trl_version(version: str | None = None) -> None:
    """Raises `ImportError` if the installed TRL (or `version`) is outside `SUPPORTED_TRL`, without importing TRL
    (Unsloth must be imported first). `ADAPTIVE_KL_ALLOW_UNSUPPORTED_TRL=1` turns the error into a warning."""
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
    owner: str  # the class (or classes, each defining its own) that defines it
    hosts: tuple[str, ...]  # the host families whose trainers use it (`HOST_FAMILIES`)
    kind: str  # where it lives, hence how it is checked at construction: one of `INTERNAL_KINDS`
    use: str  # what the package does with it, and the accessor of the seam that reaches it


# The host families a trainer names when it checks its host: TRL's class each family's trainers subclass.
HOST_FAMILIES = {"grpo": "trl.GRPOTrainer", "rloo": "trl.RLOOTrainer"}
BOTH_HOSTS = "trl.GRPOTrainer, trl.RLOOTrainer"  # names each of the two TRL trainers defines for itself

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
    HostInternal("_generate_and_score_completions", BOTH_HOSTS, ("grpo", "rloo"), "method",
                 "wrapped (`HostHooks`): prompts checked, a pending reset applied; run at β = 0, skipping the "
                 "reference forward, when `_before_scoring` says it is not needed; rewards handed to `_on_scored`"),
    HostInternal("_calculate_rewards", BOTH_HOSTS, ("grpo", "rloo"), "method",
                 "wrapped: each reward function's output is checked and the gathered (N, K) rewards are kept"),
    HostInternal("_get_per_token_logps_and_entropies", BOTH_HOSTS, ("grpo", "rloo"), "method",
                 "wrapped to capture the policy log-probabilities; scores the sampling policy for KL in the reward"),
    HostInternal("_compute_loss", BOTH_HOSTS, ("grpo", "rloo"), "method",
                 "the micro-batch loss: run with β = 0 inside ours; the binomial trainer replaces it"),
    HostInternal("_prepare_inputs", "trl.GRPOTrainer", ("grpo",), "method",
                 "fills the generation buffer whose slots the binomial trainer counts correct sequences over"),
    HostInternal("_load_from_checkpoint", "transformers.Trainer", ("grpo", "rloo"), "method",
                 "extended: a PEFT model with a 'ref' adapter gets its trained adapter back (`AdaptiveKLRun`)"),
    HostInternal("_load_callback_state", "transformers.Trainer", ("grpo", "rloo"), "method",
                 "extended: re-instantiated state callbacks get the trainer's controller (`AdaptiveKLRun`)"),
    HostInternal("_tag_names", BOTH_HOSTS, ("grpo", "rloo"), "class attribute",
                 "the model card's tags: each trainer appends its own (`HostHooks(hub_tag=...)`)"),
    HostInternal("_metrics", BOTH_HOSTS, ("grpo", "rloo"), "attribute",
                 "{'train'|'eval': {name: [values]}}: what is appended, TRL averages and logs"),
    HostInternal("_logs", BOTH_HOSTS, ("grpo", "rloo"), "attribute",
                 "the completions table: its 'advantages' become those the loss uses (`one_pass_log`)"),
    HostInternal("_buffered_inputs", "trl.GRPOTrainer", ("grpo",), "attribute",
                 "the generation buffer: a list of micro-batches, None before the first (the binomial trainer)"),
    HostInternal("beta", BOTH_HOSTS, ("grpo", "rloo"), "attribute",
                 "TRL's β: 0 while the host's loss runs inside ours or scores a batch without the reference; tells if "
                 "the KL is on; at `args.beta=0` the host builds no reference (`host_built_without_reference`)"),
    HostInternal("ref_model", BOTH_HOSTS, ("grpo", "rloo"), "attribute",
                 "the full-model reference (None for PEFT): reset (`host_models`), dropped once β is 0 for good; "
                 "the start the drift controller measures against (`callbacks.start_policy`)"),
    HostInternal("_models", "accelerate.Accelerator", ("grpo", "rloo"), "accelerator attribute",
                 "the models `prepare_model` keeps, the reference among them: it is removed there too when released"),
    HostInternal("loss_type", "trl.GRPOTrainer", ("grpo",), "attribute",
                 "the loss's aggregation, which the KL term shares"),
    HostInternal("importance_sampling_level", "trl.GRPOTrainer", ("grpo",), "attribute",
                 "token or sequence: how the KL term's bias correction weights tokens"),
    HostInternal("max_completion_length", "trl.GRPOTrainer", ("grpo",), "attribute",
                 "dr_grpo's constant normalizer, which the KL term shares"),
    HostInternal("current_gradient_accumulation_steps", "transformers.Trainer", ("grpo",), "training attribute",
                 "the step's micro-batches: the KL normalizer and the binomial trainer's step (`accumulation_steps`)"),
    HostInternal("scale_rewards", "trl.GRPOTrainer", ("grpo",), "attribute",
                 "how KL-in-the-reward's group advantages are scaled, as the host's"),
    HostInternal("num_generations", BOTH_HOSTS, ("grpo", "rloo"), "attribute",
                 "the group size in training: advantages and diversity groups"),
    HostInternal("num_generations_eval", BOTH_HOSTS, ("grpo", "rloo"), "attribute",
                 "the group size in evaluation"),
    HostInternal("reward_weights", BOTH_HOSTS, ("grpo", "rloo"), "attribute",
                 "the (K,) weights of the total reward TRL logs as `reward`"),
    HostInternal("reward_funcs", BOTH_HOSTS, ("grpo", "rloo"), "attribute",
                 "swapped for checking wrappers while a batch is scored, the user's list again after (`HostHooks`)"),
    HostInternal("reward_func_names", BOTH_HOSTS, ("grpo", "rloo"), "attribute",
                 "the names TRL logs each reward function under: named in warnings and errors"),
    HostInternal("temperature", "trl.GRPOTrainer", ("grpo",), "attribute",
                 "the sampling temperature the binomial trainer's log-probabilities use"),
    HostInternal("is_deepspeed_enabled", "transformers.Trainer", ("grpo", "rloo"), "attribute",
                 "a DeepSpeed engine owns the models: no reset under ZeRO-3, no release (`host_models`)"),
    HostInternal("is_fsdp_enabled", "transformers.Trainer", ("grpo", "rloo"), "attribute",
                 "FSDP shards the models: no reset, no release (`host_models`)"),
    HostInternal("optimizer", "transformers.Trainer", ("grpo", "rloo"), "attribute",
                 "its moments are cleared by a reset with `ref_reset_optimizer` (`host_models`)"),
    HostInternal("model_wrapped", "transformers.Trainer", ("grpo",), "attribute",
                 "documented for reading only; the command sets it back to the model, dropping the DDP wrapper before "
                 "the process group ends"),
    HostInternal("training_bar", "transformers.ProgressCallback", ("grpo",), "callback attribute",
                 "left open by a run a bad reward interrupted: closed before the message (`close_progress_bars`)"),
    HostInternal("_ChunkedLogProbFunction", "trl.trainer.utils", ("grpo",), "module attribute",
                 "TRL's fused LM-head scorer (1.15: Triton only, None without it; 1.16: a torch fallback off a GPU): "
                 "replaced by a plain-torch stand-in where it fails on a CPU (`trainers.scorer`)"),
    HostInternal("normalize_advantages", "trl.RLOOTrainer", ("rloo",), "attribute",
                 "whether RLOO standardizes its leave-one-out advantages over the batch, as the penalized ones are"),
    HostInternal("reward_clip_range", "trl.RLOOTrainer", ("rloo",), "attribute",
                 "the range RLOO clamps total rewards to before its KL penalty, as the penalized ones are"),
)  # fmt: skip
# Not in the table, because its *absence* is what is checked: `_compute_liger_loss` (see `check_host`).


def host_internals(family: str) -> tuple[HostInternal, ...]:
    """The entries of `HOST_INTERNALS` that a host of `family` (a key of `HOST_FAMILIES`) must have."""
    if family not in HOST_FAMILIES:
        raise ValueError(f"family must be one of {tuple(HOST_FAMILIES)}, got {family!r}.")
    return tuple(internal for internal in HOST_INTERNALS if family in internal.hosts)


# --- before anything is loaded ---------------------------------------------------------------------------------------


def check_host(host: type, family: str, args, trainer_name: str, own_loss: bool) -> None:
    """Refuses a `host` (of `family`) whose loss would not go through the trainer `trainer_name`, before any model is
    loaded. `own_loss`: whether the trainer's loss is in use (`AdaptiveKLGRPOTrainer`: only with β > 0).

    Raises:
        UnsupportedTRLError: the host lacks a method or class attribute of `HOST_INTERNALS`, or no class of its MRO
            sets one of its training attributes.
        ValueError: `use_liger_kernel=True` on a host that computes its loss with Liger's fused GRPO loss
            (`_compute_liger_loss`), which never calls ours. TRL 1.15 and 1.16 have no such path: there Liger only
            swaps layer kernels.
    """
    missing = [
        internal.name
        for internal in host_internals(family)
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


def check_host_attributes(trainer, family: str) -> None:
    """Refuses (`UnsupportedTRLError`), right after the host's `__init__`, a host of `family` that did not set an
    attribute of `HOST_INTERNALS`: on the trainer, on its `Accelerator`, and on each of its `ProgressCallback`s."""
    from transformers.trainer_callback import ProgressCallback  # not at import: see `check_trl_version`

    bars = [callback for callback in trainer.callback_handler.callbacks if isinstance(callback, ProgressCallback)]
    owners = {"attribute": [trainer], "accelerator attribute": [trainer.accelerator], "callback attribute": bars}
    missing = [
        internal.name
        for internal in host_internals(family)
        if any(not hasattr(owner, internal.name) for owner in owners.get(internal.kind, ()))
    ]
    if missing:
        raise unsupported_trl(f"the host's __init__ set no {missing}, which {type(trainer).__name__} uses")


def resolve_args(host: type, family: str, config_cls: type, model, args, trainer_name: str, run_suffix: str):
    """The trainer's config: `args`, or for `None` a default `config_cls` named `<model>-<run_suffix>`, as TRL does.
    The first check of every trainer's `__init__`.

    Raises:
        ImportError: Unsloth replaced `trl.GRPOTrainer` after the trainer was built on TRL's own `host` (import order).
        TypeError: `args` is not a `config_cls` (e.g. a plain `GRPOConfig`, which lacks this package's fields).
    """
    import trl  # already imported by the trainer's module; not at this module's import (see `check_trl_version`)

    name = HOST_FAMILIES[family].removeprefix("trl.")
    check_import_order(host, getattr(trl, name), name)
    if args is None:
        name = model if isinstance(model, str) else model.config.name_or_path
        return config_cls(f"{name.split('/')[-1]}-{run_suffix}")
    if not isinstance(args, config_cls):
        raise TypeError(
            f"{trainer_name} needs a {config_cls.__name__}, got {type(args).__name__}. It accepts every "
            f"{family.upper()}Config argument: replace {family.upper()}Config(...) by {config_cls.__name__}(...)."
        )
    return args


# --- whether Unsloth generated the host ------------------------------------------------------------------------------


def is_unsloth_class(cls: type) -> bool:
    """Whether `cls` is, or derives from, a class Unsloth generated (`UnslothGRPOTrainer`, `UnslothGRPOConfig`)."""
    return any(
        klass.__name__.startswith("Unsloth") or "_unsloth_patched_rl_config" in vars(klass) for klass in cls.__mro__
    )


def check_import_order(ours: type, current: type, name: str) -> None:
    """Raises `ImportError` (import Unsloth first) when Unsloth has replaced `trl.<name>` (now `current`) since our
    class was built on TRL's own (`ours`)."""
    if current is not ours and is_unsloth_class(current) and not is_unsloth_class(ours):
        raise ImportError(
            f"adaptive_kl's classes were built on TRL's own {name}, but Unsloth has since replaced trl.{name}: "
            "`import unsloth` ran after adaptive_kl's trainer or config was first used, so training would bypass "
            "Unsloth's kernels and loss. Put `import unsloth` at the very top of your script or notebook (before trl, "
            "transformers and adaptive_kl) and restart the Python process or kernel."
        )
