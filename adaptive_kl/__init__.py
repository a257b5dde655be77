"""adaptive-kl: adaptive KL regularization for TRL's GRPO trainer."""

from .config import AdaptiveKLGRPOConfig, parse_kl_adaptation_method
from .controller import BetaController
from .state import AdaptiveKLStateCallback
from .trainer import AdaptiveKLGRPOTrainer


__version__ = "0.1.0"

__all__ = [
    "AdaptiveKLGRPOConfig",
    "AdaptiveKLGRPOTrainer",
    "AdaptiveKLStateCallback",
    "BetaController",
    "parse_kl_adaptation_method",
]
