"""The seam with TRL (`adaptive_kl.trainers.hooks`): our trainers take exactly the host's arguments, and a host that
does not behave as the hooks expect fails loudly, naming the installed TRL, even with the unsupported-version
override set, instead of training without the KL term's gradient."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
from tiny import TRAIN_KWARGS, fabricated_inputs, length_reward, loss_and_grads, make_trainer, prompt_dataset
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.experimental.binomial import BinomialKLConfig, BinomialKLTrainer
from adaptive_kl.trainers.hooks import ALLOW_UNSUPPORTED_ENV, SUPPORTED_TRL, UnsupportedTRLError


TRAINERS = [
    (GRPOTrainer, GRPOConfig, {}),
    (AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, {"beta": 0.1, "kl_adaptation_method": "clip"}),
    (BinomialKLTrainer, BinomialKLConfig, {}),
]
TRAINER_IDS = ["stock", "adaptive", "binomial"]


# --- the host's signature --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("trainer_cls,config_cls,fields", TRAINERS, ids=TRAINER_IDS)
def test_no_reward_source_raises_as_in_trl(tiny_model_dir, tmp_path, trainer_cls, config_cls, fields):
    """TRL's `test_no_reward_source_raises` with each class: `reward_funcs` omitted (it is optional, for
    environment-owned rewards) and no environment gives TRL's own ValueError, not a TypeError from our signature."""
    args = config_cls(**{**TRAIN_KWARGS, "output_dir": str(tmp_path), **fields})
    with pytest.raises(ValueError, match="No reward source provided"):
        trainer_cls(model=tiny_model_dir, args=args, train_dataset=prompt_dataset())


@pytest.mark.parametrize("trainer_cls", [AdaptiveKLGRPOTrainer, BinomialKLTrainer], ids=TRAINER_IDS[1:])
def test_positional_arguments_mean_what_they_mean_for_the_host(tiny_model_dir, tmp_path, trainer_cls):
    """The host's first six parameters passed by position land where the host puts them."""
    config_cls = AdaptiveKLGRPOConfig if trainer_cls is AdaptiveKLGRPOTrainer else BinomialKLConfig
    args = config_cls(**{**TRAIN_KWARGS, "output_dir": str(tmp_path)})
    train, evaluation = prompt_dataset(8), prompt_dataset(4)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer = trainer_cls(tiny_model_dir, [length_reward], args, train, evaluation, tokenizer)
    assert trainer.reward_funcs == [length_reward] and trainer.args is args
    assert trainer.train_dataset is train and trainer.eval_dataset is evaluation
    assert trainer.processing_class is tokenizer


def test_the_documented_signature_is_the_hosts_plus_ours():
    """`help(AdaptiveKLGRPOTrainer)` shows the host's parameters, in order, with their defaults, then ours."""
    import inspect

    host = list(inspect.signature(GRPOTrainer.__init__).parameters.values())
    ours = list(inspect.signature(AdaptiveKLGRPOTrainer.__init__).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours[: len(host)]] == [(p.name, p.kind, p.default) for p in host]
    assert [(p.name, p.kind) for p in ours[len(host) :]] == [("diversity_embedder", inspect.Parameter.KEYWORD_ONLY)]


# --- the policy scoring captured from the host's loss ----------------------------------------------------------------


@pytest.fixture
def ours(tiny_model_dir, tmp_path):
    return make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, beta=0.1, output_dir=str(tmp_path / "ours")
    )


@pytest.fixture
def unsupported_version(monkeypatch):
    """A TRL release outside the range, with the override that lets it be imported."""
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.17.0" if name == "trl" else real(name))
    monkeypatch.setenv(ALLOW_UNSUPPORTED_ENV, "1")
    return "1.17.0"


def assert_names_the_version(error: pytest.ExceptionInfo, version: str) -> None:
    message = str(error.value)
    assert f"trl {version}" in message and f"trl{SUPPORTED_TRL}" in message, message
    assert ALLOW_UNSUPPORTED_ENV in message


