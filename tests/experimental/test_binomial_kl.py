"""Binomial-KL ("SPO"): closed forms, gradients, aggregation over accumulation steps, memory, config and training."""

from __future__ import annotations

import math

import pytest
import torch
from tiny import TRAIN_KWARGS, make_trainer
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl.experimental.binomial import BinomialKLConfig, BinomialKLTrainer
from adaptive_kl.experimental.binomial import loss as bk
from adaptive_kl.experimental.binomial.loss import (
    binomial_kl_half,
    binomial_kl_loss,
    binomial_kl_max,
    binomial_kl_per_token,
    log1m_exp,
    spo_advantages,
    token_log_probs_from_logits,
)


# --- independent float64 references, written out by hand -------------------------------------------------------------


def kl_max_by_hand(p_max: float, p: float) -> float:
    first = 0.0 if p_max == 0 else p_max * (math.log(p_max) - math.log(p))
    second = 0.0 if p_max == 1 else (1 - p_max) * (math.log(1 - p_max) - math.log(1 - p))
    return first + second


def kl_half_by_hand(p: float) -> float:
    return -0.5 * (math.log(p) + math.log(1 - p)) + math.log(0.5) if p > 0.5 else 0.0


def logits_for(probs) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log().view(1, 1, -1)


def naive_token_kl(logits, ids, temperature, target, detach_target=True):
    """Per-token ℓ from a full log_softmax (float64), the textbook way."""
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    lp = logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    lp_max = logp.max(-1).values
    p, p_max = lp.exp(), lp_max.exp()
    if target == "half":
        kl = -0.5 * (lp + torch.log1p(-p)) + math.log(0.5)
        return torch.where(p > 0.5, kl, torch.zeros_like(kl))
    if detach_target:
        lp_max, p_max = lp_max.detach(), p_max.detach()
    return p_max * (lp_max - lp) + (1 - p_max) * (torch.log1p(-p_max) - torch.log1p(-p))


def naive_objective(per_token_kl, rewards, mask, threshold, num_correct):
    """Σ_{correct i} (1/L_i) Σ_t r_i·m_it·ℓ_it / max(N, 1), one sequence at a time."""
    total = per_token_kl.new_zeros(())
    for i in range(mask.size(0)):
        length = int(mask[i].sum())
        if not (rewards[i] > threshold) or length == 0:
            continue
        total = total + (rewards[i] * mask[i] * per_token_kl[i]).sum() / length
    return total / max(num_correct, 1)


# --- closed forms ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "probs, chosen",
    [
        ([0.6, 0.3, 0.1], 1),
        ([0.6, 0.3, 0.1], 2),
        ([0.25, 0.25, 0.5], 0),
        ([0.97, 0.02, 0.01], 2),
        ([0.4, 0.4, 0.2], 2),
    ],
)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_max_target_closed_form(probs, chosen, temperature):
    logits = logits_for(probs) * temperature  # so that softmax(logits / temperature) = probs
    lp = token_log_probs_from_logits(logits, torch.tensor([[chosen]]), temperature)
    p, p_max = probs[chosen], max(probs)
    assert lp.log_p.item() == pytest.approx(math.log(p), abs=1e-12)
    assert lp.log1m_p.item() == pytest.approx(math.log(1 - p), abs=1e-12)
    assert lp.log_p_max.item() == pytest.approx(math.log(p_max), abs=1e-12)
    assert lp.log1m_p_max.item() == pytest.approx(math.log(1 - p_max), abs=1e-12)
    kl = binomial_kl_max(lp.log_p, lp.log_p_max, log1m_p=lp.log1m_p, log1m_p_max=lp.log1m_p_max)
    assert kl.item() == pytest.approx(kl_max_by_hand(p_max, p), rel=1e-10, abs=1e-14)
    # Without the log(1 − ·) inputs, log1m_exp computes them: the same value.
    assert binomial_kl_max(lp.log_p, lp.log_p_max).item() == pytest.approx(kl.item(), rel=1e-10, abs=1e-14)


