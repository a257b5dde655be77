"""The GPU check of adaptive-kl on Unsloth's real kernels: one device call, a verdict per check as each finishes.

Run by `gpu_check.sh` (see there). On a GPU: a random-weight model of Qwen2.5-0.5B's shape in `--dtype` (bf16 by
default), loaded once by Unsloth's `FastLanguageModel` with LoRA (r = 16 on every linear layer) and trained by
Unsloth's generated `GRPOTrainer`; every check builds its trainers on that one model, its LoRA weights reset to their
initial values first, so that no check pays for a model load and compile of its own (the 4-bit check loads its own).

A preflight comes first (versions, `import unsloth`, the generated trainer class, the CUDA device and its bf16); if
it fails, the check stops there with the reason (exit status 2). Then each check runs in its own `try`, in the order
of `CHECKS` (parity first), and the moment it ends prints one line (`[gpu-check] NAME: PASS|FAIL|SKIP ...`) and
appends its section to the report. No check but the first selected starts once `--budget` seconds have passed since
the script started (imports, preflight and the model's save count: ~50 s of a call on the H100): those are listed as
skipped, and a second call runs them with `--only` (or leaves the done ones out with `--skip`).
Exit status: 0 when no check failed (skips included), 1 when one did.

Checks, in the order they run (`--only`/`--skip` take names or their prefix before the dash: `parity` is every
`parity-*`; the default call skips `cost-trl`, the second call):
- `parity-<loss_type>`: method `none` against Unsloth's own β loss, for every loss type, on two micro-batches laid
  out as training lays them out (prompts repeated for their completions, 64 tokens on a GPU) through
  `trainer.training_step` with gradient accumulation 2. Each quantity is the KL contribution itself (ours −
  policy-only against stock − policy-only, relative to the latter). The criterion is the gradient arriving on the
  per-token log-probabilities Unsloth's loss receives, where our term enters (a hook in the Unsloth capture shim,
  `recording_logp_gradients`): tolerance 1e-5 (they are float32 in every dtype; measured 1.5–5.7e-7 in float32 on a
  CPU), which ×1.01 or a dropped term exceeds 1000-fold. The loss must agree too (1e-4; 1e-3 with bf16 kernels), the
  KL term must be ≥ 10× that share of the loss, and the worst LoRA gradient must sit within 10× of a control measured
  in the same call: stock against stock with β·(1 + 2^-20), a true change of 9.5e-7 that the backward through the
  model amplifies by its rounding (2.1e-2 for grpo in float32 on a CPU, 2.3e-2 for ours on the H100): the noise
  floor of that metric on this device and dtype. The section records the paths Unsloth's scorer took;
- `train-none`: method `none` trains `--steps` steps; every logged value finite, the KL logged;
- `cost-loss`: the training part alone (`loss_cost.py`): one micro-batch through `training_step` of Unsloth's stock
  trainer, the same again (the A/A) and ours, rotating, `--loss-reps` times after 3; the verdict is ours/stock with
  its 95% t-interval over the repetitions, next to the A/A's;
- `rloo`: `AdaptiveKLRLOOTrainer` on TRL's own `RLOOTrainer` in a second process: one generation batch's advantages
  at the defaults against stock's, relative to the KL's contribution (≤ 1e-3; a control at β·(1 + 2^-20) shows the
  resolution), then `clip+dynamic` trains 3 steps;
- `zero-beta`: β reaches 0 mid-run (`dynamic`, `beta_min=0`, `kl_monitor_steps=0`): the reference is skipped exactly
  from the switch, and those steps are timed against stock at β = 0 (with an interval), with the peak memory;
- `notebook`: the quickstart notebook's code cells as one script in a fresh process, on the call's model
  (`ADAPTIVE_KL_NOTEBOOK_MODEL`), 2 steps;
- `cost`: the whole step: Unsloth's stock trainer and ours (method `none`) alternated, twice each (stock against
  stock: the A/A row that shows the noise, of step time and of memory) after a stock warm-up run that enters no ratio
  (a process's first run does some work once), 1 warm-up and 6 timed steps each on a GPU (the model is compiled by
  then: the parity and training checks ran on it); median step time, the paired steps' ratio with its 95% interval,
  and peak memory above the memory allocated before each build;
- `parity-long`: parity for `dapo` past Unsloth's offloading threshold (> 1024 completion tokens, > 8 rows: its
  offloaded log-softmax), one micro-batch; GPU only;
- `train-<method>`: each other KL method and estimator trains as `train-none` does;
- `beta-trajectory`: `dynamic` with every reward above the threshold and `kl_scaling="log"`: β_t = β·0.9^(t−1)·α(t);
- `steps-per-generation`, `evaluation`, `reference-resets` (LoRA on Unsloth's model), `4bit` (bitsandbytes, its own
  model; GPU only): each trains and logs finite values (evaluation: `evaluate()` logs the KL), resets happen at their
  steps;
- `cost-trl`, the second call: TRL's own trainer and ours on it, alternated as in `cost`, in a second process
  (Unsloth patches TRL for the whole process), on TRL's own scorer (a CPU stand-in only where training runs on a CPU).

Training checks run 3 steps of 16-token completions on a GPU (`--steps`, `--train-completion-length`): enough to
show that a method trains, logs finite values and follows its formula.

`--dry-run` takes the same path on a CPU: Unsloth's trainer is generated with `UNSLOTH_ALLOW_CPU=1` (as in
`tests/unsloth_worker.py`), the model is the tiny one (float32 unless `--dtype` says otherwise) with PEFT's LoRA,
shorter runs. The test suite runs it in float32 and in float64, and makes a check fail on purpose (`--perturb-kl`).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

from adaptive_kl.kl.aggregation import LOSS_TYPES  # torch only: Unsloth is still imported before TRL


# The budget counts from here, not from the first check: on the H100 the imports, the preflight and the model's save
# took ~50 s of a 600 s call, which a budget counted from the first check left out (a call was cut at 570 s).
SCRIPT_START = time.perf_counter()


HERE = os.path.dirname(os.path.abspath(__file__))
BETA = 0.04
PARITY_BETA = 0.3  # the KL term a large share of the loss: its contribution is far above the loss's rounding
CONTROL_STEP = 2.0**-20  # the control's relative change of β: a true change far below every tolerance
LOGP_TOLERANCE = 1e-5  # the criterion: measured 1.5-5.7e-7 in float32 (2026-11-26, CPU); x1.01 gives 1e-2
CONTROL_MULTIPLE = 10.0  # the worst LoRA gradient of ours within this many times the control's
DTYPES = ("bfloat16", "float32", "float64")
TRAINING = {  # check name → our config's fields
    "train-none": {},
    "train-clip": {"kl_adaptation_method": "clip", "kl_clip_threshold": 0.05},
    "train-sigmoid": {"kl_adaptation_method": "sigmoid"},
    "train-length_normalized": {"kl_adaptation_method": "length_normalized"},
    "train-dynamic": {"kl_adaptation_method": "dynamic", "reward_threshold": 0.0},
    "train-k2": {"kl_estimator": "k2"},
    "train-k3+": {"kl_estimator": "k3+"},
}
UNSLOTH_STOCK, TRL_STOCK = "Unsloth stock", "TRL stock"
OFFLOAD_LENGTH = 1040  # Unsloth offloads its log-softmax past 1024 completion tokens with more than 8 rows
PREFIX = "[gpu-check]"


# --- running checks: streamed, budgeted, fail-soft -------------------------------------------------------------------


@dataclass
class Outcome:
    """What one check found: `status` is PASS, FAIL or SKIP; `summary` its one line; `lines` its report section."""

    status: str
    summary: str = ""
    lines: list[str] = field(default_factory=list)


def selected(name: str, patterns: list[str]) -> bool:
    """Whether `name` matches one of `patterns`: the name itself, or its prefix before the first dash."""
    return any(name == pattern or name.split("-", 1)[0] == pattern for pattern in patterns)


def run_checks(
    checks: dict, opts, report_path: str | None, clock=time.perf_counter, started: float | None = None
) -> dict[str, Outcome]:
    """Runs `checks` (name → function of `opts` returning an `Outcome`) in order, within `opts.budget` seconds of
    `started` (a `clock()` reading; default: now).

    Each outcome is printed as one line and appended to `report_path` the moment its check ends; an exception is a
    FAIL with its traceback's tail; a check that is `--skip`ped, not `--only`, or reached after the budget is a SKIP.
    """
    outcomes, start, started_one = {}, clock() if started is None else started, False
    for name, check in checks.items():
        elapsed = clock() - start
        if (opts.only and not selected(name, opts.only)) or selected(name, opts.skip):
            outcome = Outcome("SKIP", "not selected (--only/--skip)")
        elif elapsed >= opts.budget and started_one:  # the first selected check always runs: one verdict a call
            outcome = Outcome(
                "SKIP", f"budget: {elapsed:.0f} s of --budget {opts.budget:g} s spent (rerun with --only)"
            )
        else:
            began, started_one = clock(), True
            try:
                outcome = check(opts)
            except Exception as error:  # a check that raises is a failed check, never the end of the call
                tail = traceback.format_exc().strip().splitlines()[-12:]
                outcome = Outcome("FAIL", f"{type(error).__name__}: {error}"[:300], ["```", *tail, "```"])
            outcome.summary = f"{outcome.summary} ({clock() - began:.1f} s)".strip()
        outcomes[name] = outcome
        emit(f"{PREFIX} {name}: {outcome.status} {outcome.summary}", report_path, outcome.lines)
    counts = {status: sum(o.status == status for o in outcomes.values()) for status in ("PASS", "FAIL", "SKIP")}
    verdict = "FAIL" if counts["FAIL"] else "PASS"
    over_budget = [name for name, o in outcomes.items() if o.status == "SKIP" and o.summary.startswith("budget:")]
    emit(
        f"{PREFIX} verdict: {verdict} ({counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped; "
        f"{clock() - start:.0f} s)",
        report_path,
        [f"Not reached within the budget: run them with `--only {','.join(over_budget)}`."] if over_budget else [],
    )
    return outcomes


def emit(line: str, report_path: str | None, section: list[str] = ()) -> None:
    """Prints `line` now, and appends it (as a heading) and `section` to the report."""
    print(line, flush=True)
    if report_path:
        with open(report_path, "a") as f:
            f.write("\n".join(["", f"### {line.removeprefix(PREFIX).strip()}", *section, ""]))


# --- preflight ------------------------------------------------------------------------------------------------------


def preflight(opts) -> list[str]:
    """Imports Unsloth before TRL, checks the device; returns the report's header lines. Raises `SystemExit` with
    the reason when the check cannot run here."""
    if opts.host == "unsloth":
        if opts.dry_run:
            os.environ["UNSLOTH_ALLOW_CPU"] = "1"
        import unsloth  # noqa: F401

        if opts.dry_run:  # on a CPU Unsloth does not patch TRL: generate its trainer as it does on a GPU
            from unsloth.models.rl import _patch_trl_rl_trainers

            _patch_trl_rl_trainers("grpo_trainer")
    import torch
    import trl

    if opts.host == "unsloth" and trl.GRPOTrainer.__name__ != "UnslothGRPOTrainer":
        raise SystemExit(f"Unsloth did not patch TRL's GRPOTrainer (got {trl.GRPOTrainer.__name__})")
    if opts.dry_run:
        torch.set_num_threads(1)
        from adaptive_kl.trainers.scorer import install_cpu_scorer_if_needed

        install_cpu_scorer_if_needed("cpu")  # TRL 1.15's fused scorer needs a GPU (the TRL process of cost-trl)
        device = f"DRY RUN on a CPU: tiny model, {opts.dtype_name}, PEFT's LoRA"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device (on a CPU, run with --dry-run)")
        if opts.dtype_name == "bfloat16" and not torch.cuda.is_bf16_supported():
            raise SystemExit(f"{torch.cuda.get_device_name()} has no bf16: run with --dtype float32")
        free, total = torch.cuda.mem_get_info()
        memory = f"{total / 2**30:.0f} GiB ({free / 2**30:.0f} free)"
        device = f"{torch.cuda.get_device_name()}, {memory}, {opts.dtype_name}"
    import importlib.metadata as metadata

    names = ("torch", "transformers", "trl", "peft", "accelerate", "unsloth", "unsloth_zoo", "bitsandbytes")
    versions = []
    for name in names:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} absent")
    return [
        f"- preflight: {device}; trainer class {trl.GRPOTrainer.__name__}",
        f"- packages: {', '.join(versions)}",
    ]


# --- building trainers ----------------------------------------------------------------------------------------------


_POLICIES: dict = {}  # load_in_4bit → the policy every check of the call trains (see `policy`)


def load_policy(opts, load_in_4bit: bool = False):
    """The policy in `opts.dtype` with LoRA (r = 16 on every linear layer): Unsloth's `FastLanguageModel` on a GPU,
    PEFT's LoRA otherwise."""
    import torch
    from peft import LoraConfig, get_peft_model

    lora = dict(r=16, lora_alpha=16, lora_dropout=0.0)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    if opts.host == "unsloth" and not opts.dry_run:
        from unsloth import FastLanguageModel

        model, _ = FastLanguageModel.from_pretrained(
            opts.model_dir, max_seq_length=2048, dtype=opts.dtype, load_in_4bit=load_in_4bit
        )
        return FastLanguageModel.get_peft_model(model, target_modules=targets, random_state=0, **lora)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(opts.model_dir, dtype=opts.dtype)
    if opts.host == "unsloth":  # the two methods Unsloth's trainer calls on a FastLanguageModel (GPU-only to load)
        import types

        model.for_training = types.MethodType(lambda self, **kwargs: self.train(), model)
        model.for_inference = types.MethodType(lambda self, **kwargs: self.eval(), model)
    torch.manual_seed(0)
    return get_peft_model(model, LoraConfig(target_modules=targets, **lora))


