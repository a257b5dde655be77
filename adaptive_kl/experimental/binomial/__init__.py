"""The binomial-KL ("SPO") objective, an experimental alternative to GRPO's loss on the same rollouts.

`BinomialKLConfig`/`BinomialKLTrainer` (TRL's `GRPOConfig`/`GRPOTrainer` with this objective), and `loss`, the pure
torch math: the per-token binomial KL, its memory-bounded log-probabilities and the step objective.
"""

from .config import BinomialKLConfig
from .trainer import BinomialKLTrainer


__all__ = ["BinomialKLConfig", "BinomialKLTrainer"]