def test_max_target_is_zero_when_sampled_token_is_the_argmax():
    logits = torch.randn(3, 5, 11)
    ids = logits.argmax(-1)
    lp = token_log_probs_from_logits(logits, ids, 0.8)
    kl, active = binomial_kl_per_token(lp, "max")
    assert torch.equal(kl, torch.zeros_like(kl)) and active.all()
    # A tie between the sampled token and the max is also 0, whichever index `max` picked.
    tied = torch.tensor([[[2.0, 2.0, 0.0]]])
    lp = token_log_probs_from_logits(tied, torch.tensor([[1]]))
    assert binomial_kl_per_token(lp, "max")[0].item() == 0.0


@pytest.mark.parametrize("probs, chosen", [([0.7, 0.2, 0.1], 0), ([0.7, 0.2, 0.1], 1), ([0.5, 0.3, 0.2], 0),
                                           ([0.999, 0.0005, 0.0005], 0), ([0.51, 0.49, 0.0], 1)])  # fmt: skip
def test_half_target_closed_form_and_mask(probs, chosen):
    probs = [max(x, 1e-300) for x in probs]
    lp = token_log_probs_from_logits(logits_for(probs), torch.tensor([[chosen]]))
    kl, active = binomial_kl_half(lp.log_p, log1m_p=lp.log1m_p)
    p = probs[chosen]
    assert active.item() == (p > 0.5)  # p = 0.5 exactly is not active
    assert kl.item() == pytest.approx(kl_half_by_hand(p), rel=1e-10, abs=1e-14)
    kl2, active2 = binomial_kl_per_token(lp, "half")
    assert torch.equal(kl2, kl) and torch.equal(active2, active)


def test_extreme_probabilities_are_finite_and_exact():
    # p → 1 (log p = 0 in float32), p ≈ e^-100, and logits of ±1e4.
    logits = torch.tensor([[[100.0, 0.0, 0.0, -5.0], [0.0, 100.0, 0.0, 0.0], [1e4, -1e4, 0.0, 0.0]]])
    ids = torch.tensor([[0, 0, 1]])
    logits.requires_grad_(True)
    lp = token_log_probs_from_logits(logits, ids, 1.0)
    ref = logits.detach().double()
    lse = ref.logsumexp(-1)
    others = ref.clone().scatter_(-1, ids.unsqueeze(-1), float("-inf")).logsumexp(-1)
    torch.testing.assert_close(lp.log_p.double(), ref.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - lse)
    torch.testing.assert_close(lp.log1m_p.double(), others - lse)  # ≈ log(2 + e^-105) − 100: exact, not −inf
    for target in ("max", "half"):
        kl, _ = binomial_kl_per_token(lp, target, detach_target=False)
        assert torch.isfinite(kl).all()
        (grad,) = torch.autograd.grad(kl.sum(), logits, retain_graph=True)
        assert torch.isfinite(grad).all()
    kl, _ = binomial_kl_per_token(lp, "max")
    # Row 0: the sampled token is the argmax → 0. Row 1: p_max ≈ 1, p = e^-100/(…) → ℓ ≈ log(p_max/p) ≈ 100.
    assert kl[0, 0].item() == 0.0
    assert kl[0, 1].item() == pytest.approx(100.0 + math.log(1 + 3 * math.exp(-100)), rel=1e-6)
    assert kl[0, 2].item() == pytest.approx(2e4, rel=1e-6)


def test_log1m_exp_matches_float64_and_is_finite_at_zero():
    x = torch.tensor([-1e-30, -1e-8, -1e-3, -0.5, -math.log(2), -0.7, -5.0, -50.0, -800.0], dtype=torch.float64)
    mpmath = pytest.importorskip("mpmath")  # a torch dependency
    mpmath.mp.dps = 50
    expected = torch.tensor([float(mpmath.log(1 - mpmath.exp(v))) for v in x.tolist()], dtype=torch.float64)
    torch.testing.assert_close(log1m_exp(x), expected, rtol=1e-12, atol=1e-300)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        z = torch.tensor([0.0, -1e-45, -1.0, -100.0], dtype=dtype, requires_grad=True)
        out = log1m_exp(z)
        (grad,) = torch.autograd.grad(out.sum(), z)
        assert torch.isfinite(out).all() and torch.isfinite(grad).all(), dtype


