"""The seam between this package's trainers and TRL's `GRPOTrainer` and `RLOOTrainer`: what they take from the host
that TRL, Transformers and Accelerate do not document as public.

- `internals`: the table `HOST_INTERNALS` of every such name the package uses, each with the host families that use
  it, and the checks that refuse a host lacking one (`check_host` before any model is loaded, `check_host_attributes`
  after the host's `__init__`); the supported TRL (`check_trl_version`) and the trainers' config (`resolve_args`).
  `tests/trainers/test_seam.py` checks that every undocumented host name the package uses is in the table, and none
  is read with a default (`getattr(trainer, name, None)`), so a host that lacks one fails at construction, naming
  it. Unsloth's own internals have their table in `trainers.unsloth`.
- `mixin`: `HostHooks`, which overrides the host's private methods of a generation batch and of its loss, and the few
  functions that do something with the table's names (`completion_loss_mask`, `accumulation_steps`, `host_models`).

A host that does not behave as these hooks expect raises `UnsupportedTRLError`, naming the installed TRL and the
supported range. `ADAPTIVE_KL_ALLOW_UNSUPPORTED_TRL=1` lets an unsupported TRL be imported, to try a new release; it
never lets one train on without the hooks.
"""

from .internals import (  # noqa: F401 (the seam's names, importable from the package)
    ALLOW_UNSUPPORTED_ENV,
    HOST_FAMILIES,
    HOST_INTERNALS,
    HOST_INTERNALS_CHECKED_ON,
    INTERNAL_KINDS,
    SUPPORTED_TRL,
    HostInternal,
    UnsupportedTRLError,
    assigned_in_host_source,
    check_host,
    check_host_attributes,
    check_import_order,
    check_trl_version,
    host_internals,
    installed_trl_version,
    is_unsloth_class,
    resolve_args,
    unsupported_trl,
)
from .mixin import (  # noqa: F401 (the seam's names, importable from the package)
    MULTIMODAL_INPUTS,
    HostHooks,
    HostModels,
    HostScoring,
    accumulation_steps,
    check_carries_gradient,
    close_progress_bars,
    completion_loss_mask,
    host_built_without_reference,
    host_models,
    metric_store,
    one_pass_log,
)
