"""The package's KL term reproduces TRL's: same loss and parameter gradients, for every loss type TRL offers, through
an adaptation that changes nothing (`IDENTITY`: k3 clipped at 1e30), so that the package's term replaces TRL's. (Where
only β_t adapts the host keeps its own term, at β_t, bit for bit: `test_stock_bitwise.py`.)

TRL adds β·k inside its per-token loss and aggregates once; we aggregate the term separately and add it. The two
summation orders differ by rounding, which cancellation in a gradient (many rows of opposite sign) amplifies: in
float32 that reached 1.6e-4 relative on an AVX2 CPU and ~1e-7 on AVX-512, so a float32 tolerance is a property of
the CPU. Both trainers therefore run in float64 here (the model, and a float64 stand-in for TRL's float32 fused
log-probability scorer, which both trainers share, so the comparison is of the loss assembly alone). Differences are
then below 1e-15 (6.6e-16 measured on AVX2 and AVX-512), "relative" is measured against the magnitude of the terms
being summed (the larger of the stock value and the policy-only, β = 0, value), and a wrong normalizer or estimator
(≥ 1e-6) is caught on every machine.
"""

from __future__ import annotations

import re

import pytest
import torch
import trl.trainer.utils as trl_utils
from tiny import assert_close_to_stock as assert_close
from tiny import fabricated_inputs, loss_and_grads, make_trainer
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.kl.aggregation import LOSS_TYPES
from adaptive_kl.trainers.hooks import metric_store
from adaptive_kl.trainers.lifecycle import KLMonitor
from adaptive_kl.trainers.scorer import Float64LogProbFunction


BETA = 0.3
# The package's term (a transform: TRL has none), TRL's value: k3 ≥ 0 is never clipped at 1e30, and the clamp passes
# its gradient where it does not clip
IDENTITY = dict(kl_adaptation_method="clip", kl_clip_threshold=1e30)
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


# float64 end to end: rounding < 1e-15 on any CPU, far below the smallest real difference the tests must catch (1e-6).
RTOL = 1e-10


@pytest.fixture(scope="module")
def trainers(tiny_model_dir):
    stock = make_trainer(GRPOTrainer, GRPOConfig, tiny_model_dir, beta=BETA)
    ours = make_trainer(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, beta=BETA, **IDENTITY)
    assert not ours.host_kl_term
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trl_utils, "_ChunkedLogProbFunction", Float64LogProbFunction)
        for trainer in (stock, ours):
            trainer.model.double()
        yield stock, ours


def configure(trainers, loss_type, level, bias):
    for trainer in trainers:
        trainer.loss_type = loss_type
        trainer.importance_sampling_level = level
        trainer.args.use_bias_correction_kl = bias


def policy_only(stock, inputs, **kwargs):
    """Stock TRL's loss and gradients with β = 0 (no KL term)."""
    stock.beta = 0.0
    try:
        return loss_and_grads(stock, inputs, **kwargs)
    finally:
        stock.beta = BETA


@pytest.mark.parametrize("loss_type,level,bias", CASES)
def test_our_term_matches_stock_loss_and_gradients(trainers, loss_type, level, bias):
    stock, ours = trainers
    configure(trainers, loss_type, level, bias)
    inputs = fabricated_inputs(stock)
    stock_loss, stock_grads = loss_and_grads(stock, inputs)
    our_loss, our_grads = loss_and_grads(ours, inputs)
    policy_loss, policy_grads = policy_only(stock, inputs)
    assert_close(our_loss, stock_loss, policy_loss, "loss", RTOL)
    assert stock_grads.keys() == our_grads.keys() == policy_grads.keys() and stock_grads
    for name in stock_grads:
        assert_close(our_grads[name], stock_grads[name], policy_grads[name], name, RTOL)
        assert our_grads[name].dtype == torch.float64

    # The comparison is sensitive to the KL term: without it, the stock gradient is measurably different.
    diff = sum((policy_grads[n] - stock_grads[n]).norm() ** 2 for n in stock_grads) ** 0.5
    norm = sum(g.norm() ** 2 for g in stock_grads.values()) ** 0.5
    assert diff > 1e-3 * norm


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_our_term_matches_stock_eval_loss(trainers, loss_type):
    configure(trainers, loss_type, REQUIRED_LEVEL.get(loss_type, "token"), True)
    stock, ours = trainers
    inputs = fabricated_inputs(stock, seed=1)
    ours_loss, stock_loss = (loss_and_grads(t, inputs, train=False)[0] for t in (ours, stock))
    assert_close(ours_loss, stock_loss, policy_only(stock, inputs, train=False)[0], "loss", RTOL)
    assert abs(stock_loss - policy_only(stock, inputs, train=False)[0]) > 1e-3 * abs(stock_loss)


def far_from_the_reference(inputs: dict) -> dict:
    """`inputs` with log-ratios past ±20 on some tokens: the reference's log-probabilities 25 below the policy's and 30
    above (r = 25 and −30), and the old policy's 24 below on another (an importance ratio of e^24 with the bias
    correction). An estimator or ratio clamped at ±20 would differ from TRL's there by orders of magnitude."""
    ref, old = inputs["ref_per_token_logps"].clone(), inputs["old_per_token_logps"].clone()
    ref[0, 0] -= 25.0
    ref[1, 1] += 30.0
    old[2, 0] -= 24.0
    return {**inputs, "ref_per_token_logps": ref, "old_per_token_logps": old}


@pytest.mark.parametrize("loss_type,level,bias", CASES)
def test_our_term_matches_stock_past_log_ratios_of_20(trainers, loss_type, level, bias):
    """A policy far from its reference (log-ratios of 25 and −30, an importance log-ratio of 24): without
    `kl_log_ratio_clip` our term applies no clamp that TRL's loss does not apply, so our loss and gradients are
    stock's, every loss type."""
    stock, ours = trainers
    configure(trainers, loss_type, level, bias)
    assert ours.args.kl_log_ratio_clip is None
    inputs = far_from_the_reference(fabricated_inputs(stock, seed=2))
    stock_loss, stock_grads = loss_and_grads(stock, inputs)
    our_loss, our_grads = loss_and_grads(ours, inputs)
    policy_loss, policy_grads = policy_only(stock, inputs)
    assert torch.isfinite(stock_loss) and abs(stock_loss - policy_loss) > 1e3  # the far tokens dominate the KL term
    assert_close(our_loss, stock_loss, policy_loss, "loss", RTOL)
    for name in stock_grads:
        assert_close(our_grads[name], stock_grads[name], policy_grads[name], name, RTOL)


def test_the_opt_in_clamp_changes_the_far_tokens_only(tiny_model_dir):
    """`kl_log_ratio_clip=20` on the same far-from-reference batch: a different loss (the clamp acts), and the same as
    our term without it on a batch whose log-ratios stay within ±20 (it acts nowhere else)."""
    losses = {}
    for clip in (None, 20.0):
        trainer = make_trainer(
            AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, beta=BETA, kl_log_ratio_clip=clip, **IDENTITY
        )
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(trl_utils, "_ChunkedLogProbFunction", Float64LogProbFunction)
            trainer.model.double()
            near = fabricated_inputs(trainer, seed=2)
            losses[clip] = (loss_and_grads(trainer, far_from_the_reference(near))[0], loss_and_grads(trainer, near)[0])
    assert abs(losses[None][0] - losses[20.0][0]) > 1e3 * abs(losses[20.0][0] - losses[20.0][1])
    assert torch.equal(losses[None][1], losses[20.0][1])


def logged_line(trainer) -> dict:
    """What the next log line writes (`Trainer.log`): TRL averages its metric lists of the micro-batches since the
    last line; our trainer completes them first (the `kl` and `policy_loss` its host's loss did not log)."""
    trainer.log({})
    return trainer.state.log_history[-1]


def test_logged_kl_is_trls_under_accumulation_with_unequal_lengths(trainers):
    """TRL logs `kl` once per micro-batch (its token mean) and the log line averages those: two micro-batches of one
    optimizer step with 14 and 4 completion tokens give the same logged value with our trainer as with stock, and
    it is the mean of the two micro-batches' means, not the token-weighted mean over the step."""
    stock, ours = trainers
    configure(trainers, "grpo", "token", True)
    first = fabricated_inputs(stock, seed=3)
    second = fabricated_inputs(stock, seed=4)
    second["completion_mask"] = torch.zeros_like(second["completion_mask"])
    second["completion_mask"][:, 0] = 1  # one token each: 4 against the first's 14
    ours.kl_monitor = KLMonitor(reads_steps=ours.reads_step_kl)  # nothing of the earlier tests' micro-batches
    logged = {}
    for trainer in trainers:
        metric_store(trainer, "train").clear()
        for inputs in (first, second):
            loss_and_grads(trainer, inputs)
        if trainer is stock:
            micro_batches = list(metric_store(stock, "train")["kl"])
        logged[trainer] = logged_line(trainer)["kl"]
    assert len(micro_batches) == 2 and logged[stock] == pytest.approx(sum(micro_batches) / 2, rel=1e-12)
    assert logged[ours] == pytest.approx(logged[stock], rel=RTOL)
    tokens = [float(inputs["completion_mask"].sum()) for inputs in (first, second)]
    weighted = sum(kl * n for kl, n in zip(micro_batches, tokens)) / sum(tokens)
    assert abs(logged[stock] - weighted) > 1e-3 * abs(weighted)  # the two means differ here


