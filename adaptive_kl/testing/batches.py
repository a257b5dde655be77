"""Fabricated micro-batches and loss/gradient comparisons of GRPO trainers, for tests and the GPU check.

A micro-batch is built as `_generate_and_score_completions` returns it, so that a trainer's `compute_loss` can be
compared with another's on identical inputs, without generation.
"""

from __future__ import annotations

import torch


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
    completion_mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]]
    )  # (batch, completion_len)
    advantages = torch.randn(batch, generator=g)
    return scored_micro_batch(trainer, prompt_ids, completion_ids, completion_mask, advantages, g, micro_batches=2)


def grouped_inputs(trainer, num_prompts: int, completion_length: int, seed: int = 0, micro_batches: int = 2) -> dict:
    """A micro-batch laid out as training lays it out: `num_prompts` prompts of 8 tokens, each repeated for the
    trainer's `num_generations` completions (the shared prompts a prefix grouper deduplicates), completions of
    `completion_length // 2` to `completion_length` tokens (the first one full) padded with the pad token after their
    end (Unsloth rebuilds the completion mask from the ids), group-normalized advantages, and drifted reference and
    old policies. `num_items_in_batch` counts the tokens of `micro_batches` such micro-batches (the optimizer step's).
    """
    g = torch.Generator().manual_seed(seed)
    group = trainer.num_generations
    rows, vocab = num_prompts * group, trainer.model.config.vocab_size
    pad = trainer.processing_class.pad_token_id
    prompt_ids = torch.randint(3, vocab - 1, (num_prompts, 8), generator=g)
    lengths = torch.randint(completion_length // 2, completion_length + 1, (rows,), generator=g)
    lengths[0] = completion_length
    completion_ids = torch.randint(3, vocab - 1, (rows, completion_length), generator=g)
    if pad is not None:  # ids drawn below the vocabulary's last, the pad id and those above moved up: none is the pad
        prompt_ids += (prompt_ids >= pad).long()
        completion_ids += (completion_ids >= pad).long()
    prompt_ids = prompt_ids.repeat_interleave(group, dim=0)
    completion_mask = (torch.arange(completion_length) < lengths[:, None]).long()  # (rows, T): 1 up to `lengths`
    completion_ids = completion_ids.masked_fill(completion_mask == 0, pad)
    rewards = torch.randn(num_prompts, group, generator=g)
    advantages = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)
    return scored_micro_batch(
        trainer, prompt_ids, completion_ids, completion_mask, advantages.flatten(), g, micro_batches
    )


def scored_micro_batch(trainer, prompt_ids, completion_ids, completion_mask, advantages, g, micro_batches) -> dict:
    """The micro-batch dict, with the policy's log-probabilities of the completions as the old policy's and the
    reference's, each drifted by Gaussian noise (σ = 0.1 and 0.5)."""
    batch, completion_len = completion_ids.shape
    prompt_mask = torch.ones_like(prompt_ids)
    old_noise = 0.1 * torch.randn(batch, completion_len, generator=g)
    ref_noise = 0.5 * torch.randn(batch, completion_len, generator=g)
    device = trainer.accelerator.device
    prompt_ids, completion_ids, completion_mask, prompt_mask = (
        x.to(device) for x in (prompt_ids, completion_ids, completion_mask, prompt_mask)
    )
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([prompt_mask, completion_mask], 1),
            completion_len,
        )[0]
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages.to(device, logps.dtype),
        "old_per_token_logps": logps + old_noise.to(device, logps.dtype),
        "ref_per_token_logps": logps + ref_noise.to(device, logps.dtype),
        "num_items_in_batch": completion_mask.sum() * micro_batches,  # the optimizer step's micro-batches
    }


def loss_and_grads(trainer, inputs, *, train: bool = True, accumulation_steps: int = 2):
    model = trainer.model
    model.train(train)
    model.zero_grad(set_to_none=True)
    # What Transformers' training loop sets before each optimizer step, for a loss computed outside it
    trainer.current_gradient_accumulation_steps = accumulation_steps
    with torch.set_grad_enabled(train):
        loss = trainer.compute_loss(model, inputs)
    if not train:
        return loss.detach(), {}
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads
