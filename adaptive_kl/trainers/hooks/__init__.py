"""The seam between this package's trainers and TRL's `GRPOTrainer` and `RLOOTrainer`: everything they take from the
host, in one package, split by job.

The GRPO trainers (`AdaptiveKLGRPOTrainer` and the experimental `BinomialKLTrainer`) subclass whatever
`trl.GRPOTrainer` is (TRL's own, or Unsloth's generated trainer), `AdaptiveKLRLOOTrainer` subclasses TRL's
`RLOOTrainer`, and they reach into their host only through this package:

- `internals`, the table and its checks. `HOST_INTERNALS`: every name of the host (`trl.GRPOTrainer`,
  `trl.RLOOTrainer`, their base `transformers.Trainer`, their `ProgressCallback` and `Accelerator`) that the package
  overrides, calls, reads or writes and that they do not document as public API: private names and undocumented
  attributes alike (`loss_type`, `scale_rewards`, `current_gradient_accumulation_steps`, ...), each with the trainers
  that use it (`hosts`), what the package does with it and its accessor. No other module names one
  (`tests/trainers/test_seam.py` checks the whole package's source); Unsloth's own internals have their table in
  `adaptive_kl.trainers.unsloth`. `host_internals` selects the entries a host class must have. `check_trl_version`:
  the supported TRL range, read from the package metadata before TRL is imported. `resolve_args`: the trainer's config
  (a default one for `args=None`, a `TypeError` for a plain `GRPOConfig`), after refusing a host that Unsloth replaced
  once our classes were built on TRL's own. `check_host` (before any model is loaded) and `check_host_attributes`
  (right after the host's `__init__`): refuse a host that lacks any name of the table (where its kind says:
  `INTERNAL_KINDS`), or that computes its loss with Liger's fused loss (which never calls ours);
- `mixin`: `HostHooks`, the mixin that overrides the host's private methods and hands the trainers named extension
  points (`_on_generation_batch`, `_scores_reference`, `_on_scored`, `_micro_batch_loss`, `_on_checkpoint_saved`,
  `_on_checkpoint_loaded`, `_on_callback_state_loaded`): each scored generation batch as one `ScoredBatch` (its
  rewards, and the log-probabilities the host scored it with, named), and while the host's loss runs with β = 0, the
  policy log-probabilities it computes: exactly one scoring per loss, carrying a gradient in training. A backend whose
  loss scores the policy its own way (Unsloth's) passes its own capture in (`host_loss_without_kl`); the seam imports
  no backend. The extension points are internal, not public API (see `HostHooks`);
- `access`, the accessors: the only way the package reaches an entry of the table. The host's loss settings
  (`host_loss_settings`, `accumulation_steps`), its rollouts (`group_size`, `scale_rewards`, `reward_weights`,
  `reward_func_names`, `sampling_temperature`, `checking_reward_outputs`; RLOO's `normalizes_advantages`,
  `reward_clip_range`), its state (`host_beta`, `host_built_without_reference`, `reference_model`,
  `release_reference_model`, `sharding_engine`, `host_optimizer`, `metric_store`, `generation_buffer`, `score_policy`,
  `replace_logged_advantages`), what the command touches (`set_wrapped_model`, `close_progress_bars`), and the layout
  of TRL's batches (`completion_loss_mask`, `MULTIMODAL_INPUTS`).

No module reads a host attribute with a default (`getattr(trainer, name, None)`): a host that lacks an entry fails at
construction, naming it, rather than falling back silently.

A host that does not behave as these hooks expect raises `UnsupportedTRLError`, naming the installed TRL and the
supported range. `ADAPTIVE_KL_ALLOW_UNSUPPORTED_TRL=1` lets an unsupported TRL be imported, to try a new release; it
never lets one train on without the hooks (for instance without the KL term's gradient).
"""

from .access import (  # noqa: F401 (the seam's names, importable from the package)
    MULTIMODAL_INPUTS,
    HostLossSettings,
    accumulation_steps,
    checking_reward_outputs,
    close_progress_bars,
    completion_loss_mask,
    generation_buffer,
    group_size,
    has_metric_store,
    host_beta,
    host_built_without_reference,
    host_loss_settings,
    host_optimizer,
    metric_store,
    normalizes_advantages,
    reference_model,
    release_reference_model,
    replace_logged_advantages,
    reward_clip_range,
    reward_func_names,
    reward_weights,
    sampling_temperature,
    scale_rewards,
    score_policy,
    set_accumulation_steps,
    set_wrapped_model,
    sharding_engine,
)
from .internals import (  # noqa: F401 (the seam's names, importable from the package)
    ALLOW_UNSUPPORTED_ENV,
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
    is_rloo_host,
    is_unsloth_class,
    replace_host_log_prob_scorer,
    resolve_args,
    unsupported_trl,
)
from .mixin import (  # noqa: F401 (the seam's names, importable from the package)
    HostHooks,
    ScoredBatch,
    check_carries_gradient,
)
