"""Unsloth backend: the adaptive KL term inside Unsloth's memory-efficient GRPO loss.

`import unsloth` regenerates TRL's trainer as `UnslothGRPOTrainer` in a generated module and rebinds `trl.GRPOTrainer`
and `trl.GRPOConfig` to it. Its loss always runs through `UnslothEfficientGRPO.apply(...)`, where the KL term is part
of a compiled function that receives β as a Python float (each distinct β would compile a new graph). On that host:

- `install_capture_shim` rebinds `UnslothEfficientGRPO` in the generated module's globals (where the loss looks it up)
  to a proxy that, only while `capturing_efficient_grpo()` is open, records the call's arguments and passes β = 0;
- the trainer then adds β_t·Agg(f(k)) (`adaptive_kl.kl.term.kl_term_and_sequence_sums`) from the captured
  log-probabilities, aggregated as Unsloth's loss does (`unsloth_kl_term_inputs`): no extra forward pass, no
  full-vocabulary logits.

Unsloth's backward ignores the incoming gradient (it is computed in the forward), so the term is only ever *added* to
the host loss. `check_unsloth_source` refuses a generated module whose code no longer has the shape this relies on.
"""

from __future__ import annotations

import contextvars
import inspect
import re
import sys
from contextlib import contextmanager
from dataclasses import MISSING, dataclass, fields
from types import ModuleType

import torch

from ..kl.aggregation import TOKEN_SUM_LOSS_TYPES, token_sum_normalizer
from .hooks.internals import check_import_order, is_unsloth_class  # noqa: F401 (also importable from here)


# The Unsloth releases whose generated GRPO trainer this module was written against (tested: 2026.10.9), for both
# unsloth and unsloth_zoo; = the `unsloth` extra of pyproject.toml. The source-shape guard, not this range, decides.
SUPPORTED_UNSLOTH = ">=2026.10.9,<2026.11"

# `UnslothEfficientGRPO.forward`'s parameters after `ctx`: the shim reads the positional call by these names.
APPLY_PARAMETERS = (
    "_new_logps", "_old_logps", "_ref_logps", "_sampling_per_token_logps", "lm_head", "_input_ids", "_mask",
    "_advantages", "beta", "scaler", "n_chunks", "extra_kwargs", "upstream_scale",
)  # fmt: skip
BETA_POSITION = APPLY_PARAMETERS.index("beta")

# Unsloth's loss bounds its per-token KL estimate (after the bias correction) to [-10, 10], and clamps k3's log-ratio
# to [-20, 20] before it exponentiates it (the importance log-ratio too, for vLLM's rollout log-probabilities); TRL's
# does neither.
UNSLOTH_KL_BOUND = 10.0
UNSLOTH_LOG_RATIO_CLAMP = 20.0

# Code the shim and `unsloth_kl_term_inputs` rely on, as (function, fragment, what it means); whitespace-insensitive.
REQUIRED_SOURCE = (
    ("grpo_accumulated_loss", "UnslothEfficientGRPO.apply(", "the loss goes through UnslothEfficientGRPO.apply"),
    ("grpo_compute_loss", "loss_i = loss_i + beta * kl_i", "β enters only as beta * kl_i in the per-token loss"),
    ("grpo_compute_loss", "kl_i = torch.clamp(kl_i, min = -10.0, max = 10.0)", "the KL estimate is bounded to ±10"),
    ("grpo_compute_loss", "kl_log_ratio = torch.clamp(ref - new, min = -20.0, max = 20.0)",
     "k3's log-ratio is clamped to ±20"),
    ("grpo_compute_loss", "log_ratio = torch.clamp(log_ratio, min = -20.0, max = 20.0)",
     "the importance log-ratio is clamped to ±20 (for vLLM's rollout log-probabilities: rollout_logps_as_old)"),
    ("grpo_compute_loss", "loss = ((loss_i * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()", "grpo/sapo"),
    ("grpo_compute_loss", "loss = (loss_i * mask).sum() / mask.sum().clamp(min=1.0)", "bnpo's local token count"),
    ("grpo_compute_loss", "loss = (loss_i * mask).sum() / (loss_i.size(0) * max_completion_length)", "dr_grpo"),
    ("grpo_compute_loss", "normalizer = normalizer * current_gradient_accumulation_steps / steps_per_generation",
     "the token-sum normalizer rescaled to one accumulation window"),
    ("grpo_compute_loss", "loss = (loss_i * mask * sample_weight.to(loss_i.dtype).unsqueeze(-1)).sum() / normalizer",
     "per-completion sample weights"),
)  # fmt: skip