# --- gradients -------------------------------------------------------------------------------------------------------


def test_token_log_probs_gradcheck_with_small_chunks(monkeypatch):
    monkeypatch.setattr(bk, "CHUNK_ELEMENTS", 10)  # several chunks per row, including a ragged last one
    logits = torch.randn(2, 5, 7, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 7, (2, 5))
    assert torch.autograd.gradcheck(lambda z: tuple(token_log_probs_from_logits(z, ids, 0.7)), (logits,))
    # Only some outputs used (the others' gradients arrive as None).
    assert torch.autograd.gradcheck(lambda z: token_log_probs_from_logits(z, ids, 1.3).log1m_p_max, (logits,))


@pytest.mark.parametrize("target, detach", [("max", True), ("max", False), ("half", True)])
def test_loss_gradient_matches_naive_log_softmax(target, detach):
    g = torch.Generator().manual_seed(1)
    batch, length, vocab, temperature = 4, 6, 9, 0.7
    logits = (3 * torch.randn(batch, length, vocab, generator=g, dtype=torch.float64)).requires_grad_(True)
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    ids[0, :3] = logits.detach()[0, :3].argmax(-1)  # a few sampled argmaxes (ℓ = 0 for "max", often active for "half")
    lengths = torch.tensor([6, 4, 1, 0])
    mask = (torch.arange(length) < lengths[:, None]).long()
    rewards = torch.tensor([1.0, 0.5, 2.0, 1.0], dtype=torch.float64)  # the last sequence is correct but empty

    lp = token_log_probs_from_logits(logits, ids, temperature)
    kl, _ = binomial_kl_per_token(lp, target, detach_target=detach)
    advantages, correct = spo_advantages(rewards, mask, 0.0)
    assert correct.tolist() == [True, True, True, False]
    loss = binomial_kl_loss(kl, advantages, mask, correct, correct.sum())
    (grad,) = torch.autograd.grad(loss, logits)

    ref_logits = logits.detach().clone().requires_grad_(True)
    ref = naive_objective(naive_token_kl(ref_logits, ids, temperature, target, detach), rewards, mask, 0.0, 3)
    (ref_grad,) = torch.autograd.grad(ref, ref_logits)
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-9, atol=1e-12)
    assert ref_grad.abs().sum() > 0  # the comparison is not vacuous


def test_spo_advantages():
    rewards = torch.tensor([1.0, 0.0, -1.0, float("nan"), 2.0, 0.3])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 1]])
    advantages, correct = spo_advantages(rewards, mask, threshold=0.0)
    assert correct.tolist() == [True, False, False, False, False, True]  # NaN and empty sequences are not correct
    torch.testing.assert_close(advantages, torch.nan_to_num(rewards).unsqueeze(-1) * mask)
    assert spo_advantages(rewards, mask, threshold=0.5)[1].tolist() == [True, False, False, False, False, False]
    assert spo_advantages(rewards, mask, threshold=-2.0)[1].tolist() == [True, True, True, False, False, True]


def test_no_correct_sequence_gives_zero_loss_and_gradient():
    logits = torch.randn(3, 4, 6, requires_grad=True)
    ids = torch.randint(0, 6, (3, 4))
    mask = torch.ones(3, 4, dtype=torch.long)
    for target in ("max", "half"):
        kl, _ = binomial_kl_per_token(token_log_probs_from_logits(logits, ids), target)
        advantages, correct = spo_advantages(torch.tensor([0.0, -1.0, float("nan")]), mask)
        loss = binomial_kl_loss(kl, advantages, mask, correct, correct.sum())
        (grad,) = torch.autograd.grad(loss, logits)
        assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))