def policy(opts, load_in_4bit: bool = False):
    """The call's policy, loaded (and compiled, on its first steps) once: each call returns it with its LoRA weights
    back at their initial values, no gradients, and the forward of its first trainer's `Accelerator` removed (each
    trainer wraps it again), so that every check starts from the same model as if freshly loaded."""
    if load_in_4bit not in _POLICIES:
        model = load_policy(opts, load_in_4bit)
        initial = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
        _POLICIES[load_in_4bit] = model, initial, "forward" in vars(model), set(model.peft_config)
    model, initial, own_forward, adapters = _POLICIES[load_in_4bit]
    import torch

    for adapter in set(model.peft_config) - adapters:  # e.g. TRL 1.15's "ref" copy, which it adds once per model
        model.delete_adapter(adapter)
    model.set_adapter("default")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name in initial:
                parameter.copy_(initial[name])
            parameter.grad = None
    if not own_forward:
        vars(model).pop("forward", None)  # accelerate's mixed-precision wrapper of the last trainer
    return model


def digit_reward(completions, **kwargs):
    """The share of digits: varies within a group although every completion has the same number of tokens."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def prompts(count: int):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"{a}+{b}=" for a in range(16) for b in range(8)][:count]})


def build(opts, fields: dict | None, steps: int = 1, beta: float = BETA, load_in_4bit=False, **config):
    """A trainer on the call's policy (`policy`: as if freshly loaded): stock (`fields=None`) or ours with `fields`;
    `config` over the other config fields."""
    import trl
    from transformers import AutoTokenizer

    from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(opts.model_dir)
    length = config.pop("completion_length", opts.train_completion_length)
    common = dict(
        common_fields(opts, tokenizer, steps, beta, length),
        num_generations=8,
        optim="adamw_torch",  # Unsloth's default is adamw_8bit: the same optimizer for every host
        loss_type="dapo",
        mask_truncated_completions=False,  # Unsloth's default is True: with forced lengths every token would be masked
    )
    common.update(config)
    if fields is None:
        config_cls, trainer_cls = trl.GRPOConfig, trl.GRPOTrainer
    else:
        config_cls, trainer_cls, common = AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer, {**common, **fields}
    eval_dataset = prompts(16) if common.get("eval_strategy", "no") != "no" else None
    return trainer_cls(
        model=policy(opts, load_in_4bit),
        reward_funcs=[digit_reward],
        args=config_cls(**common),
        train_dataset=prompts(128),
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
    )


def common_fields(opts, tokenizer, steps: int, beta: float, length: int) -> dict:
    """The config fields of every trainer of the check, GRPO's and RLOO's: 8 completions a micro-batch forced to
    `length` tokens, one log line a step, nothing saved, seeded, in the call's dtype."""
    import torch

    return dict(
        output_dir=tempfile.mkdtemp(),
        beta=beta,
        max_steps=steps,
        per_device_train_batch_size=8,
        max_completion_length=length,
        # Every variant trains on as many tokens; a random model must not sample the pad token, from which Unsloth
        # rebuilds the completion mask.
        generation_kwargs={"min_new_tokens": length, "suppress_tokens": [tokenizer.pad_token_id]},
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        bf16=opts.dtype == torch.bfloat16,
        use_cpu=opts.dry_run,
    )


