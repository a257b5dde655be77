"""Binomial-KL ("SPO") math: per-token Bernoulli KL toward a target probability, trained on correct sequences only.

Source: J. Byun, "Exploring Paths in Probabilistic Graphs for Model Training" (bachelor's thesis, Seoul National
University, 2025; unpublished), §3.1–3.3, and its study code on RL2,
https://github.com/jsbyun121/exploring-paths-llm (at 4b95fbab8543b18cc7d484cf90271cd505692fee).

For a sampled token with probability ``p = π_θ(y_t | ·)`` (logits divided by the sampling temperature, as TRL does),
each token is seen as a Bernoulli "this token vs. the rest" and pulled toward a target probability ``q``:

    ℓ = KL(Bern(q) ‖ Bern(p)) = q·(log q − log p) + (1 − q)·(log(1 − q) − log(1 − p))

- target ``"max"``: ``q = p_max``, the probability of the most probable token at that position. ℓ = 0 when the sampled
  token is the argmax, and ℓ > 0 pulls ``p`` up toward ``p_max`` otherwise.
- target ``"half"``: ``q = 0.5``, ℓ = −½(log p + log(1 − p)) + log ½, applied only where ``p > 0.5`` (it pulls
  over-confident tokens back toward ½).

**The target is detached by default.** A KL *toward a target* fits the model's Bernoulli to a fixed distribution:
``∇ℓ = (∂ℓ/∂p)·∇p`` only. Letting the gradient also flow through ``p_max`` (which is a function of the policy too)
adds ``(∂ℓ/∂q)·∇p_max`` with ``∂ℓ/∂q = log(q/p) − log((1−q)/(1−p)) > 0`` for ``q > p``: it *lowers* the argmax
token's probability toward the sampled one, so the two chase each other and the objective is no longer a KL to a
target but a symmetric pull that flattens the distribution. RL2's study code lets the gradient through (it never
detaches ``max_logps``); ``detach_target=False`` reproduces that. At ``p = p_max`` both versions have ℓ = 0 and
zero gradient (the KL is minimal in both arguments there).

**Aggregation** ("avg_level: sequence"): with advantages ``A_it = r_i·m_it`` (reward times completion mask, no
baseline) and the correct sequences ``C = {i : r_i > threshold, L_i > 0}``, one optimizer step minimizes

    J = Σ_{i∈C} (1/L_i) Σ_t A_it·ℓ_it / max(N_C, 1)

with ``N_C`` the correct sequences of the whole optimizer step (every micro-batch, every process); 0 when none.

**Memory.** :func:`token_log_probs_from_logits` is a custom autograd function: it saves the logits it is given and
nothing else of vocabulary size, computes ``logsumexp``/``gather``/``max`` over row chunks of the (temperature-
divided) logits, and rebuilds the softmax chunk by chunk in the backward. The temperature division happens on each
chunk, so no second full-vocabulary copy of the logits (divided or upcast) ever exists. ``log(1 − p)`` is computed
as ``logsumexp(other logits) − logsumexp(all logits)``, which stays exact when ``p`` rounds to 1 (where
``log1p(−exp(log p))`` would give −inf).

Every function is pure torch.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


BINOMIAL_KL_TARGETS = ("max", "half")
LOG_HALF = math.log(0.5)

# Elements of the float32 working chunk of the logits (64 MiB): bounds the temporaries of the forward and backward
# whatever the vocabulary size (e.g. 441 positions per chunk at Qwen2.5's 151,936 tokens).
CHUNK_ELEMENTS = 1 << 24


class BinomialLogProbs(NamedTuple):
    """Per-token log-probabilities of the sampled and of the most probable token, each of shape `(B, T)`, float32
    (float64 for float64 logits).

    Attributes:
        log_p: log p, p the probability of the sampled token.
        log1m_p: log(1 − p).
        log_p_max: log p_max, p_max the largest probability at the position.
        log1m_p_max: log(1 − p_max).
    """

    log_p: torch.Tensor
    log1m_p: torch.Tensor
    log_p_max: torch.Tensor
    log1m_p_max: torch.Tensor


def _position_chunks(batch: int, length: int, vocab: int):
    """(b, t0, t1) blocks covering a `(batch, length)` grid with at most `CHUNK_ELEMENTS // vocab` positions each."""
    step = max(1, CHUNK_ELEMENTS // max(vocab, 1))
    for b in range(batch):
        for t0 in range(0, length, step):
            yield b, t0, min(t0 + step, length)


class _TokenLogProbs(torch.autograd.Function):
    """(logits, token_ids, temperature) -> the four `BinomialLogProbs` fields; see `token_log_probs_from_logits`."""

    @staticmethod
    def forward(ctx, logits, token_ids, temperature):
        batch, length, vocab = logits.shape
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        log_p, log1m_p, log_p_max, log1m_p_max, lse = (
            logits.new_empty((batch, length), dtype=dtype) for _ in range(5)
        )
        argmax = token_ids.new_empty((batch, length))
        for b, t0, t1 in _position_chunks(batch, length, vocab):
            z = logits[b, t0:t1].to(dtype) / temperature  # (n, V): the only tempered copy, one chunk at a time
            ids = token_ids[b, t0:t1]
            chunk_lse = z.logsumexp(-1)
            z_max, idx_max = z.max(-1)
            log_p[b, t0:t1] = z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - chunk_lse
            log_p_max[b, t0:t1] = z_max - chunk_lse
            for log1m, index in ((log1m_p, ids), (log1m_p_max, idx_max)):  # (n,) each
                # log(1 − p) = logsumexp of the row with the token left out, minus the row's logsumexp
                log1m[b, t0:t1] = z.scatter(-1, index.unsqueeze(-1), float("-inf")).logsumexp(-1) - chunk_lse
            lse[b, t0:t1] = chunk_lse
            argmax[b, t0:t1] = idx_max
        ctx.save_for_backward(logits, token_ids, argmax, log1m_p, log1m_p_max, lse)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        return log_p, log1m_p, log_p_max, log1m_p_max

    @staticmethod
    def backward(ctx, g_p, g_1mp, g_max, g_1mmax):
        logits, token_ids, argmax, log1m_p, log1m_max, lse = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        # d log p_c/dz = δ_c − p;  d log(1−p_c)/dz = q − p with q the softmax over the other tokens (q_c = 0); the same
        # with the argmax m for p_max. So dz = (Σ_k g_k·e_k + g_1mp·q + g_1mmax·r − (Σ_k g_k)·p) / τ.
        grads = (g_p, g_1mp, g_max, g_1mmax)  # None for an output the loss does not use
        grad_logits = torch.zeros_like(logits)
        batch, length, vocab = logits.shape
        dtype = lse.dtype
        for b, t0, t1 in _position_chunks(batch, length, vocab):
            z = logits[b, t0:t1].to(dtype) / ctx.temperature
            chunk_lse = lse[b, t0:t1].unsqueeze(-1)
            p = (z - chunk_lse).exp_()
            g = [None if x is None else x[b, t0:t1].to(dtype).unsqueeze(-1) for x in grads]
            total = sum(x for x in g if x is not None)
            if isinstance(total, int):  # no output was used
                continue
            dz = p.mul_(-total)
            ids = token_ids[b, t0:t1].unsqueeze(-1)
            idx_max = argmax[b, t0:t1].unsqueeze(-1)
            if g[0] is not None:
                dz.scatter_add_(-1, ids, g[0])
            if g[2] is not None:
                dz.scatter_add_(-1, idx_max, g[2])
            for gk, index, log1m in ((g[1], ids, log1m_p), (g[3], idx_max, log1m_max)):
                if gk is None:
                    continue
                # q_j = p_j / (1 − p_index) for j ≠ index, from logits: exp(z_j − lse − log(1 − p_index)).
                q = (z - (chunk_lse + log1m[b, t0:t1].unsqueeze(-1))).exp_().scatter_(-1, index, 0.0)
                dz.add_(q.mul_(gk))
            grad_logits[b, t0:t1] = dz.div_(ctx.temperature)
        return grad_logits, None, None


def token_log_probs_from_logits(
    logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0
) -> BinomialLogProbs:
    """log p, log(1 − p), log p_max and log(1 − p_max) of `softmax(logits / temperature)`, differentiable.

    Saves only `logits` (no copy) and `(B, T)` tensors for the backward; see the module docstring for the memory
    behaviour. Upcasts half-precision logits to float32 chunk by chunk.

    Args:
        logits (`torch.Tensor` of shape `(B, T, V)`): the logits predicting each completion token.
        token_ids (`torch.Tensor` of shape `(B, T)`): the sampled tokens.
        temperature (`float`): the sampling temperature the logits are divided by.

    Returns:
        `BinomialLogProbs` of `(B, T)` tensors.
    """
    if logits.dim() != 3 or token_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"Expected logits (B, T, V) and token_ids (B, T), got {tuple(logits.shape)} and {tuple(token_ids.shape)}."
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}.")
    return BinomialLogProbs(*_TokenLogProbs.apply(logits, token_ids.long(), float(temperature)))


def log1m_exp(log_p: torch.Tensor) -> torch.Tensor:
    """log(1 − exp(x)) for x ≤ 0, accurate over the whole range and finite (with finite gradient) everywhere.

    Uses log(−expm1(x)) near 0 and log1p(−exp(x)) below −ln 2 (Mächler, 2012); x is clamped to at most −tiny, so
    x = 0 (p rounded to 1) gives a large negative number instead of −inf. Both branches are evaluated on inputs where
    they are finite, so the unused branch cannot put NaN into the gradient.

    Args:
        log_p (`torch.Tensor`): log-probabilities (any shape).

    Returns:
        `torch.Tensor` of the same shape.
    """
    x = log_p.clamp(max=-torch.finfo(log_p.dtype).tiny)
    near_zero = x > -math.log(2.0)
    a = torch.where(near_zero, x, torch.full_like(x, -1.0))
    b = torch.where(near_zero, torch.full_like(x, -1.0), x)
    return torch.where(near_zero, torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(b)))


def binomial_kl_max(
    log_p: torch.Tensor,
    log_p_max: torch.Tensor,
    *,
    log1m_p: torch.Tensor | None = None,
    log1m_p_max: torch.Tensor | None = None,
    detach_target: bool = True,
) -> torch.Tensor:
    """Target "max": KL(Bern(p_max) ‖ Bern(p)) per token.

    Args:
        log_p (`torch.Tensor` of shape `(B, T)`): log p of the sampled token.
        log_p_max (`torch.Tensor` of shape `(B, T)`): log p_max.
        log1m_p, log1m_p_max (`torch.Tensor` of shape `(B, T)`, *optional*): log(1 − p), log(1 − p_max); computed
            with `log1m_exp` when not given (pass those of `token_log_probs_from_logits`, exact near p = 1).
        detach_target (`bool`): stop the gradient through p_max (see the module docstring).

    Returns:
        `torch.Tensor` of shape `(B, T)`: ℓ ≥ 0, exactly 0 where the sampled token is the argmax.
    """
    log1m_p = log1m_exp(log_p) if log1m_p is None else log1m_p
    log1m_p_max = log1m_exp(log_p_max) if log1m_p_max is None else log1m_p_max
    if detach_target:
        log_p_max, log1m_p_max = log_p_max.detach(), log1m_p_max.detach()
    # KL(Bern(q) ‖ Bern(p)) = q·(log q − log p) + (1 − q)·(log(1 − q) − log(1 − p)) with q = p_max. A term whose weight
    # is 0 is 0 (0·log 0 = 0): its log is −inf, so `where` rather than the product keeps its value and gradient at 0.
    q, one_minus_q = log_p_max.exp(), log1m_p_max.exp()
    first = q * torch.where(q > 0, log_p_max - log_p, torch.zeros_like(q))
    second = one_minus_q * torch.where(one_minus_q > 0, log1m_p_max - log1m_p, torch.zeros_like(one_minus_q))
    return first + second


def binomial_kl_half(log_p: torch.Tensor, *, log1m_p: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Target "half": KL(Bern(½) ‖ Bern(p)) = −½(log p + log(1 − p)) + log ½ on the tokens with p > ½, 0 elsewhere.

    Args:
        log_p (`torch.Tensor` of shape `(B, T)`): log p of the sampled token.
        log1m_p (`torch.Tensor` of shape `(B, T)`, *optional*): log(1 − p); `log1m_exp(log_p)` when not given.

    Returns:
        `(kl, active)`: `kl` of shape `(B, T)` (0 where inactive, with zero gradient) and the boolean mask
        `active = p > ½` of shape `(B, T)`.
    """
    log1m_p = log1m_exp(log_p) if log1m_p is None else log1m_p
    active = log_p.detach() > LOG_HALF
    kl = -0.5 * (log_p + log1m_p) + LOG_HALF
    return torch.where(active, kl, torch.zeros_like(kl)), active


