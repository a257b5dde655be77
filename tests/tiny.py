"""Test helpers: prompts, rewards, trainer construction and fabricated micro-batches on the tiny model, the tolerance
of a comparison with stock TRL, the formula sheet's term and statistics of one micro-batch together, and the drift
controller's rule written independently."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import torch
from datasets import Dataset
from transformers import AutoTokenizer

from adaptive_kl.kl.metrics import kl_sequence_sums, statistics_of_sequences
from adaptive_kl.kl.term import kl_term_and_sequence_sums
from adaptive_kl.testing.batches import fabricated_inputs, loss_and_grads  # noqa: F401


def assert_close_to_stock(ours, stock, policy_only, what: str, rtol: float = 1e-6) -> None:
    """|ours − stock| / max(|stock|, |policy_only|) <= `rtol`: relative to the magnitude of the terms summed, since the
    host adds β·k before aggregating and we after, and the two summation orders differ by rounding."""
    difference = (ours - stock).norm().item() / max(stock.norm().item(), policy_only.norm().item(), 1e-30)
    assert difference <= rtol, f"{what}: {ours} vs {stock}"


def adapted_kl_term(*args, **kwargs) -> tuple[torch.Tensor | None, torch.Tensor]:
    """`kl_term_and_sequence_sums` (same arguments) with its sums made the micro-batch's statistics
    (`statistics_of_sequences`): `(term, statistics)`, as the trainer's log line reads them."""
    term, sums = kl_term_and_sequence_sums(*args, **kwargs)
    return term, statistics_of_sequences(sums)


def kl_statistics(raw_kl, adapted_kl, mask, **kwargs) -> torch.Tensor:
    """The statistics (`STAT_NAMES`) of one micro-batch: `statistics_of_sequences` of its `kl_sequence_sums`."""
    return statistics_of_sequences(kl_sequence_sums(raw_kl, adapted_kl, mask, **kwargs))


def prompt_dataset(n: int = 16) -> Dataset:
    return Dataset.from_dict({"prompt": [f"{i}+{i % 7}=" for i in range(n)]})


# A chat template for the tiny model's tokenizer (it has none): `role: content` lines, then `assistant: `.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def length_reward(completions, **kwargs):
    """Rewards short completions (varies across a group, so advantages are non-zero)."""
    return [1.0 / (1.0 + len(c)) for c in completions]


def constant_reward(completions, **kwargs):
    return [1.0 for _ in completions]


# Keyword arguments shared by every training config of the tests: CPU, tiny batches, no logging backends.
# The tolerance of a float comparison across processes or splits of a batch, in units of the noise floor measured on a
# control in the same test (the same computation split otherwise on one process, or recomputed in float64): two float32
# results that differ only in the order of their sums are each within about the floor of the exact value, so within
# twice it of each other; the margin of 4 is for the largest of a few draws of rounding. What the tests measured
# (tests/trainers/test_multiprocess.py, its docstring): 0.69 of a floor here, 3.9 on the AMD EPYC that failed rel=1e-5.
NOISE_FACTOR = 8

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


# A guard against a hang, not a speed check: a loaded machine can make a command many times slower than on quiet
# cores (the quick real-model compare takes ~100 s quiet, and 877 s with 4 busy processes on 2 cores, 2026-11-29,
# where the former 600 s limit failed it), and speed is what the benchmarks measure.
HANG_TIMEOUT = 3600


def run_python(*args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    """Runs `python *args` offline as a user would (a script or `-m module`), with `env` added to the environment,
    and with `check` asserts that it succeeded."""
    result = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
        timeout=HANG_TIMEOUT,
    )
    assert not check or result.returncode == 0, result.stderr[-4000:]
    return result


# Failures of a 2-process launch that say nothing about the code under test: the next attempt runs it again.
TRANSIENT_LAUNCH_FAILURES = ("address already in use", "terminate called without an active exception")


def launch_two_processes(*args: str) -> subprocess.CompletedProcess:
    """`accelerate launch` on 2 CPU processes (gloo) of `python *args` (a script, or `-m module`), one thread each;
    once more on another port if the free port was taken meanwhile, or if a rank died of gloo's C++ abort
    ("terminate called without an active exception": a thread of gloo's torn down while still joinable, which a
    loaded 2-core machine occasionally provokes while the ranks connect). Any other failure is raised at once."""
    for attempt in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launch = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
        launch += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port)]
        try:
            return run_python(*launch, *args, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
        except AssertionError as error:
            message = str(error).lower()
            if attempt or not any(cause in message for cause in TRANSIENT_LAUNCH_FAILURES):
                raise


def perturb(model, scale: float = 0.05) -> None:
    """Moves every parameter by seeded noise (the same on every process and in every run)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator).to(p))


# --- the zero-β skip: one run with the skip and one without, compared (test_zero_beta.py, test_rloo_reference.py) ---

ZERO_BETA_COMPLETION_LENGTH = 6
# β = 0.1 for steps 1-2, exactly 0 from step 3 on; every step generates (steps_per_generation = accumulation = 1).
ZERO_BETA_RUN = dict(
    beta=0.1,
    kl_adaptation_method="dynamic",
    beta_min=0.0,
    beta_schedule_steps=3,
    reward_threshold=10.0,  # never reached: β_base stays 0.1 until the switch
    max_steps=5,
    max_completion_length=ZERO_BETA_COMPLETION_LENGTH,
    generation_kwargs={"min_new_tokens": ZERO_BETA_COMPLETION_LENGTH},
    kl_monitor_steps=0,
)
# The metrics that measure the KL (present only on steps scored with the reference), and the wall time of a step.
KL_KEYS = {
    "kl",
    "adaptive_kl/raw_kl",
    "adaptive_kl/adapted_kl",
    "adaptive_kl/clip_fraction",
    "adaptive_kl/seq_kl",
    "adaptive_kl/kl_length_corr",
    "adaptive_kl/reference_skipped",
    "step_time",
}


def assert_same_run_but_the_kl(skipped, full):
    """Two `(trainer, forward counts, training log lines)` runs: every logged number but the KL ones (the advantages'
    and the penalty's included), and every trained weight, bit for bit."""
    (trainer_a, _, logs_a), (trainer_b, _, logs_b) = skipped, full
    assert len(logs_a) == len(logs_b) == ZERO_BETA_RUN["max_steps"]
    for a, b in zip(logs_a, logs_b):
        same = {key: a[key] for key in a if key not in KL_KEYS}
        assert same == {key: b[key] for key in b if key not in KL_KEYS}, (a, b)
    weights_a = {n: p for n, p in trainer_a.model.named_parameters() if p.requires_grad}
    weights_b = {n: p for n, p in trainer_b.model.named_parameters() if p.requires_grad}
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), name


def reference_drift_beta(drifts, *, beta, beta_min, beta_max, target_drift, max_steps):
    """The drift rule of docs/design.md §5 written multiplicatively, with its constants spelled out: the integral's β
    is multiplied by the clipped ratio to the power 1/2, the applied β is the integral's times the ratio."""
    integral_beta, applied = beta, beta
    for step, drift in drifts:
        ratio = min(max(drift / (target_drift * (min(step, max_steps) / max_steps) ** 0.25), 0.25), 4.0)
        if step < max_steps / 4:
            ratio = max(ratio, 1.0)
        integral_beta = min(max(integral_beta * ratio**0.5, beta_min, beta / 1000), beta_max)
        applied = min(max(integral_beta * ratio, beta_min), beta_max)
    return applied
