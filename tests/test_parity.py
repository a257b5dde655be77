"""Method "none" reproduces stock TRL: same loss and parameter gradients, for every loss type TRL offers.

TRL adds β·k inside its per-token loss and aggregates once; we aggregate the term separately and add it. In float32
(TRL computes log-probabilities in float32 whatever the model dtype) the two summation orders differ by rounding, so
"relative" is measured against the magnitude of the terms being summed: the larger of the stock value and the
policy-only (β = 0) value. Differences are then ~1e-8; a wrong normalizer or estimator gives ~1e-1.
"""

from __future__ import annotations

import re

import pytest
import torch
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.aggregation import LOSS_TYPES
from tiny import TRAIN_KWARGS, length_reward, prompt_dataset


BETA = 0.3
RTOL = 1e-6
# TRL refuses these pairings at init; every other (loss_type, level) pair is offered.
REQUIRED_LEVEL = {"luspo": "sequence", "vespo": "token"}
CASES = [
    (loss_type, level, bias)
    for loss_type in LOSS_TYPES
    for level in ("token", "sequence")
    if REQUIRED_LEVEL.get(loss_type, level) == level
    for bias in (True, False)
]


def test_loss_types_cover_trl():
    """The loss types we mirror are exactly those TRL documents (catches a new TRL loss type)."""
    help_text = next(f for f in GRPOConfig.__dataclass_fields__.values() if f.name == "loss_type").metadata["help"]
    offered = set(re.findall(r"'(\w+)'", help_text.split("Supported values are")[1].split(".")[0]))
    assert offered == set(LOSS_TYPES)


def _trainer(cls, config_cls, model_dir, **kwargs):
    args = config_cls(
        output_dir=f"{model_dir}/out-{cls.__name__}",
        beta=BETA,
        model_init_kwargs={"dtype": "auto"},  # the saved float64,
        **TRAIN_KWARGS,
        **kwargs,
    )
    return cls(
        model=model_dir,
        reward_funcs=[length_reward],
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )


@pytest.fixture(scope="module")
def trainers(tiny_model_dir):
    stock = _trainer(GRPOTrainer, GRPOConfig, tiny_model_dir)
    ours = _trainer(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir)
    return stock, ours


def fabricated_inputs(trainer, seed: int = 0) -> dict:
    """A micro-batch as `_generate_and_score_completions` returns it, with drifted reference and old policies.

    Completion lengths differ (6, 4, 1, 3) so every aggregation weighs sequences differently, and the log-ratios are
    large enough (σ = 0.5) that k3 differs from k2 and the PPO clip is active on some tokens.
    """
    g = torch.Generator().manual_seed(seed)
    batch, prompt_len, completion_len = 4, 3, 6
    vocab = trainer.model.config.vocab_size
    prompt_ids = torch.randint(3, vocab, (batch, prompt_len), generator=g)
    completion_ids = torch.randint(3, vocab, (batch, completion_len), generator=g)
    lengths = torch.tensor([6, 4, 1, 3])
    completion_mask = (torch.arange(completion_len)[None, :] < lengths[:, None]).long()
    prompt_mask = torch.ones_like(prompt_ids)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([prompt_mask, completion_mask], 1),
            completion_len,
        )
    noise = lambda scale: scale * torch.randn(logps.shape, generator=g, dtype=logps.dtype)  # noqa: E731
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(batch, generator=g, dtype=logps.dtype),
        "old_per_token_logps": logps + noise(0.1),
        "ref_per_token_logps": logps + noise(0.5),
        "num_items_in_batch": completion_mask.sum() * 2,  # the generation batch spans two micro-batches
    }


def loss_and_grads(trainer, inputs, *, train: bool = True, accumulation_steps: int = 2):
    model = trainer.model
    model.train(train)
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = accumulation_steps
    with torch.set_grad_enabled(train):
        loss = trainer.compute_loss(model, inputs)
    if not train:
        return loss.detach(), {}
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def configure(trainers, loss_type, level, bias):
    for trainer in trainers:
        trainer.loss_type = loss_type
        trainer.importance_sampling_level = level
        trainer.args.use_bias_correction_kl = bias


def assert_close(ours: torch.Tensor, stock: torch.Tensor, policy_only: torch.Tensor, what: str):
    scale = max(stock.norm().item(), policy_only.norm().item())
    assert (ours - stock).norm().item() <= RTOL * scale, f"{what}: {ours} vs {stock}"


def policy_only(stock, inputs, **kwargs):
    """Stock TRL's loss and gradients with β = 0 (no KL term)."""
    stock.beta = 0.0
    try:
        return loss_and_grads(stock, inputs, **kwargs)
    finally:
        stock.beta = BETA


@pytest.mark.parametrize("loss_type,level,bias", CASES)
def test_method_none_matches_stock_loss_and_gradients(trainers, loss_type, level, bias):
    stock, ours = trainers
    configure(trainers, loss_type, level, bias)
    inputs = fabricated_inputs(stock)
    stock_loss, stock_grads = loss_and_grads(stock, inputs)
    our_loss, our_grads = loss_and_grads(ours, inputs)
    policy_loss, policy_grads = policy_only(stock, inputs)
    assert_close(our_loss, stock_loss, policy_loss, "loss")
    assert stock_grads.keys() == our_grads.keys() == policy_grads.keys() and stock_grads
    for name in stock_grads:
        assert_close(our_grads[name], stock_grads[name], policy_grads[name], name)

    # The comparison is sensitive to the KL term: without it, the stock gradient is measurably different.
    diff = sum((policy_grads[n] - stock_grads[n]).norm() ** 2 for n in stock_grads) ** 0.5
    norm = sum(g.norm() ** 2 for g in stock_grads.values()) ** 0.5
    assert diff > 1e-3 * norm


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_method_none_matches_stock_eval_loss(trainers, loss_type):
    configure(trainers, loss_type, REQUIRED_LEVEL.get(loss_type, "token"), True)
    stock, ours = trainers
    inputs = fabricated_inputs(stock, seed=1)
    ours_loss, stock_loss = (loss_and_grads(t, inputs, train=False)[0] for t in (ours, stock))
    assert_close(ours_loss, stock_loss, policy_only(stock, inputs, train=False)[0], "loss")
    assert abs(stock_loss - policy_only(stock, inputs, train=False)[0]) > 1e-3 * abs(stock_loss)