class UnsupportedUnslothError(RuntimeError):
    """The installed Unsloth generates a GRPO trainer whose code this backend does not know."""


def unsupported_unsloth(problem: str) -> UnsupportedUnslothError:
    return UnsupportedUnslothError(
        f"The installed Unsloth's GRPO trainer no longer matches what adaptive-kl's Unsloth backend hooks into "
        f"({problem}). It supports unsloth and unsloth_zoo{SUPPORTED_UNSLOTH} (tested: 2026.10.9): "
        "pip install 'adaptive-kl[unsloth]', or train on plain TRL (do not import unsloth)."
    )


# --- which host ------------------------------------------------------------------------------------------------------


def prepare_unsloth_host(
    trainer_cls: type, kl_placement: str, kl_mask_zero_std_groups: bool = False
) -> ModuleType | None:
    """The generated module of the Unsloth GRPO trainer that `trainer_cls` is built on, with the capture shim
    installed (`None` on plain TRL).

    Raises:
        ValueError: `kl_placement="reward"` or `kl_mask_zero_std_groups=True`, which this backend does not implement.
        UnsupportedUnslothError: the generated module does not have the code the shim relies on.
    """
    for klass in trainer_cls.__mro__:
        module = sys.modules.get(klass.__module__)
        if module is not None and hasattr(module, "UnslothEfficientGRPO") and hasattr(module, "grpo_accumulated_loss"):
            break
    else:
        return None
    if kl_placement == "reward":
        raise ValueError(
            "kl_placement='reward' is not supported on Unsloth's GRPOTrainer: its rollout scoring is its own "
            "code, which this package does not hook. Use kl_placement='loss', or plain TRL."
        )
    if kl_mask_zero_std_groups:
        raise ValueError(
            "kl_mask_zero_std_groups=True is not supported on Unsloth's GRPOTrainer: the KL term is added there "
            "through Unsloth's own loss (with its own per-completion weights), where the mask is not implemented. "
            "Set kl_mask_zero_std_groups=False, or use plain TRL."
        )
    install_capture_shim(module)
    return module


# --- the configuration keeps Unsloth's __init__ ----------------------------------------------------------------------


def with_keyword_only(signature: inspect.Signature, parameters: list[inspect.Parameter]) -> inspect.Signature:
    """`signature` with the keyword-only `parameters` added after its own, before its `**kwargs` if it has one: how a
    subclass that takes every argument of its host plus its own shows itself to `help()` and IDEs."""
    params = list(signature.parameters.values())
    split = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
    return signature.replace(parameters=[*params[:split], *parameters, *params[split:]])


def keep_host_init(config_cls: type, host: type | None = None) -> None:
    """Makes the dataclass `config_cls` run its `host` config's own `__init__` (Unsloth's; default: its first base).

    `@dataclass` gives a subclass an `__init__` over every field, which would skip `UnslothGRPOConfig.__init__` and its
    defaults (optimizer, learning rate, loss type, chunking). The replacement sets the fields the host lacks, then
    calls the host's `__init__` with everything else, which ends in `__post_init__`, validating both.
    """
    host = config_cls.__mro__[1] if host is None else host
    host_init = host.__init__
    host_fields = {f.name for f in fields(host)}
    own_fields = [f for f in fields(config_cls) if f.name not in host_fields]

    def __init__(self, *args, **kwargs):
        for f in own_fields:
            default = f.default_factory() if f.default is MISSING else f.default
            setattr(self, f.name, kwargs.pop(f.name, default))
        host_init(self, *args, **kwargs)

    host_signature = inspect.signature(host_init)
    plain = [p for p in host_signature.parameters.values() if p.kind is not p.VAR_POSITIONAL]
    own_parameters = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
        if f.default is not MISSING
        else inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=f.type)
        for f in own_fields
    ]
    __init__.__signature__ = with_keyword_only(host_signature.replace(parameters=plain), own_parameters)
    __init__.__qualname__ = f"{config_cls.__qualname__}.__init__"
    __init__.__doc__ = host_init.__doc__
    config_cls.__init__ = __init__


