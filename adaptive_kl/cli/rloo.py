"""`adaptive-kl rloo`: TRL's `trl rloo` training script, with `AdaptiveKLRLOOConfig` in place of `RLOOConfig`.

    adaptive-kl rloo --config recipe.yaml --kl_adaptation_method dynamic --reward_threshold 0.7

The command of `adaptive_kl.cli.grpo` with RLOO's script arguments (`RLOOScriptArguments`), config and trainer
(`AdaptiveKLRLOOTrainer`): the same recipes, local datasets and reward functions, the same checks before any model is
loaded. Unsloth is not offered (`AdaptiveKLRLOOTrainer` refuses it).

Importing this module imports TRL.
"""

from __future__ import annotations

from trl import DatasetMixtureConfig, ModelConfig
from trl.scripts.rloo import RLOOScriptArguments

from ..trainers.rloo import AdaptiveKLRLOOTrainer
from ..trainers.rloo_config import AdaptiveKLRLOOConfig
from .grpo import TrainingScript


PROG = "adaptive-kl rloo"
RLOO_SCRIPT = TrainingScript(
    PROG, (RLOOScriptArguments, AdaptiveKLRLOOConfig, ModelConfig, DatasetMixtureConfig), AdaptiveKLRLOOTrainer
)
