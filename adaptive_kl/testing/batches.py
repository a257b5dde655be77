"""Fabricated micro-batches and loss/gradient comparisons of GRPO trainers, for tests and the GPU check.

A micro-batch is built as `_generate_and_score_completions` returns it, so that a trainer's `compute_loss` can be
compared with another's on identical inputs, without generation.
"""

from __future__ import annotations

import torch

from ..trainers.hooks import score_policy


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
    advantages = torch.randn(batch, generator=g)
    old_noise = 0.1 * torch.randn(batch, completion_len, generator=g)
    ref_noise = 0.5 * torch.randn(batch, completion_len, generator=g)
    device = trainer.accelerator.device
    prompt_ids, completion_ids, completion_mask, prompt_mask = (
        x.to(device) for x in (prompt_ids, completion_ids, completion_mask, prompt_mask)
    )
    with torch.no_grad():
        logps = score_policy(
            trainer,
            trainer.model,
            torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([prompt_mask, completion_mask], 1),
            completion_len,
        )
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages.to(device, logps.dtype),
        "old_per_token_logps": logps + old_noise.to(device, logps.dtype),
        "ref_per_token_logps": logps + ref_noise.to(device, logps.dtype),
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


def relative_difference(ours, stock, policy_only) -> float:
    """|ours − stock| / max(|stock|, |policy_only|): relative to the magnitude of the terms summed, since the host adds
    β·k before aggregating and we after, and the two summation orders differ by rounding."""
    return (ours - stock).norm().item() / max(stock.norm().item(), policy_only.norm().item(), 1e-30)


def assert_close_to_stock(ours, stock, policy_only, what: str, rtol: float = 1e-6) -> None:
    """`relative_difference(ours, stock, policy_only) <= rtol`."""
    assert relative_difference(ours, stock, policy_only) <= rtol, f"{what}: {ours} vs {stock}"