# --- the trainer -----------------------------------------------------------------------------------------------------

BASE = dict(TRAIN_KWARGS, bf16=False)


def digit_reward(completions, **kwargs):
    """1 when the completion has a digit: about half of the tiny model's random completions."""
    return [1.0 if any(ch.isdigit() for ch in c) else 0.0 for c in completions]


def fabricated_generation_batch(trainer, rewards, lengths, completion_len=6, prompt_len=3, seed=0):
    """What `GRPOTrainer._generate_and_score_completions` returns, for len(rewards) sequences (rewards: see below)."""
    g = torch.Generator().manual_seed(seed)
    vocab = trainer.model.config.vocab_size
    n = len(rewards)
    completion_mask = (torch.arange(completion_len)[None, :] < torch.tensor(lengths)[:, None]).long()
    return {
        "prompt_ids": torch.randint(3, vocab, (n, prompt_len), generator=g),
        "prompt_mask": torch.ones(n, prompt_len, dtype=torch.long),
        "completion_ids": torch.randint(3, vocab, (n, completion_len), generator=g),
        "completion_mask": completion_mask,
        "advantages": torch.randn(n, generator=g),  # TRL's, replaced by the trainer
        "num_items_in_batch": completion_mask.sum(),
    }


def naive_step_objective(trainer, batches, target="max"):
    """The closed-form step objective over `batches`, from the model's full logits and a float64 log_softmax."""
    args = trainer.args
    kls, rewards, masks = [], [], []
    for batch in batches:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        length = batch["completion_ids"].size(1)
        logits = trainer.model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -length - 1 : -1]
        kls.append(naive_token_kl(logits, batch["completion_ids"], args.temperature, target))
        rewards.append(batch["advantages"].double())
        masks.append(batch["completion_mask"])
    rewards, masks = torch.cat(rewards), torch.cat(masks)
    num_correct = int(((rewards > args.correct_reward_threshold) & (masks.sum(-1) > 0)).sum())
    return naive_objective(torch.cat(kls), rewards, masks, args.correct_reward_threshold, num_correct)


def grads_of(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def test_accumulated_gradient_equals_step_objective(tiny_model_dir, monkeypatch):
    """Two accumulation micro-batches through `training_step` (TRL's buffer, shuffle and GA scaling): the summed
    .grad is the gradient of Σ_{correct i} (1/L_i) Σ_t A·ℓ / N_correct over the whole step."""
    trainer = make_trainer(
        BinomialKLTrainer, BinomialKLConfig, tiny_model_dir, gradient_accumulation_steps=2, temperature=0.7,
        correct_reward_threshold=0.2, **BASE,
    )  # fmt: skip
    # float64: the float32 loss is a small difference of larger terms whose rounding depends on the CPU's SIMD width
    # (1.3e-5 relative with torch's scalar kernels); in float64 both sides agree to ~1e-15 on any CPU.
    trainer.model.double()
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, 0.1, 1.5, float("nan"), 0.7])
    lengths = [6, 4, 1, 3, 5, 2, 6, 0]  # 4 correct: not 0.0 and 0.1 (threshold), NaN, nor the empty last one
    generation_batch = fabricated_generation_batch(trainer, rewards, lengths)

    def fake_generate(self, inputs):
        self._rewards_per_func = rewards.clone().unsqueeze(1)  # as `_calculate_rewards` would leave it (one function)
        return {k: v.clone() for k, v in generation_batch.items()}

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", fake_generate)
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = 2  # what Trainer.train sets
    losses = [trainer.training_step(model, [{}] * len(rewards), None) for _ in range(2)]
    ours = grads_of(model)
    assert trainer._metrics["train"]["binomial_kl/num_correct"] == [4.0, 4.0]

    model.zero_grad(set_to_none=True)
    reference_batch = dict(generation_batch, advantages=rewards)
    objective = naive_step_objective(trainer, [reference_batch])
    objective.backward()
    reference = grads_of(model)
    assert sum(losses).item() == pytest.approx(objective.item(), rel=1e-10)
    assert ours.keys() == reference.keys()
    scale = max(g.abs().max().item() for g in reference.values())
    assert scale > 0
    for name, grad in reference.items():
        torch.testing.assert_close(ours[name], grad, rtol=1e-9, atol=1e-12 * scale, msg=name)


def test_micro_batches_share_the_step_normalizer(tiny_model_dir):
    """Slots of the generation buffer: each micro-batch divides by the correct sequences of both."""
    trainer = make_trainer(BinomialKLTrainer, BinomialKLConfig, tiny_model_dir, gradient_accumulation_steps=2, **BASE)
    # In float64 both sides are exact to ~1e-15: the float32 loss is a small difference of larger terms, whose
    # rounding depends on the CPU's SIMD width (2.7e-5 relative on AVX2), while a wrong normalizer is off by > 1e-1.
    trainer.model.double()
    first = fabricated_generation_batch(trainer, [1.0, 0.0, 1.0, 1.0], [6, 4, 1, 3], seed=1)
    second = fabricated_generation_batch(trainer, [0.0, 2.0, 0.0, 0.0], [2, 5, 6, 6], seed=2)
    first["advantages"], second["advantages"] = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0.0, 2.0, 0.0, 0.0])
    trainer._buffered_inputs = [first, second]
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    with torch.no_grad():
        ours = [trainer.compute_loss(trainer.model, batch) for batch in (first, second)]
        reference = naive_step_objective(trainer, [first, second])
    assert trainer._metrics["train"]["binomial_kl/num_correct"] == [4.0, 4.0]
    assert sum(ours).item() == pytest.approx(reference.item(), rel=1e-10)
    # In training, a batch outside a filled buffer cannot be normalized by its step: refused, not scaled wrongly.
    with pytest.raises(RuntimeError, match="generation buffer"):
        trainer.compute_loss(trainer.model, dict(second))
    # Without a buffer (a batch passed to compute_loss directly) it is a whole step by itself (1 correct sequence).
    trainer._buffered_inputs = [None, None]
    with torch.no_grad():
        alone = trainer.compute_loss(trainer.model, dict(second))
        assert alone.item() == pytest.approx(naive_step_objective(trainer, [second]).item(), rel=1e-10)


def test_trainer_zero_correct_gives_zero_loss_and_gradient(tiny_model_dir):
    trainer = make_trainer(BinomialKLTrainer, BinomialKLConfig, tiny_model_dir, **BASE)
    batch = fabricated_generation_batch(trainer, [0.0, -1.0, float("nan"), 0.0], [6, 4, 1, 3])
    batch["advantages"] = torch.tensor([0.0, -1.0, float("nan"), 0.0])
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    assert loss.item() == 0.0
    grads = grads_of(model)
    assert grads and all(torch.equal(g, torch.zeros_like(g)) for g in grads.values())
    assert all(math.isfinite(v[-1]) for k, v in trainer._metrics["train"].items() if k.startswith("binomial_kl/"))


def count_big_saved_tensors(fn, numel: int, vocab: int) -> list[tuple[int, ...]]:
    """Shapes of the tensors autograd saves while `fn` runs that have vocabulary size and at least `numel` elements."""
    big = []

    def pack(tensor):
        if tensor.dim() >= 1 and tensor.shape[-1] == vocab and tensor.numel() >= numel:
            big.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return big