def perturb_kl_term(factor: float) -> None:
    """Scales our KL term by `factor` (0: dropped): a deliberate defect, which the parity check must catch."""
    import adaptive_kl.trainers.grpo as grpo_module

    term_and_sums = grpo_module.kl_term_and_sequence_sums

    def perturbed(*args, **kwargs):
        term, sums = term_and_sums(*args, **kwargs)
        return (None if term is None else term * factor), sums

    grpo_module.kl_term_and_sequence_sums = perturbed


# --- parity ---------------------------------------------------------------------------------------------------------

_PARITY_TRAINERS: dict = {}  # rows per micro-batch → (stock, ours), built once for the parity checks


def parity_trainers(opts, rows: int):
    """Unsloth's stock trainer and ours (method `none`), on the call's policy, fed micro-batches as they are."""
    if rows not in _PARITY_TRAINERS:
        config = dict(beta=PARITY_BETA, gradient_accumulation_steps=2, per_device_train_batch_size=rows)
        stock, ours = build(opts, None, **config), build(opts, {}, **config)
        if opts.perturb_kl is not None:
            perturb_kl_term({"drop": 0.0, "scale": 1.01}[opts.perturb_kl])
        for trainer in (stock, ours):
            # Micro-batches fed as they are: the host's `_prepare_inputs` would generate from them.
            trainer._prepare_inputs = lambda inputs: inputs
        _PARITY_TRAINERS[rows] = stock, ours
    return _PARITY_TRAINERS[rows]


def randomize_lora_b(model) -> None:
    """LoRA's B starts at 0, which makes every A gradient 0: a random B (the same in every parity check), so that
    every gradient is compared."""
    import torch

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                noise = torch.randn(parameter.shape, generator=generator) * 0.02
                parameter.copy_(noise.to(parameter.device, parameter.dtype))


@dataclass
class StepResult:
    """One optimizer step's loss, LoRA gradients and the gradients that arrived on Unsloth's per-token
    log-probabilities (one [B, T] tensor per micro-batch, in order)."""

    loss: object
    grads: dict
    logp_grads: list


def accumulated_step(trainer, micro_batches, beta: float | None = None) -> StepResult:
    """One optimizer step through `trainer.training_step`, with the host's β set to `beta` for it (default: as is)."""
    import torch

    from adaptive_kl.trainers.unsloth import recording_logp_gradients

    model = trainer.model
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = len(micro_batches)
    own_beta = trainer.beta
    trainer.beta = own_beta if beta is None else beta
    logp_grads = []
    try:
        with recording_logp_gradients(logp_grads):
            loss = sum(
                trainer.training_step(model, dict(batch), batch["num_items_in_batch"]).float()
                for batch in micro_batches
            )
    finally:
        trainer.beta = own_beta
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return StepResult(torch.as_tensor(loss), grads, logp_grads)


def kl_contribution_difference(ours, stock, policy_only) -> float:
    """|ours − stock| / |stock − policy_only|: ours' KL contribution against the host's, relative to its size."""
    kl = (stock - policy_only).norm().item()
    difference = (ours - stock).norm().item()
    return difference / kl if kl > 0 else (0.0 if difference == 0 else math.inf)


def flat(tensors: list):
    import torch

    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0, dtype=torch.float64)


def worst_gradient(result: StepResult, stock: StepResult, policy_only: StepResult) -> tuple[str, float]:
    """The LoRA gradient whose KL contribution differs most from stock's (relative to it), and by how much."""
    differences = {
        name: kl_contribution_difference(result.grads[name], stock.grads[name], policy_only.grads[name])
        for name in stock.grads
        if name in result.grads
    }
    worst = max(differences, key=differences.get) if differences else "none"
    return worst, differences.get(worst, math.nan)


def parity(opts, loss_type: str, completion_length: int, rows_per_micro_batch: int, micro_batches: int = 2):
    from adaptive_kl.testing.batches import grouped_inputs

    stock, ours = parity_trainers(opts, rows_per_micro_batch)
    randomize_lora_b(policy(opts))  # the one policy both trainers hold, back at its initial LoRA weights first
    for trainer in (stock, ours):
        trainer.loss_type = trainer.args.loss_type = loss_type
        level = "sequence" if loss_type == "luspo" else "token"
        trainer.importance_sampling_level = trainer.args.importance_sampling_level = level
    num_prompts = rows_per_micro_batch // stock.num_generations
    batches = [
        grouped_inputs(stock, num_prompts, completion_length, seed=seed, micro_batches=micro_batches)
        for seed in range(micro_batches)
    ]
    stock_step = accumulated_step(stock, batches)
    our_step = accumulated_step(ours, batches)
    policy_step = accumulated_step(stock, batches, beta=0.0)  # stock's loss without its KL term: what both share
    control_step = accumulated_step(stock, batches, beta=PARITY_BETA * (1 + CONTROL_STEP))

    loss_tolerance = 1e-3 if opts.dtype_name == "bfloat16" else 1e-4
    share = abs(stock_step.loss - policy_step.loss).item() / max(abs(stock_step.loss).item(), 1e-30)
    loss_difference = kl_contribution_difference(our_step.loss, stock_step.loss, policy_step.loss)
    logp_counts = [len(step.logp_grads) for step in (stock_step, our_step, policy_step)]
    logp_difference = (
        kl_contribution_difference(*(flat(step.logp_grads) for step in (our_step, stock_step, policy_step)))
        if len(set(logp_counts)) == 1 and logp_counts[0] > 0
        else math.inf
    )
    worst, lora_difference = worst_gradient(our_step, stock_step, policy_step)
    control_worst, control = worst_gradient(control_step, stock_step, policy_step)
    lora_tolerance = CONTROL_MULTIPLE * max(control, CONTROL_STEP)  # a control of 0: rounding hid its change
    compared = stock_step.grads.keys() == our_step.grads.keys() and bool(stock_step.grads)
    passed = (
        compared
        and logp_difference <= LOGP_TOLERANCE
        and loss_difference <= loss_tolerance
        and share >= 10 * loss_tolerance
        and lora_difference <= lora_tolerance
    )
    summary = (
        f"KL contribution: log-prob gradients {logp_difference:.1e} (tolerance {LOGP_TOLERANCE:g}), loss "
        f"{loss_difference:.1e}, worst LoRA gradient {lora_difference:.1e} against the control's {control:.1e}; "
        f"KL share {share:.2f}"
    )
    return Outcome(
        "PASS" if passed else "FAIL",
        summary,
        [
            f"β = {PARITY_BETA}, {loss_type}, {micro_batches} micro-batch{'es' if micro_batches > 1 else ''} of "
            f"{num_prompts} prompts × {stock.num_generations} completions of ≤ {completion_length} tokens, through "
            f"`training_step` (gradient accumulation {micro_batches}), {opts.dtype_name}.",
            "",
            "| quantity | ours − stock, relative to stock's KL contribution | tolerance |",
            "|---|---|---|",
            f"| gradient on the per-token log-probabilities ({logp_counts[1]} scorings; the criterion) "
            f"| {logp_difference:.2e} | {LOGP_TOLERANCE:g} |",
            f"| loss | {loss_difference:.2e} | {loss_tolerance:g} |",
            f"| worst LoRA gradient (`{worst}`) | {lora_difference:.2e} | {lora_tolerance:.2e} "
            f"({CONTROL_MULTIPLE:g} × the control) |",
            f"| control: stock with β·(1 + 2^-20) against stock, worst LoRA gradient (`{control_worst}`) "
            f"| {control:.2e} | (the noise floor; its true change is {CONTROL_STEP:.1e}) |",
            f"| KL share of the loss | {share:.3g} | ≥ {10 * loss_tolerance:g} |",
            f"| gradients compared | {len(stock_step.grads)} (stock {len(stock_step.grads)}, ours "
            f"{len(our_step.grads)}) | |",
            "",
            f"Unsloth's scorer paths: {scorer_paths(stock)}",
        ],
    )


def scorer_paths(trainer) -> str:
    """The markers Unsloth's scorer leaves on the model: which shapes its prefix grouper and sequence packing were
    verified on, or fell back from (the padded loop)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    seen = []
    base = getattr(model, "base_model", None)
    for module in (model, base, getattr(base, "model", None)):
        if module is None:
            continue
        for name in sorted(vars(module)):
            if name.startswith(("_unsloth_prefix_grouper", "_unsloth_seq_packing")):
                seen.append(f"{name}={getattr(module, name)!r}"[:120])
    switches = ("UNSLOTH_GRPO_PREFIX_GROUPER", "UNSLOTH_GRPO_SEQ_PACKING")
    settings = [f"{name}={os.environ.get(name, 'default')}" for name in switches]
    return f"{'; '.join(sorted(set(seen))) or 'no markers (the padded loop)'} [{', '.join(settings)}]"


def parity_check(loss_type: str):
    def check(opts) -> Outcome:
        return parity(opts, loss_type, opts.completion_length, rows_per_micro_batch=8)

    return check


def parity_long(opts) -> Outcome:
    if opts.dry_run:
        return Outcome("SKIP", "GPU only: Unsloth's offloaded log-softmax is a GPU memory path (16 × 1040 tokens)")
    return parity(opts, "dapo", OFFLOAD_LENGTH, rows_per_micro_batch=16, micro_batches=1)


# --- training -------------------------------------------------------------------------------------------------------


def logged_steps(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]


def trains(opts, fields: dict, steps: int | None = None, **config) -> tuple:
    """Trains ours with `fields`; returns the trainer, its step logs, and the problems found (empty: it trained)."""
    steps = steps or opts.steps
    trainer = build(opts, fields, steps, **config)
    trainer.train()
    logs = logged_steps(trainer)
    problems = []
    if len(logs) != steps:
        problems.append(f"{len(logs)} of {steps} steps logged")
    bad = sorted({k for h in logs for k, v in h.items() if isinstance(v, float) and not math.isfinite(v)})
    if bad:
        problems.append(f"non-finite {bad}")
    if logs and "adaptive_kl/raw_kl" not in logs[-1]:
        problems.append("no adaptive_kl/raw_kl logged")
    return trainer, logs, problems


def training_outcome(logs: list[dict], problems: list[str], *extra: str) -> Outcome:
    last = logs[-1] if logs else {}
    kl, beta = last.get("adaptive_kl/raw_kl", math.nan), last.get("adaptive_kl/current_beta", math.nan)
    summary = f"{len(logs)} steps, last KL {kl:.3g}, β {beta:.3g}"
    return Outcome("FAIL" if problems else "PASS", "; ".join([summary, *problems, *extra]))


def training_check(fields: dict):
    def check(opts) -> Outcome:
        _, logs, problems = trains(opts, fields)
        return training_outcome(logs, problems)

    return check


def beta_trajectory(opts) -> Outcome:
    """`dynamic` with reward_threshold 0 (every step's mean reward is ≥ 0) and `kl_scaling="log"`:
    β_t = β · 0.9^(t−1) · α(t), with α(1) = 1 and α(t) = 1/ln(t+1) after."""
    fields = {"kl_adaptation_method": "dynamic", "reward_threshold": 0.0, "kl_scaling": "log"}
    _, logs, problems = trains(opts, fields)
    betas = [h.get("adaptive_kl/current_beta", math.nan) for h in logs]
    expected = [BETA * 0.9 ** (t - 1) * (1.0 if t == 1 else 1.0 / math.log(t + 1)) for t in range(1, len(betas) + 1)]
    error = max((abs(b - e) / e for b, e in zip(betas, expected)), default=math.inf)
    if not error <= 1e-12:
        problems.append(f"β {betas} is not {expected} (largest relative error {error:.1e})")
    return training_outcome(logs, problems, f"β formula error {error:.1e}")


def steps_per_generation(opts) -> Outcome:
    _, logs, problems = trains(opts, {}, per_device_train_batch_size=4, steps_per_generation=2)
    return training_outcome(logs, problems)


def evaluation(opts) -> Outcome:
    trainer, logs, problems = trains(
        opts, {}, steps=2, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=8
    )
    evaluated = [h for h in trainer.state.log_history if "eval_loss" in h]
    # With or without TRL's "eval_" prefix: Unsloth's generated trainer (on TRL 1.15) logs them without it.
    keys = ("eval_adaptive_kl/raw_kl", "adaptive_kl/raw_kl")
    key = next((k for k in keys if evaluated and k in evaluated[-1]), None)
    if not evaluated:
        problems.append("no evaluation logged")
    elif not all(math.isfinite(v) for v in evaluated[-1].values() if isinstance(v, float)):
        problems.append(f"non-finite evaluation {evaluated[-1]}")
    elif key is None:
        problems.append(f"no adaptive_kl/raw_kl in the evaluation's log: {sorted(evaluated[-1])}")
    eval_kl = evaluated[-1][key] if key else math.nan
    return training_outcome(logs, problems, f"eval KL {eval_kl:.3g}")


def reference_resets(opts) -> Outcome:
    _, logs, problems = trains(opts, {"ref_reset_steps": 2})
    resets = logs[-1].get("adaptive_kl/ref_resets") if logs else None
    if resets != (opts.steps - 1) // 2:  # due after steps 2, 4, ..., applied before the next step's generation
        problems.append(f"{resets} resets logged after {opts.steps} steps, every 2")
    return training_outcome(logs, problems, f"{resets} resets")


def four_bit(opts) -> Outcome:
    if opts.dry_run:
        return Outcome("SKIP", "GPU only: bitsandbytes' 4-bit kernels need CUDA")
    _, logs, problems = trains(opts, {}, steps=3, load_in_4bit=True)
    return training_outcome(logs, problems)


# --- cost -----------------------------------------------------------------------------------------------------------


class StepTimes:
    """Times each optimizer step (with the device synchronized), as a `TrainerCallback`."""

    def __init__(self):
        from transformers import TrainerCallback

        timer = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer.start = timer.now()

            def on_step_end(self, args, state, control, **kwargs):
                timer.times.append(timer.now() - timer.start)

        self.callback, self.times, self.start = Callback(), [], 0.0

    @staticmethod
    def now() -> float:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()


def measured_run(opts, fields: dict | None) -> dict:
    """Trains one variant: median step time after `--warmup` steps, and its peak memory above what was allocated
    before it was built (on a GPU; on a CPU the process's peak resident memory after a reset)."""
    import torch

    sys.path.insert(0, HERE)
    from machine import peak_memory_mib, reset_peak_memory

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated() / 2**20
    else:
        reset_peak_memory()
        baseline = 0.0
    trainer = build(opts, fields, opts.cost_steps, completion_length=opts.completion_length)
    timer = StepTimes()
    trainer.add_callback(timer.callback)
    trainer.train()
    peak = (torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else peak_memory_mib()) - baseline
    logs = logged_steps(trainer)
    finite = all(math.isfinite(v) for h in logs for v in h.values() if isinstance(v, float))
    del trainer
    gc.collect()
    times = timer.times[opts.warmup :]
    return {"step_time": statistics.median(times), "times": times, "peak_mib": peak, "finite": finite}


WARM_UP = "warm-up (stock, not counted)"


def cost_lines(runs: list[tuple[str, dict]], stock_label: str) -> tuple[list[str], str]:
    """The table of alternated runs (label, result) against the first counted run of `stock_label`, and its summary.
    The warm-up row is shown but enters no ratio."""
    first = next(r for label, r in runs if label == stock_label)
    lines = ["| run | median step (s) | vs first stock | peak memory (MiB) | vs first stock | finite |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for label, r in runs:
        lines.append(
            f"| {label} | {r['step_time']:.4f} | {r['step_time'] / first['step_time']:.3f} | {r['peak_mib']:.0f} "
            f"| {r['peak_mib'] / max(first['peak_mib'], 1e-9):.4f} | {'yes' if r['finite'] else 'NO'} |"
        )
    ours = [r for label, r in runs if label.startswith("ours")]
    stocks = [r for label, r in runs if label == stock_label]
    time_ratio = statistics.median(r["step_time"] for r in ours) / statistics.median(r["step_time"] for r in stocks)
    noise = stocks[-1]["step_time"] / stocks[0]["step_time"]
    memory_ratio = max(r["peak_mib"] for r in ours) / max(max(r["peak_mib"] for r in stocks), 1e-9)
    memory_noise = stocks[-1]["peak_mib"] / max(stocks[0]["peak_mib"], 1e-9)
    # The interval: the timed steps of ours against those of the stock run of the same round, step by step.
    pairs = [(o["times"], s["times"]) for o, s in zip(ours, stocks)]
    interval = step_ratio_text([a for o, _ in pairs for a in o], [b for _, s in pairs for b in s])
    aa = step_ratio_text(stocks[-1]["times"], stocks[0]["times"])
    summary = f"ours/stock step time {time_ratio:.3f}, paired steps {interval} (A/A {noise:.3f}, {aa}), "
    summary += f"peak memory {memory_ratio:.4f} (A/A {memory_noise:.4f})"
    return lines, summary


def step_ratio_text(ours: list[float], stock: list[float]) -> str:
    """The paired times' geometric-mean ratio with its 95% t-interval and n (`loss_cost.ratio_interval`)."""
    sys.path.insert(0, HERE)
    from loss_cost import ratio_interval

    ratio, low, high, n = ratio_interval(ours, stock)
    return f"{ratio:.4f} (95% {low:.4f}–{high:.4f}, n={n})"


def alternated_runs(opts, stock_label: str, ours_label: str) -> list[tuple[str, dict]]:
    """Stock and ours (method `none`), alternated twice: drift of the machine falls on both, and stock against stock
    is the A/A row. A stock warm-up run comes first and is not counted: the first run in a process does some work
    once (TRL on an H200: its peak 1229 MiB above the baseline, every later run's 153 MiB, stock and ours alike),
    which would otherwise be charged to the first stock run."""
    runs = [(WARM_UP, measured_run(opts, None))]
    for round_ in (1, 2):
        runs.append((stock_label, measured_run(opts, None)))
        runs.append((f"{ours_label} ({round_})", measured_run(opts, {})))
    return runs


def cost(opts) -> Outcome:
    runs = alternated_runs(opts, UNSLOTH_STOCK, "ours, none")
    lines, summary = cost_lines(runs, UNSLOTH_STOCK)
    finite = all(r["finite"] for _, r in runs)
    timed = opts.cost_steps - opts.warmup
    head = f"{opts.cost_steps} steps a run, median of the {timed} after {opts.warmup}; β = {BETA}"
    head += f"; 8 completions of {opts.completion_length} tokens"
    return Outcome("PASS" if finite else "FAIL", summary, [head, "", *lines])


def cost_trl(opts) -> Outcome:
    """TRL's own trainer and ours on it, alternated, in a second process (TRL unpatched)."""
    path = os.path.join(tempfile.mkdtemp(), "trl.json")
    command = [sys.executable, os.path.abspath(__file__), *opts.argv, "--host", "trl", "--model-dir", opts.model_dir]
    result = subprocess.run([*command, "--json", path], capture_output=True, text=True)
    if result.returncode != 0:
        tail = result.stderr.splitlines()[-15:]
        return Outcome("FAIL", f"the TRL process exited {result.returncode}", ["```", *tail, "```"])
    with open(path) as f:
        runs = [(label, r) for label, r in json.load(f)]
    lines, summary = cost_lines(runs, TRL_STOCK)
    return Outcome("PASS" if all(r["finite"] for _, r in runs) else "FAIL", summary, lines)


def trl_process(opts) -> None:
    """The second process (`--part`): TRL's own trainer and ours on it, alternated (`cost-trl`), or the RLOO check;
    results to `--json`."""
    if opts.part == "rloo":
        rloo_process(opts)
        return
    with open(opts.json, "w") as f:
        json.dump(alternated_runs(opts, TRL_STOCK, "ours, none, on TRL"), f)


def cost_loss(opts) -> Outcome:
    """The training part alone (`benchmarks/loss_cost.py`): one micro-batch's loss forward and backward through
    Unsloth's stock trainer, the same again (the A/A) and ours (method `none`), in rotating order, `--loss-reps` times
    after a warm-up; the ratios with their 95% intervals are the verdict."""
    sys.path.insert(0, HERE)
    from loss_cost import OURS, STOCK, STOCK_AGAIN, measure, summarize

    from adaptive_kl.testing.batches import grouped_inputs

    # On Unsloth the package's term always replaces the host's: the defaults are the adaptive path, one row for both
    fields = {STOCK: None, STOCK_AGAIN: None, OURS: {}}
    trainers = {label: build(opts, f, completion_length=opts.completion_length) for label, f in fields.items()}
    for trainer in trainers.values():
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        trainer._prepare_inputs = lambda inputs: inputs  # the micro-batch as it is (no generation)
    inputs = grouped_inputs(trainers[STOCK], 1, opts.completion_length, micro_batches=1)

    def training_step(trainer, batch):  # the host's: its loss (Unsloth's, with ours added) and the backward
        trainer.training_step(trainer.model, dict(batch), batch["num_items_in_batch"])

    results = measure(trainers, inputs, opts.loss_reps, warmup=3, run=training_step)
    lines = summarize(results)
    finite = all(math.isfinite(v) for r in results.values() for values in r.values() for v in values)
    ours, aa = (line.split(" | ") for line in lines[2:4])
    summary = f"ours/stock {ours[2].strip('*')} (95% {ours[3]}, ±{ours[4]}%, n={ours[1]}); "
    summary += f"A/A {aa[2].strip('*')} (95% {aa[3]}); memory {ours[7].rstrip(' |')} MiB"
    head = (
        f"one micro-batch of 8 completions of {opts.completion_length} tokens, loss forward and backward; β = {BETA}"
    )
    return Outcome("PASS" if finite else "FAIL", summary, [head, "", *lines])


def zero_beta(opts) -> Outcome:
    """β reaches 0 mid-run (`dynamic`, `beta_schedule_steps`, `beta_min=0`, `kl_monitor_steps=0`): from then on the
    reference forward is skipped; its steps after the switch against stock TRL (Unsloth's) at β = 0, alternated."""
    switch = max(2, opts.cost_steps // 2)
    fields = {"kl_adaptation_method": "dynamic", "beta_schedule_steps": switch, "beta_min": 0.0, "kl_monitor_steps": 0}
    runs = []
    for _ in (1, 2):
        runs.append(("stock, β = 0", zero_beta_run(opts, None, 0.0)))
        runs.append(("ours, β → 0", zero_beta_run(opts, fields, BETA)))
    stock = [r for label, r in runs if label.startswith("stock")]
    ours = [r for label, r in runs if label.startswith("ours")]
    after = slice(switch - 1, None)  # 0-based: the steps from the switch on
    ratio = step_ratio_text(
        [t for r in ours for t in r["times"][after]], [t for r in stock for t in r["times"][after]]
    )
    skipped = [r["skipped"] for r in ours]
    problems = [] if all(all(s[after]) and not any(s[: switch - 1]) for s in skipped) else [f"skipped {skipped}"]
    problems += [] if all(r["finite"] for _, r in runs) else ["non-finite logs"]
    lines = ["| run | step times (s) | peak memory (MiB) | reference skipped by step |", "|---|---|---|---|"]
    for label, r in runs:
        times = ", ".join(f"{t:.3f}" for t in r["times"])
        lines.append(f"| {label} | {times} | {r['peak_mib']:.0f} | {r['skipped']} |")
    memory = statistics.fmean(r["peak_mib"] for r in ours) - statistics.fmean(r["peak_mib"] for r in stock)
    memory_text = f"{memory:+.0f} MiB" if math.isfinite(memory) else "n/a (GPU only)"
    summary = f"after the switch (step {switch}) ours/stock at β = 0 {ratio}; peak memory ours − stock {memory_text}"
    return Outcome("FAIL" if problems else "PASS", summary + "".join(f"; {p}" for p in problems), lines)


def zero_beta_run(opts, fields: dict | None, beta: float) -> dict:
    """One run of `zero_beta`: every step's time, whether it skipped the reference, and the peak memory."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer = build(opts, fields, opts.cost_steps, beta=beta, completion_length=opts.completion_length)
    timer = StepTimes()
    trainer.add_callback(timer.callback)
    trainer.train()
    logs = logged_steps(trainer)
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else math.nan
    finite = all(math.isfinite(v) for h in logs for v in h.values() if isinstance(v, float))
    skipped = [h.get("adaptive_kl/reference_skipped", 0.0) == 1.0 for h in logs]
    return {"times": timer.times, "peak_mib": peak, "finite": finite, "skipped": skipped}


def notebook(opts) -> Outcome:
    """The quickstart notebook's code cells, top to bottom, as one script in a fresh process (Unsloth's cells on a
    GPU, on the call's model: `ADAPTIVE_KL_NOTEBOOK_MODEL`), 2 training steps: it must end without an error and
    print the validation accuracy."""
    path = os.path.join(os.path.dirname(HERE), "notebooks", "quickstart.ipynb")
    with open(path) as f:
        cells = json.load(f)["cells"]
    code = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    script = os.path.join(tempfile.mkdtemp(), "quickstart.py")
    with open(script, "w") as f:
        f.write(code)
    env = dict(os.environ, ADAPTIVE_KL_NOTEBOOK_STEPS="2", ADAPTIVE_KL_NOTEBOOK_MODEL=opts.model_dir, MPLBACKEND="Agg")
    result = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, env=env, cwd=os.path.dirname(script), timeout=420
    )
    backend = next((line for line in result.stdout.splitlines() if line.startswith("backend:")), "backend: ?")
    accuracy = next((line for line in result.stdout.splitlines() if line.startswith("validation accuracy")), None)
    if result.returncode != 0 or accuracy is None:
        tail = (result.stderr or result.stdout).splitlines()[-15:]
        return Outcome("FAIL", f"{backend}; exit {result.returncode}", ["```", *tail, "```"])
    return Outcome("PASS", f"{backend}; {accuracy}", [f"- {backend}", f"- {accuracy}"])


# --- RLOO: TRL's own RLOOTrainer, in the TRL process (Unsloth does not support RLOO) -------------------------------


def rloo(opts) -> Outcome:
    """`AdaptiveKLRLOOTrainer` on TRL's `RLOOTrainer`, in a second process: parity of the advantages at the defaults
    (the same generation batch scored by stock with β, ours, and stock at β = 0 and at β·(1 + 2^-20): ours' KL
    contribution against stock's, relative, and the control's), then 3 training steps of `clip+dynamic`."""
    path = os.path.join(tempfile.mkdtemp(), "rloo.json")
    command = [sys.executable, os.path.abspath(__file__), *opts.argv, "--host", "trl", "--part", "rloo"]
    result = subprocess.run([*command, "--model-dir", opts.model_dir, "--json", path], capture_output=True, text=True)
    if result.returncode != 0:
        tail = result.stderr.splitlines()[-15:]
        return Outcome("FAIL", f"the TRL process exited {result.returncode}", ["```", *tail, "```"])
    with open(path) as f:
        found = json.load(f)
    problems = list(found["problems"])
    if not found["difference"] <= RLOO_TOLERANCE:
        problems.append(f"the KL contribution differs by {found['difference']:.2e} > {RLOO_TOLERANCE:g}")
    summary = f"advantages' KL contribution differs by {found['difference']:.2e} (control {found['control']:.2e}, "
    summary += f"expected {CONTROL_STEP:.1e}); clip+dynamic trained {found['steps']} steps, β {found['beta']}"
    lines = [f"- {key}: {value}" for key, value in found.items()]
    return Outcome("FAIL" if problems else "PASS", summary + "".join(f"; {p}" for p in problems), lines)


RLOO_TOLERANCE = 1e-3  # relative to the KL contribution; a penalty ×1.01 reads 1e-2


def build_rloo(opts, fields: dict | None, beta: float = BETA, steps: int = 1):
    """An RLOO trainer on the call's policy (PEFT's LoRA, TRL unpatched): stock (`fields=None`) or ours."""
    from transformers import AutoTokenizer
    from trl import RLOOConfig, RLOOTrainer

    from adaptive_kl import AdaptiveKLRLOOConfig, AdaptiveKLRLOOTrainer

    tokenizer = AutoTokenizer.from_pretrained(opts.model_dir)
    common = dict(common_fields(opts, tokenizer, steps, beta, opts.train_completion_length), num_generations=4)
    config_cls, trainer_cls = (
        (RLOOConfig, RLOOTrainer) if fields is None else (AdaptiveKLRLOOConfig, AdaptiveKLRLOOTrainer)
    )
    return trainer_cls(
        model=policy(opts),
        reward_funcs=[digit_reward],
        args=config_cls(**common, **(fields or {})),
        train_dataset=prompts(128),
        processing_class=tokenizer,
    )


def rloo_process(opts) -> None:
    """The second process's RLOO part: the parity of one generation batch's advantages, and a short training run;
    results to `--json`."""
    import torch

    inputs = [{"prompt": p} for p in prompts(2)["prompt"] for _ in range(4)]
    scored = {}
    for name, fields, beta in (
        ("stock", None, BETA),
        ("ours", {}, BETA),
        ("stock, β = 0", None, 0.0),
        ("stock, control", None, BETA * (1 + CONTROL_STEP)),
    ):
        trainer = build_rloo(opts, fields, beta)
        randomize_lora_b(trainer.model)  # the policy away from its reference (the adapter disabled): a KL to compare
        trainer.model.train()
        torch.manual_seed(0)
        output = trainer._generate_and_score_completions(inputs)
        scored[name] = (output["completion_ids"].cpu(), output["advantages"].double().cpu())
        del trainer
    problems = []
    if any(not torch.equal(ids, scored["stock"][0]) for ids, _ in scored.values()):
        problems.append("the trainers sampled different completions: nothing to compare")
    stock, zero = scored["stock"][1], scored["stock, β = 0"][1]
    contribution = (stock - zero).norm().item()
    if not contribution > 0:
        problems.append("stock's penalty changed no advantage: nothing to compare")

    def relative(name: str) -> float:
        return (scored[name][1] - stock).norm().item() / max(contribution, 1e-30)

    trainer = build_rloo(opts, {"kl_adaptation_method": "clip+dynamic", "reward_threshold": 0.0}, steps=3)
    trainer.train()
    logs = logged_steps(trainer)
    bad = sorted({k for h in logs for k, v in h.items() if isinstance(v, float) and not math.isfinite(v)})
    problems += [f"non-finite {bad}"] if bad else []
    problems += [] if logs and "adaptive_kl/raw_kl" in logs[-1] else ["no adaptive_kl/raw_kl logged"]
    beta = logs[-1].get("adaptive_kl/current_beta") if logs else None
    found = {"difference": relative("ours"), "control": relative("stock, control"), "contribution": contribution,
             "steps": len(logs), "beta": beta, "problems": problems}  # fmt: skip
    with open(opts.json, "w") as f:
        json.dump(found, f)


# --- the call -------------------------------------------------------------------------------------------------------

# The order is the priority under a budget cut: parity, one method training, the cost of the training part, the paths
# no GPU has run (RLOO, the zero-β skip, the notebook), then the rest.
CHECKS = {
    **{f"parity-{loss_type}": parity_check(loss_type) for loss_type in LOSS_TYPES},
    "train-none": training_check(TRAINING["train-none"]),
    "cost-loss": cost_loss,
    "rloo": rloo,
    "zero-beta": zero_beta,
    "notebook": notebook,
    "cost": cost,
    "parity-long": parity_long,
    **{name: training_check(fields) for name, fields in TRAINING.items() if name != "train-none"},
    "beta-trajectory": beta_trajectory,
    "steps-per-generation": steps_per_generation,
    "evaluation": evaluation,
    "reference-resets": reference_resets,
    "4bit": four_bit,
    "cost-trl": cost_trl,
}
SECOND_CALL = ["cost-trl"]  # left out of the default call (TRL's own trainer, a second process): `--only cost-trl`


def names(value: str) -> list[str]:
    chosen = [name for name in value.split(",") if name]
    unknown = [n for n in chosen if not any(selected(check, [n]) for check in CHECKS)]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown check(s) {unknown}; choose from {list(CHECKS)} or their prefixes")
    return chosen


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--dry-run", action="store_true", help="the same path on a CPU, tiny model")
    parser.add_argument(
        "--dtype", choices=DTYPES, help="the model's and the training's precision (default: bfloat16; float32 dry)"
    )
    parser.add_argument(
        "--budget", type=float, default=480.0, help="seconds after the script started from which no check starts (480)"
    )
    parser.add_argument("--only", type=names, default=[], help="comma-separated checks (or prefixes) to run")
    parser.add_argument(
        "--skip",
        type=names,
        default=None,
        help=f"comma-separated checks (or prefixes) to leave out (default: {','.join(SECOND_CALL)}, the second "
        "call, unless --only is given; --skip= leaves out none)",
    )
    parser.add_argument("--steps", type=int, help="optimizer steps of each training check (default: 3)")
    parser.add_argument("--cost-steps", type=int, help="optimizer steps of each timed run (default: 7; 3 dry)")
    parser.add_argument("--warmup", type=int, help="first steps left out of the median (default: 1)")
    parser.add_argument(
        "--completion-length", type=int, help="tokens per completion of parity and cost (default: 64; 8 dry)"
    )
    parser.add_argument(
        "--train-completion-length", type=int, help="tokens per completion of the training checks (default: 16; 8 dry)"
    )
    parser.add_argument("--output", help="the report (markdown), appended to as checks end")
    parser.add_argument("--perturb-kl", choices=["drop", "scale"], help=argparse.SUPPRESS)  # for the tests
    parser.add_argument("--loss-reps", type=int, help="repetitions of cost-loss's loss passes (default: 30; 4 dry)")
    parser.add_argument("--host", choices=["unsloth", "trl"], default="unsloth", help=argparse.SUPPRESS)
    parser.add_argument("--part", choices=["cost", "rloo"], default="cost", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)  # the TRL process's results
    opts = parser.parse_args(argv)
    opts.steps = opts.steps or 3
    opts.loss_reps = opts.loss_reps or (4 if opts.dry_run else 30)
    opts.cost_steps = opts.cost_steps or (3 if opts.dry_run else 7)
    opts.warmup = opts.warmup if opts.warmup is not None else 1
    opts.completion_length = opts.completion_length or (8 if opts.dry_run else 64)
    opts.train_completion_length = opts.train_completion_length or (8 if opts.dry_run else 16)
    opts.dtype_name = opts.dtype or ("float32" if opts.dry_run else "bfloat16")
    if opts.skip is None:
        opts.skip = [] if opts.only else list(SECOND_CALL)
    if opts.warmup >= opts.cost_steps:
        parser.error(f"--warmup ({opts.warmup}) must be smaller than --cost-steps ({opts.cost_steps}).")
    return opts


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = parse_args(argv)
    opts.argv = list(argv)  # the TRL process gets the same settings
    try:
        header = preflight(opts)
    except (Exception, SystemExit) as error:  # e.g. `import unsloth` refusing a machine without a GPU
        reason = str(error) if isinstance(error, SystemExit) else f"{type(error).__name__}: {error}"
        emit(f"{PREFIX} preflight: FAIL {reason}", opts.output)
        return 2
    import torch

    opts.dtype = getattr(torch, opts.dtype_name)
    if opts.host == "trl":
        trl_process(opts)
        return 0
    from adaptive_kl.metrics.environment import environment_lines
    from adaptive_kl.testing.tiny_model import save_random_model

    shape = "tiny" if opts.dry_run else "qwen2.5-0.5b"
    opts.model_dir = save_random_model(tempfile.mkdtemp(), shape, opts.dtype)
    command = " ".join(["bash", "benchmarks/gpu_check.sh", *argv])
    lines = [
        "# GPU check",
        "",
        *environment_lines(command),
        *header,
        f"- settings: {shape} shape, random weights, {opts.dtype_name}, LoRA r=16 on every linear layer, batch 8 × "
        f"{opts.completion_length} completion tokens (parity, cost), {opts.steps} steps of "
        f"{opts.train_completion_length} tokens per training check, budget {opts.budget:g} s",
        "",
    ]
    print("\n".join(lines), flush=True)
    if opts.output:
        with open(opts.output, "w") as f:
            f.write("\n".join(lines))
    outcomes = run_checks(CHECKS, opts, opts.output, started=SCRIPT_START)
    return 1 if any(o.status == "FAIL" for o in outcomes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
