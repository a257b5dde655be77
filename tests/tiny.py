"""Test helpers: prompts, rewards, trainer construction and fabricated micro-batches on the tiny model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import torch
from datasets import Dataset
from transformers import AutoTokenizer


def prompt_dataset(n: int = 16) -> Dataset:
    return Dataset.from_dict({"prompt": [f"{i}+{i % 7}=" for i in range(n)]})


def length_reward(completions, **kwargs):
    """Rewards short completions (varies across a group, so advantages are non-zero)."""
    return [1.0 / (1.0 + len(c)) for c in completions]


def constant_reward(completions, **kwargs):
    return [1.0 for _ in completions]


# Keyword arguments shared by every training config of the tests: CPU, tiny batches, no logging backends.
TRAIN_KWARGS = dict(
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=8,
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    use_cpu=not torch.cuda.is_available(),
    learning_rate=1e-2,
    seed=0,
    data_seed=0,
    disable_tqdm=True,
)


def make_trainer(
    cls,
    config_cls,
    model_dir,
    reward_funcs=(length_reward,),
    peft_config=None,
    eval_dataset=None,
    trainer_kwargs=None,
    **kwargs,
):
    """A trainer on the tiny model; `kwargs` go to the config (over `TRAIN_KWARGS`), `trainer_kwargs` to the
    trainer."""
    kwargs.setdefault("output_dir", f"{model_dir}/out-{cls.__name__}")
    args = config_cls(**{**TRAIN_KWARGS, **kwargs})
    return cls(
        model=model_dir,
        reward_funcs=list(reward_funcs),
        args=args,
        train_dataset=prompt_dataset(),
        eval_dataset=eval_dataset,
        peft_config=peft_config,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        **(trainer_kwargs or {}),
    )


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
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
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


def assert_close_to_stock(ours, stock, policy_only, what: str, rtol: float = 1e-6) -> None:
    """|ours − stock| ≤ rtol · max(|stock|, |policy_only|): "relative" to the magnitude of the terms summed, since the
    host adds β·k before aggregating and we after, and the two summation orders differ by rounding."""
    scale = max(stock.norm().item(), policy_only.norm().item())
    assert (ours - stock).norm().item() <= rtol * scale, f"{what}: {ours} vs {stock}"


def run_python(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Runs `python *args` offline as a user would (a script or `-m module`), with `env` added to the environment,
    and asserts that it succeeded."""
    result = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def launch_two_processes(*args: str) -> subprocess.CompletedProcess:
    """`accelerate launch` on 2 CPU processes (gloo) of `python *args` (a script, or `-m module`), one thread each;
    once more on another port if the free port was taken meanwhile."""
    for attempt in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launch = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
        launch += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port)]
        try:
            return run_python(*launch, *args, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
        except AssertionError as error:
            if attempt or "address already in use" not in str(error).lower():
                raise