def test_loss_graph_saves_one_logits_tensor(tiny_model_dir):
    trainer = make_trainer(BinomialKLTrainer, BinomialKLConfig, tiny_model_dir, temperature=0.7, **BASE)
    batch_size, length = 4, 12
    vocab = trainer.model.config.vocab_size
    batch = fabricated_generation_batch(trainer, [1.0, 0.0, 1.0, 1.0], [12, 4, 1, 3], completion_len=length)
    batch["advantages"] = torch.tensor([1.0, 0.0, 1.0, 1.0])
    trainer.model.train()
    big = count_big_saved_tensors(
        lambda: trainer.compute_loss(trainer.model, batch), batch_size * length * vocab, vocab
    )
    assert big == [(batch_size, length, vocab)]  # the logits, and nothing else of their size

    # The counter catches a second copy: an RL2-style computation (upcast/tempered logits + masked clone) saves more.
    logits = torch.randn(batch_size, length, vocab, requires_grad=True)

    def rl2_style():
        z = logits.float() / 0.7
        others = z.clone().scatter_(-1, batch["completion_ids"].unsqueeze(-1), float("-inf"))
        return z.logsumexp(-1) + others.logsumexp(-1)

    assert len(count_big_saved_tensors(rl2_style, batch_size * length * vocab, vocab)) >= 2

    def ours():
        return token_log_probs_from_logits(logits, batch["completion_ids"], 0.7)

    assert count_big_saved_tensors(ours, batch_size * length * vocab, vocab) == [(batch_size, length, vocab)]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"binomial_kl_target": "min"}, "binomial_kl_target"),
        ({"correct_reward_threshold": float("nan")}, "correct_reward_threshold"),
        ({"correct_reward_threshold": -1.0}, "correct_reward_threshold"),
        ({"correct_reward_threshold": "0"}, "correct_reward_threshold"),
        ({"binomial_kl_detach_target": 1}, "binomial_kl_detach_target"),
        ({"beta": 0.04}, "beta"),
        ({"loss_type": "grpo"}, "loss_type"),
        ({"top_entropy_quantile": 0.2}, "top_entropy_quantile"),
        ({"entropy_coef": 0.01}, "entropy_coef"),
        (
            {"gradient_accumulation_steps": 2, "steps_per_generation": 3, "per_device_train_batch_size": 4},
            "steps_per_generation",
        ),
    ],
)  # fmt: skip
def test_config_validation_names_the_field(tmp_path, kwargs, field):
    with pytest.raises(ValueError, match=field):
        BinomialKLConfig(**{**BASE, "output_dir": str(tmp_path), **kwargs})


def test_config_defaults_and_trainer_refuses_plain_config(tmp_path, tiny_model_dir):
    args = BinomialKLConfig(**{**BASE, "output_dir": str(tmp_path), "gradient_accumulation_steps": 2})
    assert (args.binomial_kl_target, args.correct_reward_threshold, args.binomial_kl_detach_target) == (
        "max",
        0.0,
        True,
    )
    assert args.steps_per_generation == 2
    with pytest.raises(TypeError, match="BinomialKLConfig"):
        make_trainer(BinomialKLTrainer, GRPOConfig, tiny_model_dir, **BASE)


@pytest.mark.parametrize("target", ["max", "half"])
def test_short_training_run(tiny_model_dir, target):
    trainer = make_trainer(
        BinomialKLTrainer, BinomialKLConfig, tiny_model_dir, reward_funcs=(digit_reward,), max_steps=3,
        gradient_accumulation_steps=2, binomial_kl_target=target, **BASE,
    )  # fmt: skip
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "binomial_kl/loss" in entry]
    assert len(logs) == 3
    names = ("loss", "num_correct", "correct_fraction", "active_token_fraction", "p_chosen", "p_max")
    for entry in logs:
        values = [entry[f"binomial_kl/{name}"] for name in names]
        assert all(math.isfinite(v) for v in values), entry
        assert 0 <= entry["binomial_kl/p_chosen"] <= entry["binomial_kl/p_max"] <= 1
        assert entry["loss"] == pytest.approx(
            entry["binomial_kl/loss"], rel=1e-4, abs=1e-8
        )  # Trainer's loss = objective
    moved = max((p - before[name]).abs().max().item() for name, p in trainer.model.named_parameters())
    if target == "max":
        assert any(entry["binomial_kl/num_correct"] > 0 for entry in logs)
        assert moved > 0
    else:  # the random tiny model has no token with p > 0.5: nothing active, nothing moves, nothing breaks
        assert all(entry["binomial_kl/active_token_fraction"] == 0 for entry in logs) or moved > 0