def detached_scoring(monkeypatch):
    """A host whose policy scoring carries no gradient (e.g. computed under no_grad)."""
    original = GRPOTrainer._get_per_token_logps_and_entropies

    def scoring(self, *args, **kwargs):
        logps, *rest = original(self, *args, **kwargs)
        return (logps.detach(), *rest)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", scoring)


def test_captured_log_probabilities_without_gradient_are_refused(ours, monkeypatch, unsupported_version):
    """In training, a captured scoring without gradient would add a KL term that does not regularize: refused, naming
    the installed TRL, although the unsupported-version override is set."""
    inputs = fabricated_inputs(ours)
    detached_scoring(monkeypatch)
    with pytest.raises(UnsupportedTRLError, match=r"carry no gradient") as error:
        loss_and_grads(ours, inputs)
    assert_names_the_version(error, unsupported_version)


def test_evaluation_needs_no_gradient(ours, monkeypatch):
    """Evaluation scores without gradient: the same host is accepted there, and the loss is that of a sound host."""
    inputs = fabricated_inputs(ours)
    expected, _ = loss_and_grads(ours, inputs, train=False)
    detached_scoring(monkeypatch)
    loss, _ = loss_and_grads(ours, inputs, train=False)
    assert loss.item() == expected.item()


@pytest.mark.parametrize("scorings", [0, 2])
def test_a_loss_must_score_the_policy_exactly_once(ours, monkeypatch, unsupported_version, scorings):
    """A host loss that scores the policy twice (which one carries the loss's gradient?) or never (the KL term would
    have nothing to share) is refused, in training and in evaluation."""
    inputs = fabricated_inputs(ours)
    original = GRPOTrainer._compute_loss

    def host_loss(self, model, batch):
        if scorings == 0:  # log-probabilities computed without the hooked method
            self._policy_scorings, hidden = None, self._policy_scorings
            try:
                return original(self, model, batch)
            finally:
                self._policy_scorings = hidden
        original(self, model, batch)
        return original(self, model, batch)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", host_loss)
    for train in (True, False):
        with pytest.raises(UnsupportedTRLError, match=f"exactly once .* did {scorings} times") as error:
            loss_and_grads(ours, inputs, train=train)
        assert_names_the_version(error, unsupported_version)


def test_one_scoring_with_gradient_passes(ours):
    """The installed TRL's loss scores the policy once, with gradient: the check lets it through, and closes."""
    loss, grads = loss_and_grads(ours, fabricated_inputs(ours))
    assert torch.isfinite(loss) and grads
    assert ours._policy_scorings is None and ours.beta == 0.1


# --- the rewards captured while a batch is scored --------------------------------------------------------------------


@pytest.mark.parametrize("trainer_cls,config_cls,fields", TRAINERS[1:], ids=TRAINER_IDS[1:])
def test_scoring_without_calculate_rewards_is_refused(tiny_model_dir, tmp_path, monkeypatch, trainer_cls, config_cls,
                                                      fields):  # fmt: skip
    """A host that scores a generation batch without `_calculate_rewards` would leave the trainers with the rewards of
    an earlier batch (a frozen `dynamic` β, stale binomial advantages): refused at the first batch."""
    trainer = make_trainer(trainer_cls, config_cls, tiny_model_dir, output_dir=str(tmp_path), max_steps=1, **fields)
    original = GRPOTrainer._generate_and_score_completions

    def without_rewards(self, inputs):
        calculate = type(self)._calculate_rewards
        self._calculate_rewards = lambda *args: GRPOTrainer._calculate_rewards(self, *args)  # bypasses the hook
        try:
            return original(self, inputs)
        finally:
            del self._calculate_rewards
            assert type(self)._calculate_rewards is calculate

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", without_rewards)
    with pytest.raises(UnsupportedTRLError, match="could not capture the rewards"):
        trainer.train()
