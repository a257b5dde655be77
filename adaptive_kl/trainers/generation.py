"""Generation for evaluations run beside training (`RetentionCallback`, the demo's validation accuracy and saved
completions): greedy, or sampled without touching the training's random state."""

from __future__ import annotations

import torch


def prompt_texts(tokenizer, prompts: list) -> tuple[list[str], bool]:
    """`(texts, add_special_tokens)` to tokenize `prompts` as `GRPOTrainer` does for generation: plain text with the
    tokenizer's defaults; conversations rendered with the chat template and the generation prompt, which already hold
    every special token the template wants."""
    if prompts and not isinstance(prompts[0], str):
        texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
        return texts, False
    return list(prompts), True


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list,
    max_new_tokens: int,
    *,
    seed: int | None = None,
    temperature: float = 1.0,
    batch_size: int = 64,
) -> list[str]:
    """Completions of `prompts` (plain text or conversations; left-padded batches), decoded without special tokens:
    greedy, or with a `seed`, sampled at `temperature` (what a GRPO step samples at TRL's defaults) from a random state
    seeded by `seed` and forked off the global one: the training's own sampling is not moved by it, so a run that
    saves samples trains exactly as one that does not."""
    prompts, add_special_tokens = prompt_texts(tokenizer, prompts)
    device = next(model.parameters()).device
    sampled = seed is not None
    sampling = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if sampled else dict(do_sample=False)
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    completions = []
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], enabled=sampled):
            if sampled:
                torch.manual_seed(seed)
            for start in range(0, len(prompts), batch_size):
                batch = tokenizer(
                    prompts[start : start + batch_size],
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=add_special_tokens,
                ).to(device)
                output = model.generate(
                    **batch,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                    **sampling,
                )
                completions += tokenizer.batch_decode(
                    output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
                )
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    return completions
