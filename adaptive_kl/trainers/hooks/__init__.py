"""The seam between this package's trainers and TRL's `GRPOTrainer` and `RLOOTrainer`: everything they take from the
host, in one package, split by job.

The GRPO trainers (`AdaptiveKLGRPOTrainer` and the experimental `BinomialKLTrainer`) subclass whatever
`trl.GRPOTrainer` is (TRL's own, or Unsloth's generated trainer), `AdaptiveKLRLOOTrainer` subclasses TRL's
`RLOOTrainer`, and they reach into their host only through this package:

- `internals`: the table `HOST_INTERNALS` of every name of the hosts (and of `transformers.Trainer`, its
  `ProgressCallback` and Accelerate's `Accelerator`) that the package uses and that they do not document as public,
  each with the host families that use it; the checks that refuse a host lacking one (`check_host` before any model is
  loaded, `check_host_attributes` after the host's `__init__`), for the family a trainer names; the supported TRL
  (`check_trl_version`) and the trainers' config (`resolve_args`). No other module names an entry
  (`tests/trainers/test_seam.py` checks the package's source); Unsloth's own internals have their table in
  `adaptive_kl.trainers.unsloth`.
- `mixin`: `HostHooks`, which overrides the host's private methods and hands the trainers named extension points;
  each scored generation batch reaches them as one `HostScoring`.
- `access`: the readers and writers of the table's entries, each returning what one caller needs whole
  (`host_loss_settings`, `host_rewards`, `rloo_advantage_settings`, `host_models`, ...).

No module reads a host attribute with a default (`getattr(trainer, name, None)`): a host that lacks an entry fails at
construction, naming it, rather than falling back silently. A host that does not behave as these hooks expect raises
`UnsupportedTRLError`, naming the installed TRL and the supported range. `ADAPTIVE_KL_ALLOW_UNSUPPORTED_TRL=1` lets an
unsupported TRL be imported, to try a new release; it never lets one train on without the hooks.
"""

from .access import (  # noqa: F401 (the seam's names, importable from the package)
    MULTIMODAL_INPUTS,
    HostLossSettings,
    HostModels,
    HostRewards,
    RLOOAdvantageSettings,
    accumulation_steps,
    checking_reward_outputs,
    close_progress_bars,
    completion_loss_mask,
    generation_buffer,
    grpo_scale_rewards,
    has_metric_store,
    host_beta,
    host_built_without_reference,
    host_loss_settings,
    host_models,
    host_rewards,
    metric_store,
    release_reference_model,
    replace_logged_advantages,
    rloo_advantage_settings,
    score_policy,
    set_accumulation_steps,
    set_wrapped_model,
)
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
    has_host_log_prob_scorer,
    host_internals,
    host_log_prob_scorer,
    installed_trl_version,
    is_unsloth_class,
    replace_host_log_prob_scorer,
    resolve_args,
    unsupported_trl,
)
from .mixin import HostHooks, HostScoring, check_carries_gradient  # noqa: F401 (the seam's names)