HAS_ENTROPY_BONUS = "entropy_coef" in GRPOConfig.__dataclass_fields__  # TRL 1.16 on: its `policy_loss` metric
# A logged value is a float32 mean of one micro-batch's token or sequence terms (at most 28 here), averaged over the
# micro-batches of a line: summed in another order, it may differ by (n − 1)·2⁻²⁴ of the terms' magnitude, n = 28.
# The control (stock TRL on the same micro-batches with their rows reversed: the same numbers, summed in another
# order) is checked against the same bound, and the KL's share of `policy_loss` lies far above it.
LOGGED_RTOL = 27 * 2.0**-24


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def logging_trainers(request, tiny_model_dir):
    """Stock TRL at β = 0.5, ours with its own term where it reduces to TRL's (`kl_log_ratio_clip=80`, k3, no clamp
    in effect), and stock again (the control), with TRL's entropy bonus on (it logs `policy_loss`)."""
    entropy = {"entropy_coef": 0.01} if HAS_ENTROPY_BONUS else {}
    stock, ours, control = (
        make_trainer(cls, config_cls, tiny_model_dir, beta=0.5, bf16=False, **entropy, **fields)
        for cls, config_cls, fields in (
            (GRPOTrainer, GRPOConfig, {}),
            (AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, {"kl_log_ratio_clip": 80.0}),
            (GRPOTrainer, GRPOConfig, {}),
        )
    )
    assert not ours.host_kl_term
    for trainer in (stock, ours, control):
        trainer.model.to(request.param)
    return stock, ours, control


@pytest.mark.parametrize("accumulation", [1, 2])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_logged_value_is_stocks_when_our_term_replaces_its(logging_trainers, loss_type, accumulation):
    """The host's loss runs without its KL term when ours replaces it: its `kl` and (entropy bonus on) `policy_loss`,
    TRL's loss before the bonus and, but for the token-sum types, before its division by the accumulation steps, are
    logged as stock logs them, and every other value TRL logs is the host's own: every key of stock's log line is in
    ours, equal to float precision, for every loss type, with 1 and 2 micro-batches an optimizer step. (Until 0225112
    the `policy_loss` of grpo, bnpo, dr_grpo, sapo and luspo carried 1/accumulation of the KL's share.)"""
    stock, ours, control = logging_trainers
    configure(logging_trainers, loss_type, REQUIRED_LEVEL.get(loss_type, "token"), True)
    lines = []
    for trainer in logging_trainers:
        ours.kl_monitor = KLMonitor(reads_steps=ours.reads_step_kl)
        metric_store(trainer, "train").clear()
        for seed in range(accumulation):
            inputs = fabricated_inputs(stock, seed=seed)
            if trainer is control:  # the same sequences in reverse order
                inputs = {k: v.flip(0) if torch.is_tensor(v) and v.dim() else v for k, v in inputs.items()}
            loss_and_grads(trainer, inputs, accumulation_steps=accumulation)
        lines.append({k: v for k, v in logged_line(trainer).items() if k != "epoch"})
    stock_line, our_line, control_line = lines
    assert "kl" in stock_line and ("policy_loss" in stock_line) == HAS_ENTROPY_BONUS
    assert stock_line.keys() <= our_line.keys()
    assert all(key.startswith("adaptive_kl/") for key in our_line.keys() - stock_line.keys())
    for key, value in stock_line.items():
        bound = LOGGED_RTOL * abs(value)
        assert abs(control_line[key] - value) <= bound, (key, control_line[key], value)
        assert abs(our_line[key] - value) <= bound, (key, our_line[key], value)
    if HAS_ENTROPY_BONUS:  # the KL's share of `policy_loss`, which the host's loss did not log, is far above the bound
        beta, kl = 0.5, stock_line["kl"]
        assert beta * kl > 1e3 * LOGGED_RTOL * max(abs(stock_line["policy_loss"]), 1.0)


@pytest.mark.skipif(not HAS_ENTROPY_BONUS, reason="TRL's entropy bonus (policy_loss): TRL 1.16 on")
def test_policy_loss_keeps_trls_meaning_when_our_term_replaces_its(tiny_model_dir):
    """With TRL's entropy bonus on, TRL logs `policy_loss`, its loss before the bonus, KL term included. The host's
    loss runs without its term when ours replaces it, so ours adds its β·term to the value logged: stock's, to float
    precision, and not the value without a KL term."""
    pair = [
        make_trainer(GRPOTrainer, GRPOConfig, tiny_model_dir, beta=BETA, entropy_coef=0.01),
        make_trainer(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, beta=BETA, entropy_coef=0.01,
                     **IDENTITY),
    ]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trl_utils, "_ChunkedLogProbFunction", Float64LogProbFunction)
        for trainer in pair:
            trainer.model.double()
        inputs = fabricated_inputs(pair[0], seed=6)
        logged = []
        for trainer in pair:
            loss_and_grads(trainer, inputs)
            logged.append(logged_line(trainer)["policy_loss"])
        stock = pair[0]
        stock.beta = 0.0
        loss_and_grads(stock, inputs)
        without_kl = logged_line(stock)["policy_loss"]
    assert logged[1] == pytest.approx(logged[0], rel=RTOL)
    assert abs(logged[0] - without_kl) > 1e-3 * abs(logged[0])