# --- the capture shim ------------------------------------------------------------------------------------------------


_CAPTURE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("adaptive_kl_unsloth_capture", default=None)
_LOGP_GRADIENTS: contextvars.ContextVar[list | None] = contextvars.ContextVar("adaptive_kl_logp_grads", default=None)


@dataclass(eq=False)  # hashed by identity, as the class it stands in for
class CapturingEfficientGRPO:
    """Stands in for `UnslothEfficientGRPO` in the generated module; every attribute but `apply` is the original's.

    While `capturing_efficient_grpo()` is open, `apply` records its arguments (by `APPLY_PARAMETERS` name) and passes
    β = 0, so Unsloth computes the policy loss alone and compiles one graph whatever β does. While
    `recording_logp_gradients()` is open, it also hooks the call's per-token log-probabilities (stock's and ours).
    """

    original: type  # the generated module's `UnslothEfficientGRPO`

    def apply(self, *args):
        gradients = _LOGP_GRADIENTS.get()
        if gradients is not None and torch.is_tensor(args[0]) and args[0].requires_grad:
            # The gradient arriving on `_new_logps` in the backward: Unsloth's loss's (computed in its forward, with
            # its β) plus, on our trainer, that of the KL term added from the same tensor.
            args[0].register_hook(lambda grad: gradients.append(grad.detach().to(torch.float64, copy=True)))
        capture = _CAPTURE.get()
        if capture is None:
            return self.original.apply(*args)
        if "efficient_grpo" in capture:
            raise unsupported_unsloth("UnslothEfficientGRPO.apply ran twice in one loss")
        capture["efficient_grpo"] = dict(zip(APPLY_PARAMETERS, args))
        args = (*args[:BETA_POSITION], 0.0, *args[BETA_POSITION + 1 :])
        return self.original.apply(*args)

    def __getattr__(self, name):
        return getattr(self.original, name)


def check_unsloth_source(module: ModuleType) -> None:
    """The source-shape guard: raises `UnsupportedUnslothError` unless the generated module has the code we rely on."""
    original = module.UnslothEfficientGRPO
    if isinstance(original, CapturingEfficientGRPO):
        original = original.original
    try:
        parameters = tuple(inspect.signature(original.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        raise unsupported_unsloth("UnslothEfficientGRPO.forward has no readable signature") from None
    if parameters != ("ctx", *APPLY_PARAMETERS):
        raise unsupported_unsloth(f"UnslothEfficientGRPO.forward takes {parameters[1:]}, expected {APPLY_PARAMETERS}")
    sources = {}
    for function, fragment, meaning in REQUIRED_SOURCE:
        if function not in sources:
            try:
                sources[function] = re.sub(r"\s+", "", inspect.getsource(getattr(module, function)))
            except (TypeError, OSError, AttributeError):
                raise unsupported_unsloth(f"the source of {function} cannot be read") from None
        if re.sub(r"\s+", "", fragment) not in sources[function]:
            raise unsupported_unsloth(f"{function} no longer has `{fragment}` ({meaning})")
    if sources["grpo_accumulated_loss"].count("UnslothEfficientGRPO.apply(") != 1:
        raise unsupported_unsloth("grpo_accumulated_loss calls UnslothEfficientGRPO.apply more than once")


def install_capture_shim(module: ModuleType) -> CapturingEfficientGRPO:
    """Rebinds the generated module's `UnslothEfficientGRPO` to the capturing proxy, once, after checking its code."""
    if not isinstance(module.UnslothEfficientGRPO, CapturingEfficientGRPO):
        check_unsloth_source(module)
        module.UnslothEfficientGRPO = CapturingEfficientGRPO(module.UnslothEfficientGRPO)
    return module.UnslothEfficientGRPO


@contextmanager
def capturing_efficient_grpo(capture: dict):
    """While open, the shim records the arguments of `UnslothEfficientGRPO.apply` in `capture["efficient_grpo"]`."""
    token = _CAPTURE.set(capture)
    try:
        yield capture
    finally:
        _CAPTURE.reset(token)


@contextmanager
def recording_logp_gradients(gradients: list):
    """While open, each `UnslothEfficientGRPO.apply` call through the shim appends to `gradients`, in the backward, the
    gradient that arrives on its per-token log-probabilities [B, T] (float64): where the KL term enters, so that ours
    and stock's can be compared before the model's backward amplifies their rounding (the GPU check's parity)."""
    token = _LOGP_GRADIENTS.set(gradients)
    try:
        yield gradients
    finally:
        _LOGP_GRADIENTS.reset(token)


# --- what the KL term needs, read off the captured call --------------------------------------------------------------


def unsloth_kl_term_inputs(call: dict) -> dict:
    """The tensors and aggregation of `kl_term_and_sequence_sums` for one captured `UnslothEfficientGRPO.apply` call.

    The aggregation is Unsloth's, which this path must mirror to add a term its loss would have contained:

    | case | aggregate of x |
    |---|---|
    | `sample_weight` given | Σ m·x·w_i · P · S / G (replaces every loss-type normalizer) |
    | grpo, sapo, bnpo (local tokens), dr_grpo, luspo | as TRL, divided by G |
    | dapo, cispo, vespo | Σ m·x / (max(N, 1) / P · G / S) |

    with m the mask Unsloth rebuilt from the token ids, P the processes, G the current accumulation steps (1 in
    evaluation), S `steps_per_generation` (absent in evaluation) and N `num_items_in_batch`. Masked columns of the
    log-probabilities are set to 0 first, as Unsloth does, so that whatever they hold never reaches the term.
    `ValueError` with Unsloth's rollout rejection on: it drops tokens from the KL term by a rule not reproduced here.
    """
    options = call.get("extra_kwargs") or {}
    if options.get("rollout_rs") is not None:
        raise ValueError(
            "UNSLOTH_GRPO_ROLLOUT_RS (Unsloth's rollout rejection) is not supported with AdaptiveKLGRPOTrainer: "
            "unset it."
        )
    mask = call["_mask"]
    keep = mask.to(torch.bool)
    new_logps = torch.where(keep, call["_new_logps"], 0.0)
    ref_logps = torch.where(keep, call["_ref_logps"], 0.0)
    old_logps = call["_old_logps"]
    old_logps = None if old_logps is None else torch.where(keep, old_logps, 0.0)

    loss_type = options.get("loss_type", "grpo")
    accumulation_steps = options.get("current_gradient_accumulation_steps", 1)
    normalizer_args = (options.get("num_processes", 1), accumulation_steps, options.get("steps_per_generation"))
    sample_weight = options.get("sample_weight")
    token_normalizer = None
    if sample_weight is not None:  # Unsloth divides the weighted sum by the token-sum normalizer of N = 1
        token_normalizer = token_sum_normalizer(1.0, *normalizer_args)
    elif loss_type in TOKEN_SUM_LOSS_TYPES:
        token_normalizer = token_sum_normalizer(options["num_items_in_batch"], *normalizer_args)
    return dict(
        per_token_logps=new_logps,
        ref_per_token_logps=ref_logps,
        mask=mask.to(new_logps.dtype),
        old_per_token_logps=old_logps,
        loss_type=loss_type,
        accumulation_steps=accumulation_steps,
        max_completion_length=options.get("max_completion_length"),
        token_normalizer=token_normalizer,
        sample_weight=sample_weight,
        use_bias_correction=options.get("use_bias_correction_kl", False),
        importance_sampling_level=options.get("importance_sampling_level", "token"),
        kl_bound=UNSLOTH_KL_BOUND,
        importance_log_ratio_clip=UNSLOTH_LOG_RATIO_CLAMP if options.get("rollout_logps_as_old", False) else None,
    )
