"""adaptive-kl: adaptive KL regularization for TRL's GRPO and RLOO trainers.

The package is layered; each layer imports only from those above it in this list:

- `adaptive_kl.kl`: the formula sheet (estimators, transforms, aggregation, the KL term, metrics, β rules), torch only;
  `adaptive_kl.metrics` (diversity) and `adaptive_kl.models` (where models come from) beside it;
- `adaptive_kl.trainers`: the configs and trainers (GRPO and RLOO), checkpoint state, the TRL hook layer, the Unsloth
  backend and the callbacks;
- `adaptive_kl.experimental`: algorithm variants (`experimental.binomial`);
- `adaptive_kl.tasks`: the math tasks (problems, answers, rewards, GSM8K, accuracy) and the named policies;
- `adaptive_kl.usage`: the command line's input checks, shared by its subcommands;
- `adaptive_kl.cli` (`adaptive-kl grpo`, TRL's training script) and `adaptive_kl.demo` (`adaptive-kl demo` and
  `compare`, the embedded policy, runner and reports), side by side;
- `adaptive_kl.console`: the `adaptive-kl` command, which hands each subcommand to its layer.

`adaptive_kl.testing` holds scaffolding for tests, examples and benchmarks (tiny offline models, fabricated batches);
no other layer imports it.

The public names are imported on first use, so that `import adaptive_kl` (and the `adaptive-kl` command) does not
import TRL: with Unsloth, `import unsloth` must come before TRL.
"""

from ._exports import lazy_exports


__version__ = "0.1.0"

# Public name → module that defines it.
_EXPORTS = {
    "AdaptiveKLGRPOConfig": "trainers.config",
    "parse_kl_adaptation_method": "trainers.config",
    "AdaptiveKLGRPOTrainer": "trainers.grpo",
    "AdaptiveKLRLOOConfig": "trainers.rloo_config",
    "AdaptiveKLRLOOTrainer": "trainers.rloo",
    "AdaptiveKLStateCallback": "trainers.lifecycle",
    "KLHealthCallback": "trainers.callbacks",
    "RetentionCallback": "trainers.callbacks",
    "BetaController": "kl.controller",
    "HashedNgramEmbedder": "metrics.diversity",
    # Experimental (documented under `adaptive_kl.experimental.binomial`): importable from here, left out of __all__.
    "BinomialKLConfig": "experimental.binomial",
    "BinomialKLTrainer": "experimental.binomial",
}

__all__ = sorted(name for name, module in _EXPORTS.items() if not module.startswith("experimental"))


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
