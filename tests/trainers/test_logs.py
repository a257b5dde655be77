"""What the trainers log in place of the host's is built once, where it is made (`hooks.one_pass_log`): the host's
entries of one pass are set aside by name, never edited by their position in TRL's lists; TRL's `policy_loss` with the
KL term is averaged over the processes as TRL averages it, NaN left out; the completions table shows the advantages
the loss uses."""

from __future__ import annotations

import math
from collections import defaultdict, deque

import pytest
import torch
from tiny import make_trainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer, AdaptiveKLRLOOConfig, AdaptiveKLRLOOTrainer
from adaptive_kl.trainers.grpo import policy_loss_with_term
from adaptive_kl.trainers.hooks import one_pass_log


def test_a_pass_writes_its_entries_after_the_earlier_ones_under_the_same_key():
    """The host's entries of the pass are read by name; what the trainer writes replaces them; the earlier entries and
    every key's place in the store stay, and a name the trainer does not write keeps the host's entries."""
    store = defaultdict(list, {"reward": [1.0], "kl": [0.1], "entropy": [2.0], "policy_loss": [0.3]})
    with one_pass_log({"kl": store, "policy_loss": store}) as log:
        assert store["kl"] == [] and store["policy_loss"] == []  # the host logs this pass alone
        store["kl"].append(0.0)  # what the host logs meanwhile
        store["policy_loss"].append(0.5)
        store["entropy"].append(2.5)  # a name not set aside: the host's list itself
        assert log.host("kl") == [0.0] and log.host("policy_loss") == [0.5]
        log.write("kl", [0.2])
    assert store == {"reward": [1.0], "kl": [0.1, 0.2], "entropy": [2.0, 2.5], "policy_loss": [0.3, 0.5]}
    assert list(store) == ["reward", "kl", "entropy", "policy_loss"]


def test_a_name_logged_for_the_first_time_is_written_once_and_an_empty_one_not_at_all():
    """The first pass: the host's key where the host made it; a name neither the host nor the trainer logged is left
    out (TRL averages each list at the log line: an empty one would divide by zero)."""
    store = defaultdict(list)
    with one_pass_log({"kl": store, "policy_loss": store, "advantages": store}) as log:
        store["reward"].append(1.0)
        store["policy_loss"].append(0.5)
        assert log.host("kl") == []
        log.write("kl", [0.2])
    assert store == {"reward": [1.0], "policy_loss": [0.5], "kl": [0.2]}


def test_the_completions_table_keeps_its_bound():
    """TRL's completions table is a bounded deque: the pass's advantages go after the earlier ones, and the oldest
    fall out as they would have."""
    logs = {"advantages": deque([1.0, 2.0, 3.0], maxlen=4)}
    with one_pass_log({"advantages": logs}) as log:
        logs["advantages"].extend([9.0, 9.0])  # the host's
        log.write("advantages", [4.0, 5.0])
    assert logs["advantages"] == deque([2.0, 3.0, 4.0, 5.0], maxlen=4)


def test_the_policy_loss_gets_the_term_averaged_over_the_processes_nan_left_out():
    """TRL logs `policy_loss` as the mean over the processes of their loss, term included, leaving out NaN. The host's
    mean without the term (`logged`), plus each process's share averaged over the processes TRL's mean counts: a
    process whose loss is NaN is left out of both."""

    def gather(other_share):  # this process's share, then another process's
        return lambda share: torch.cat([share.reshape(1), torch.tensor([other_share])])

    share, loss = torch.tensor(0.5), torch.tensor(2.0)
    assert policy_loss_with_term(1.0, share, loss, gather(1.5)) == pytest.approx(1.0 + (0.5 + 1.5) / 2)
    # The other process's loss was NaN (its share comes NaN, as this process sends it when its own loss is NaN)
    assert policy_loss_with_term(1.0, share, loss, gather(math.nan)) == pytest.approx(1.5)
    nan_loss = torch.tensor(math.nan)
    assert math.isnan(policy_loss_with_term(math.nan, share, nan_loss, lambda s: s.reshape(1)))
    assert policy_loss_with_term(1.0, share, nan_loss, gather(1.5)) == pytest.approx(2.5)  # this one left out


class RecordingAdvantages:
    """A trainer mixin recording, for each scored generation batch, the host's advantages as it logged them and the
    advantages the loss uses (the output's, on one process every completion's)."""

    def _on_scored(self, scoring):
        self.host_logged.append(scoring.log.host("advantages"))
        super()._on_scored(scoring)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.used.append(output["advantages"].tolist())
        return output


class GRPO(RecordingAdvantages, AdaptiveKLGRPOTrainer):
    pass


class RLOO(RecordingAdvantages, AdaptiveKLRLOOTrainer):
    pass


@pytest.mark.parametrize(
    "trainer_cls, config_cls, fields, replaced",
    [
        (GRPO, AdaptiveKLGRPOConfig, dict(kl_placement="reward", kl_estimator="k1", kl_scaling="sqrt"), True),
        (RLOO, AdaptiveKLRLOOConfig, dict(kl_adaptation_method="clip", kl_clip_threshold=0.01), True),
        (RLOO, AdaptiveKLRLOOConfig, {}, False),  # the defaults: the host's penalty and advantages stand
    ],
    ids=["grpo-reward", "rloo-clip", "rloo-defaults"],
)
def test_the_completions_table_shows_the_advantages_the_loss_uses(
    tiny_model_dir, tmp_path, trainer_cls, config_cls, fields, replaced
):
    """After each generation batch the completions table (TRL's `_logs["advantages"]`, what its completions log
    shows) holds the advantages the loss uses: the penalized ones where the package's penalty replaces the host's,
    the host's own where it stands."""
    trainer = make_trainer(
        trainer_cls, config_cls, tiny_model_dir, output_dir=str(tmp_path), beta=0.5, bf16=False, max_steps=2, **fields
    )
    trainer.host_logged, trainer.used = [], []
    trainer.train()
    assert len(trainer.used) == 2
    assert list(trainer._logs["advantages"]) == trainer.used[-1]  # the table holds one generation batch
    differs = [host != used for host, used in zip(trainer.host_logged, trainer.used)]
    assert differs == [False, replaced]  # at step 1 the policy is its reference: no penalty, the host's advantages