def binomial_kl_per_token(
    log_probs: BinomialLogProbs, target: str = "max", *, detach_target: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """ℓ for `target` ("max" or "half") from `token_log_probs_from_logits`'s output.

    Returns:
        `(kl, active)`, both of shape `(B, T)`: the per-token KL and the boolean mask of the tokens it applies to
        (every token for "max", p > ½ for "half").
    """
    if target == "max":
        kl = binomial_kl_max(
            log_probs.log_p,
            log_probs.log_p_max,
            log1m_p=log_probs.log1m_p,
            log1m_p_max=log_probs.log1m_p_max,
            detach_target=detach_target,
        )
        return kl, torch.ones_like(kl, dtype=torch.bool)
    if target == "half":
        return binomial_kl_half(log_probs.log_p, log1m_p=log_probs.log1m_p)
    raise ValueError(f"binomial_kl_target must be one of {BINOMIAL_KL_TARGETS}, got {target!r}.")


def spo_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, threshold: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages A = r·m (no baseline, no normalization) and which sequences are correct.

    Args:
        rewards (`torch.Tensor` of shape `(B,)`): total reward per sequence; NaN for an unscorable one.
        mask (`torch.Tensor` of shape `(B, T)`): completion mask.
        threshold (`float`): a sequence is correct when its reward is > threshold.

    Returns:
        `(advantages, correct)`: `advantages` of shape `(B, T)` (0 for NaN rewards and masked tokens) and `correct`
        of shape `(B,)`, boolean: reward > threshold and at least one completion token (a fully masked sequence,
        e.g. truncated under `mask_truncated_completions`, has nothing to train on and does not count in N_correct).
    """
    if rewards.dim() != 1 or mask.dim() != 2 or rewards.size(0) != mask.size(0):
        raise ValueError(f"Expected rewards (B,) and mask (B, T), got {tuple(rewards.shape)} and {tuple(mask.shape)}.")
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    correct = (rewards > threshold) & (mask.sum(-1) > 0)  # NaN > threshold is False
    advantages = torch.nan_to_num(rewards, nan=0.0).unsqueeze(-1) * mask.to(rewards.dtype)
    return advantages, correct


def binomial_kl_loss(
    per_token_kl: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    correct: torch.Tensor,
    num_correct: torch.Tensor | float,
) -> torch.Tensor:
    """Σ_{i correct} (1/L_i) Σ_t m_it·A_it·ℓ_it / max(num_correct, 1): this micro-batch's share of the step objective.

    Args:
        per_token_kl (`torch.Tensor` of shape `(B, T)`): ℓ.
        advantages (`torch.Tensor` of shape `(B, T)`): A (see `spo_advantages`).
        mask (`torch.Tensor` of shape `(B, T)`): completion mask m; L_i = Σ_t m_it (every completion token, also the
            ones a "half" target leaves out).
        correct (`torch.Tensor` of shape `(B,)`): boolean, the sequences trained on.
        num_correct (`torch.Tensor` or number): N_correct of the whole optimizer step (all micro-batches and
            processes).

    Returns:
        `torch.Tensor`: scalar, connected to `per_token_kl`'s graph (0 with zero gradient when nothing is correct).
    """
    keep = correct.unsqueeze(-1) & (mask > 0)
    weighted = torch.where(keep, advantages.to(per_token_kl.dtype) * per_token_kl, torch.zeros_like(per_token_kl))
    lengths = mask.sum(-1, dtype=per_token_kl.dtype).clamp(min=1.0)
    normalizer = (
        num_correct.to(per_token_kl.dtype).clamp(min=1.0)
        if torch.is_tensor(num_correct)
        else max(float(num_correct), 1.0)
    )
    return (weighted.sum(-1) / lengths).sum() / normalizer
