"""The formula sheet: every quantity of the adaptive KL term as a small pure-torch function (no trl, transformers,
peft or accelerate; `docs/design.md` gives the semantics).

| module | what |
|---|---|
| `estimators` | the estimates k1, k2, k3, k1+, k3+ of r, the transforms f(k), both at once; the importance ratio |
| `aggregation` | Agg(·): the host's loss-type aggregation and the length-normalized mean |
| `term` | the whole KL term of one micro-batch, estimate → transform → aggregate, and its statistics |
| `metrics` | the additive statistics behind the `adaptive_kl/*` metrics |
| `controller` | β_t: step scaling, reward- or saturation-triggered decay, target-KL controllers (`BetaController`) |
| `placement` | KL in the reward: the penalty (and its zero), total rewards, GRPO's and RLOO's advantages |
| `groups` | zero-std groups (TRL's `nanstd` to the bit): the saturation trigger's statistic, the KL mask |
| `validation` | checks of user-given numbers |
"""

from .aggregation import LOSS_TYPES, aggregate_like_host, length_normalized_mean, token_sum_normalizer
from .controller import (
    DYNAMIC_TRIGGERS,
    KL_CONTROLLERS,
    KL_SCALINGS,
    BetaController,
    step_scale,
)
from .estimators import (
    ESTIMATORS,
    STRAIGHT_THROUGH_ESTIMATORS,
    estimate_and_transform,
    importance_ratio,
    kl_estimate,
    transform_kl,
)
from .groups import group_reward_std, zero_std_group_fraction, zero_std_groups
from .metrics import METRIC_NAMES, kl_metrics, kl_sequence_sums, statistics_of_sequences
from .placement import (
    KL_PLACEMENTS,
    group_advantages,
    leave_one_out_advantages,
    sequence_kl_penalty,
    total_rewards,
)
from .term import kl_term_and_sequence_sums


__all__ = [
    "DYNAMIC_TRIGGERS",
    "ESTIMATORS",
    "KL_CONTROLLERS",
    "KL_PLACEMENTS",
    "KL_SCALINGS",
    "LOSS_TYPES",
    "METRIC_NAMES",
    "STRAIGHT_THROUGH_ESTIMATORS",
    "BetaController",
    "aggregate_like_host",
    "estimate_and_transform",
    "group_advantages",
    "importance_ratio",
    "group_reward_std",
    "kl_estimate",
    "kl_metrics",
    "kl_sequence_sums",
    "kl_term_and_sequence_sums",
    "leave_one_out_advantages",
    "length_normalized_mean",
    "sequence_kl_penalty",
    "statistics_of_sequences",
    "step_scale",
    "token_sum_normalizer",
    "total_rewards",
    "transform_kl",
    "zero_std_groups",
    "zero_std_group_fraction",
]
