"""adaptive-kl: adaptive KL regularization for TRL's GRPO trainer.

The public names are imported on first use, so that `import adaptive_kl.cli` (the `adaptive-kl` command) does not
import TRL: with `--unsloth`, Unsloth must be imported before TRL.
"""

import importlib


__version__ = "0.1.0"

# Public name → module that defines it.
_EXPORTS = {
    "AdaptiveKLGRPOConfig": "config",
    "parse_kl_adaptation_method": "config",
    "BetaController": "controller",
    "AdaptiveKLStateCallback": "state",
    "AdaptiveKLGRPOTrainer": "trainer",
    "BinomialKLConfig": "binomial_trainer",
    "BinomialKLTrainer": "binomial_trainer",
    "KLHealthCallback": "callbacks",
    "RetentionCallback": "callbacks",
    "HashedNgramEmbedder": "diversity",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
