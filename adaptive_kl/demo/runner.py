"""Runs variants of `AdaptiveKLGRPOTrainer` on one task with the same seed and budget, and records what they did.

Each run logs every step (TRL's metrics and `adaptive_kl/*`), evaluates greedy validation accuracy at step 0 and
every `eval_every` steps, and, where the task has reference solutions, their log-likelihood (`retention/*`) on the
same schedule (on the chat task also the starting policy's own answers to general chat prompts, `general/*`:
`tasks.general`); a `KLHealthCallback` warns when the mean KL leaves the 0.01–0.2 band. A variant's `trainer` override
picks the trainer: `"grpo"` (`AdaptiveKLGRPOTrainer`, the default), `"rloo"` (`AdaptiveKLRLOOTrainer`, the KL as a
penalty in the reward) or `"binomial_kl"` (`BinomialKLTrainer`). On the embedded default everything runs on a CPU in
minutes; with `model` set to a hub id or local path (and optionally `unsloth`, GRPO only), the same code trains a real
model on a GPU.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import time
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer, TrainerCallback
from transformers.trainer_callback import PrinterCallback

from ..tasks import TASK_REWARDS, load_gsm8k, score_completions, working_similarity_reward
from ..tasks.chat import chat_datasets
from ..tasks.general import general_chat_prompts, own_answers_dataset
from ..tasks.policies import resolve_policy
from ..tasks.recipe import held_out_reward, resolve_reward_func, train_and_held_out
from ..trainers.callbacks import KLHealthCallback, RetentionCallback
from ..trainers.generation import generate, prompt_texts
from ..trainers.scorer import install_cpu_scorer_if_needed
from .arguments import run_setup
from .budgets import HUB_LORA, HUB_LORA_LEARNING_RATE, HUB_MODEL, POLICY_DEMOS
from .embedded import EMBEDDED_TASK, embedded_datasets, embedded_policy_path
from .resume import RunRecord, latest_checkpoint
from .variants import TRAINER_CLASSES, Variant


# Instruction given to real (chat) models, which have never seen the embedded task's answer format.
INSTRUCTION = "Solve the math problem. Show your working briefly, then give the final answer after '####'."


@dataclass
class DemoSettings:
    """What every variant of a comparison shares: model, task, budget, seed and output directory."""

    out: str = "adaptive-kl-demo"
    model: str | None = None  # None: the embedded reference policy; a named policy (`tasks.policies`), hub id or path
    unsloth: bool = False
    task: str = "embedded"  # or "chat" (conversations, for chat models), "gsm8k", or "dataset" (the user's own)
    gsm8k_path: str = "openai/gsm8k"
    # The task "dataset" (`tasks.recipe`): the user's prompts (a local path or hub id), splits and reward functions
    dataset: str | None = None
    dataset_train_split: str = "train"
    dataset_test_split: str = "test"
    reward_funcs: tuple[str, ...] = ()
    steps: int = 200
    eval_every: int = 20
    n_validation: int = EMBEDDED_TASK["n_validation"]
    seed: int = 0
    fixed: dict = field(default_factory=dict)  # config fields set for every variant
    save_every: int | None = None  # checkpoint every this many optimizer steps (the latest kept); None: no checkpoints
    resume: bool = False  # continue each variant from the latest complete checkpoint in its output directory
    graded_reward: bool = False  # add `working_similarity_reward` to the task's (`--quick` on a real model)
    # The LoRA the command line asked for (`--lora`: {} for the defaults, or some of `r`, `lora_alpha`,
    # `target_modules`); None: none asked for
    lora: dict | None = None
    # What every run is trained with, as its command line gave it (`arguments.shared_setup`): each run records it,
    # with its variant and seed, in its checkpoints and runs.json, so that a rerun reuses only runs of its own setup
    setup: dict = field(default_factory=dict)

    @property
    def policy_demo(self) -> dict | None:
        """The named policy's demo budget (`budgets.POLICY_DEMOS`), or None."""
        return POLICY_DEMOS.get(self.model) if self.model is not None and not self.unsloth else None

    @property
    def adapter(self) -> dict | None:
        """The LoRA adapter the runs train (`r`, `lora_alpha`, `target_modules`), or None: the whole model. A named
        policy's demo and Unsloth always train one, a hub model with `--lora`; the command line's values override
        the named policy's or `budgets.HUB_LORA`."""
        if self.lora is None and self.policy_demo is None and not self.unsloth:
            return None
        return {**(HUB_LORA if self.policy_demo is None else self.policy_demo["lora"]), **(self.lora or {})}


def for_model(settings: DemoSettings) -> DemoSettings:
    """`settings` with a named policy's task and budget (steps, evaluation schedule, validation size)."""
    demo = settings.policy_demo
    if demo is None:
        return settings
    return dataclasses.replace(
        settings,
        task=demo["task"],
        steps=demo["steps"],
        eval_every=demo["eval_every"],
        n_validation=demo["n_validation"],
    )


def base_config(settings: DemoSettings) -> dict:
    """Config fields of every run before the variant's overrides: tuned for the embedded policy on a CPU, or for a
    real model on a GPU (`budgets.HUB_MODEL`: full fine-tuning, or a LoRA at a larger learning rate)."""
    on_gpu = torch.cuda.is_available()
    # `--save-every`: a checkpoint every so many steps, only the latest kept.
    saving = dict(save_strategy="no")
    if settings.save_every is not None:
        saving = dict(save_strategy="steps", save_steps=settings.save_every, save_total_limit=1)
    common = dict(
        max_steps=settings.steps,
        seed=settings.seed,
        data_seed=settings.seed,
        logging_steps=1,
        **saving,
        report_to="none",
        disable_tqdm=True,
        lr_scheduler_type="constant",
        warmup_steps=0,
    )
    if settings.model is None:  # the embedded policy
        return dict(
            common,
            # 1e-4: updates large enough for the KL to matter (β = 0 then drifts and forgets measurably more than
            # β = 0.1; docs/studies/beta), small enough that RL still improves validation accuracy.
            learning_rate=1e-4,
            per_device_train_batch_size=32,
            num_generations=8,
            max_completion_length=EMBEDDED_TASK["max_new_tokens"],
            temperature=1.0,
            gradient_checkpointing=False,  # on by default in TRL; on a 0.6M-parameter model it only costs time
            use_cpu=not on_gpu,
            bf16=on_gpu,
        )
    # Native bf16 only (a T4 emulates it, and Unsloth then loads the model in fp16). On a CPU, float32: TRL keeps its
    # bf16=True default there, which emulates bf16 on CPUs without it (a 135M LoRA step took 143 s instead of 10 s).
    bf16 = on_gpu and torch.cuda.is_bf16_supported(including_emulation=False)
    if settings.policy_demo is not None:  # its own fields come after the trainer's defaults (`make_config`)
        return dict(common, bf16=bf16, fp16=on_gpu and not bf16, use_cpu=not on_gpu)
    hub = dict(common, **HUB_MODEL, bf16=bf16, fp16=on_gpu and not bf16, use_cpu=not on_gpu)
    if settings.adapter is not None:  # a LoRA trains at a larger learning rate
        hub["learning_rate"] = HUB_LORA_LEARNING_RATE
    return hub


# Fields of each trainer's config on top of `base_config`.
TRAINER_DEFAULTS = {
    "grpo": dict(
        beta=0.1,
        # dynamic: β decays once the mean task reward (format + accuracy, at most 2) reaches this level.
        reward_threshold=1.4,
        dynamic_beta_decay=0.95,
    ),
    # RLOO: GRPO's β and `dynamic` settings, so that a GRPO–RLOO comparison differs in where the KL goes (RLOO: k1
    # summed over the completion, in the reward) and not in β. `dynamic` reads the same task reward there (TRL's
    # `reward`, before the penalty), so its threshold keeps its meaning.
    "rloo": dict(beta=0.1, reward_threshold=1.4, dynamic_beta_decay=0.95),
    # The study trains on correct completions only: the task reward is 2 exactly when the answer is right.
    "binomial_kl": dict(correct_reward_threshold=1.5),
}
DYNAMIC_BETA_MIN = 0.004


def variant_trainer(variant: Variant, settings: DemoSettings) -> str:
    """The trainer a variant runs: its `trainer` override, else the command's (`--trainer`, or `--set trainer=...`),
    else `"grpo"`."""
    return variant.overrides.get("trainer", settings.fixed.get("trainer", "grpo"))


def trainer_classes(name: str) -> tuple[type, type]:
    """`(config class, trainer class)` of a trainer name of `TRAINER_CLASSES`."""
    module, config_name, trainer_name = TRAINER_CLASSES[name]
    module = importlib.import_module(module, __package__)
    return getattr(module, config_name), getattr(module, trainer_name)


def make_config(variant: Variant, settings: DemoSettings, output_dir: str):
    """The variant's config: `base_config` and its trainer's defaults, then `settings.fixed`, then the variant's
    overrides (invalid ones raise, as do fields its trainer's config does not have).

    A variant that sets `seed` also draws its data with it, unless it sets `data_seed` too."""
    trainer = variant_trainer(variant, settings)
    config_cls, _ = trainer_classes(trainer)
    known = {f.name for f in dataclasses.fields(config_cls)}
    # GRPO's and RLOO's configs share the KL adaptation's fields: the policy budget's KL fields, β floor and
    # unread-field filtering below are theirs (the binomial-KL config has none of those fields).
    adaptive = "kl_adaptation_method" in known
    chosen = {k: v for k, v in {**settings.fixed, **variant.overrides}.items() if k != "trainer"}
    demo = settings.policy_demo
    policy = {} if demo is None else {**demo["config"], **(demo["kl_config"] if adaptive else {})}
    fields = {**base_config(settings), **TRAINER_DEFAULTS[trainer], **policy, **chosen}
    if "seed" in variant.overrides and "data_seed" not in variant.overrides:
        fields["data_seed"] = variant.overrides["seed"]
    if adaptive and "beta_min" not in chosen:
        fields["beta_min"] = min(DYNAMIC_BETA_MIN, fields["beta"])  # a floor for `dynamic`, never above β
    foreign = sorted(set(chosen) - known)
    if foreign:
        raise ValueError(foreign_fields_message(foreign, trainer, config_cls))
    if adaptive:  # the shared defaults of one method (dynamic's threshold, ...) are left out of the others
        from ..trainers.kl_fields import unread_parameters

        unread = set(unread_parameters(fields, config_cls)) - set(chosen)
        fields = {name: value for name, value in fields.items() if name not in unread}
    return config_cls(output_dir=output_dir, **fields)


def foreign_fields_message(names: list[str], trainer: str, config_cls: type) -> str:
    """Why the config of `trainer` refuses the fields `names`: for RLOO, the fields of GRPO's config that it lacks
    are said to be GRPO-only, with the reason (`rloo_config.GRPO_ONLY_FIELDS`, else TRL's RLOOConfig lacks them)."""
    if trainer == "rloo":
        from ..trainers.config import AdaptiveKLGRPOConfig
        from ..trainers.rloo_config import GRPO_ONLY_FIELDS

        grpo_fields = {f.name for f in dataclasses.fields(AdaptiveKLGRPOConfig)}
        grpo_only = [name for name in names if name in grpo_fields]
        if grpo_only:
            reasons = {name: GRPO_ONLY_FIELDS.get(name, "TRL's RLOOConfig has no such field") for name in grpo_only}
            if len(grpo_only) == 1:
                return (
                    f"{grpo_only[0]} is GRPO-only ({reasons[grpo_only[0]]}): {config_cls.__name__} does not take it; "
                    "drop it, or use --trainer grpo"
                )
            why = "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
            return (
                f"{', '.join(grpo_only)} are GRPO-only ({why}): {config_cls.__name__} does not take them; drop "
                "them, or use --trainer grpo"
            )
    return f"{', '.join(names)} is not a field of {config_cls.__name__} (trainer={trainer!r})"


def task_datasets(settings: DemoSettings, n_train: int, seed: int):
    """Train and validation datasets (columns `prompt`, `answer`; the task `dataset`: the user's columns) of the
    settings' task; `seed` draws the embedded task's train problems (its validation problems never change)."""
    if settings.task == "dataset":  # the user's prompts as they are, part held out (`tasks.recipe`)
        return train_and_held_out(
            settings.dataset, settings.dataset_train_split, settings.dataset_test_split, settings.n_validation
        )
    if settings.task == "gsm8k":
        train = load_gsm8k("train", settings.gsm8k_path, limit=n_train)
        validation = load_gsm8k("test", settings.gsm8k_path, limit=settings.n_validation)
    elif settings.task == "chat":  # conversations: the instruction is part of the user message
        return chat_datasets(n_train, settings.n_validation, seed=seed)
    else:
        train, validation = embedded_datasets(n_train, settings.n_validation, seed=seed)
    if settings.model is not None:
        # A real model is told the answer format; the embedded policy was trained on the bare "Q: ... A: " prompt.
        train, validation = (
            d.map(lambda row: {"prompt": f"{INSTRUCTION}\n{row['prompt']}"}) for d in (train, validation)
        )
    return train, validation


def load_policy(settings: DemoSettings):
    """`(model, tokenizer)`: a path for TRL to load (plain TRL), or an Unsloth LoRA model (`settings.unsloth`)."""
    path = embedded_policy_path() if settings.model is None else resolve_policy(settings.model)
    if not settings.unsloth:
        return path, AutoTokenizer.from_pretrained(path)
    from unsloth import FastLanguageModel  # noqa: F401  (imported first, as Unsloth requires; checked by the CLI)

    model, tokenizer = FastLanguageModel.from_pretrained(path, max_seq_length=1024, load_in_4bit=True)
    model = FastLanguageModel.get_peft_model(model, **settings.adapter, random_state=settings.seed)
    return model, tokenizer


class ValidationCallback(TrainerCallback):
    """Evaluates greedy validation accuracy before the first step and every `eval_every` steps (and at the end), and
    keeps what the policy wrote for the first `n_samples` validation problems at each evaluation: its greedy answer
    and one sampled at temperature 1 (seeded by `sample_seed` and the step; the training's random state is not
    touched), so that a run's numbers can be read against its text.

    Given `reward_funcs` (the task `dataset`, whose rows need not have an `answer`), it scores the greedy answers with
    them instead, weighted by `reward_weights` as the trainer weights them: `val_reward`, their mean total reward, and
    `val_completion_length`."""

    def __init__(
        self,
        tokenizer,
        validation,
        eval_every: int,
        max_new_tokens: int,
        n_samples: int = 4,
        sample_seed: int = 0,
        reward_funcs: list | None = None,
        reward_weights: list[float] | None = None,
    ):
        self.tokenizer, self.validation = tokenizer, validation
        self.eval_every, self.max_new_tokens = eval_every, max_new_tokens
        self.n_samples, self.sample_seed = n_samples, sample_seed
        self.reward_funcs, self.reward_weights = reward_funcs, reward_weights
        self.evaluations: list[dict] = []
        self.samples: list[dict] = []

    def _scores(self, greedy: list[str]) -> dict[str, float]:
        if self.reward_funcs is None:
            return score_completions(greedy, self.validation["answer"])
        rows = self.validation.to_list()
        rewards = held_out_reward(self.reward_funcs, self.tokenizer, rows, greedy, self.reward_weights)
        scored = [reward for reward in rewards if not math.isnan(reward)]
        return {
            "reward": sum(scored) / len(scored) if scored else math.nan,
            "completion_length": sum(len(c) for c in greedy) / max(len(greedy), 1),
        }

    def _evaluate(self, step: int, model) -> None:
        if self.evaluations and self.evaluations[-1]["step"] == step:
            return
        prompts = self.validation["prompt"]
        answers = self.validation["answer"] if "answer" in self.validation.column_names else [""] * len(prompts)
        greedy = generate(model, self.tokenizer, prompts, self.max_new_tokens)
        scores = self._scores(greedy)
        self.evaluations.append({"step": step, **{f"val_{k}": v for k, v in scores.items()}})
        n = min(self.n_samples, len(prompts))
        if n:
            sampled = generate(
                model, self.tokenizer, prompts[:n], self.max_new_tokens, seed=self.sample_seed * 100_003 + step
            )
            for prompt, answer, greedy_text, sampled_text in zip(prompts[:n], answers[:n], greedy, sampled):
                question = prompt[-1]["content"] if not isinstance(prompt, str) else prompt
                self.samples.append(
                    {
                        "step": step,
                        "prompt": question,
                        "answer": answer,
                        "greedy": greedy_text,
                        "sampled": sampled_text,
                    }
                )

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not self.evaluations:  # a resumed run has its evaluations up to the checkpoint (`RunRecord`)
            self._evaluate(state.global_step, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.eval_every == 0 or state.global_step >= state.max_steps:
            self._evaluate(state.global_step, model)


@dataclass(eq=False)
class VariantProgressCallback(TrainerCallback):
    """Advances a shared progress bar by one per optimizer step, showing the variant, reward and β; where no bar is
    drawn (`--no-progress`, or output that is not a terminal), prints `step <k>/<max_steps>` at each step's end
    instead, the line by which `adaptive-kl frontier` times its runs (`frontier_command.SweepClock`)."""

    bar: object  # a tqdm bar, or None
    variant: str

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is not None and logs and "reward" in logs:
            beta = logs.get("adaptive_kl/current_beta", args.beta)
            self.bar.set_postfix_str(f"{self.variant}: reward {logs['reward']:.2f}, β {beta:.3g}", refresh=False)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is None:
            return
        self.bar.update(1)
        if self.bar.disable and state.is_world_process_zero:
            print(f"step {state.global_step}/{state.max_steps}", flush=True)


@dataclass
class VariantRun:
    """What one variant did: its β and overrides, per-step logs, validation evaluations, and wall time (training and
    its evaluations)."""

    name: str
    config: dict
    history: list[dict]
    evaluations: list[dict]
    wall_time: float
    retention: list[dict] = field(default_factory=list)  # `retention/*`, `general/*` at step 0 and every `eval_every`
    kl_warnings: list[dict] = field(default_factory=list)  # the KL-band episodes `KLHealthCallback` warned about
    # What the policy wrote at each evaluation for the first validation problems: step, prompt, answer, greedy, sampled
    samples: list[dict] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)  # the steps it was resumed at from a checkpoint (`--resume`)
    # Where it ran (`command.provenance`): seed, the command line, the package's commit, versions and device; empty in
    # runs saved before it was recorded
    provenance: dict = field(default_factory=dict)


def run_variant(variant: Variant, settings: DemoSettings, bar=None) -> VariantRun:
    """Trains one variant from the same starting policy, seed and data as every other variant."""
    args = make_config(variant, settings, variant_output_dir(settings.out, variant.name))
    install_cpu_scorer_if_needed("cpu" if args.use_cpu else None)  # TRL 1.15's fused scorer: a GPU, or a stand-in
    model, tokenizer = load_policy(settings)
    demo = settings.policy_demo
    # Unsloth's model is its LoRA model already (`load_policy`); TRL wraps any other in the adapter
    peft_config = (
        None if settings.adapter is None or settings.unsloth else LoraConfig(task_type="CAUSAL_LM", **settings.adapter)
    )
    prompts_needed = args.max_steps * args.per_device_train_batch_size * args.gradient_accumulation_steps
    train, validation = task_datasets(settings, prompts_needed // args.num_generations + 1, args.seed)
    if settings.model is None:  # the embedded policy
        max_new_tokens = EMBEDDED_TASK["max_new_tokens"]
    else:
        max_new_tokens = demo["max_new_tokens"] if demo is not None else args.max_completion_length
    if settings.task == "dataset":  # the reward functions `--reward-funcs` names
        rewards = [resolve_reward_func(spec) for spec in settings.reward_funcs]
    else:  # the task's, and the graded one when the settings ask for it where the task has reference workings
        graded = settings.graded_reward and "solution" in train.column_names
        rewards = [*TASK_REWARDS, *([working_similarity_reward] if graded else [])]
    validation_callback = ValidationCallback(
        tokenizer,
        validation,
        settings.eval_every,
        max_new_tokens,
        sample_seed=args.seed,
        reward_funcs=rewards if settings.task == "dataset" else None,
        reward_weights=args.reward_weights,
    )
    kl_health = KLHealthCallback()
    drift_controlled = getattr(args, "kl_controller", "fixed") == "drift"  # the binomial-KL config has no controller
    solutions = None  # the held-out reference solutions, where the task has them
    if "solution" in validation.column_names:
        # After their prompts rendered as the trainer renders them for generation (`prompt_texts`: a conversation's
        # chat template ends with the assistant's prompt).
        texts, _ = prompt_texts(tokenizer, validation["prompt"])
        solutions = Dataset.from_dict({"prompt": texts, "completion": validation["solution"]})
    start = time.perf_counter()
    _, trainer_cls = trainer_classes(variant_trainer(variant, settings))
    trainer = trainer_cls(
        model=model,
        processing_class=tokenizer,
        reward_funcs=rewards,
        args=args,
        train_dataset=train,
        # The drift controller measures on the texts the frontier's drift is read on (the user's held-out prompts:
        # the trainer scores the starting policy's answers to them, as `own_answers_dataset` does)
        eval_dataset=(validation if solutions is None else solutions) if drift_controlled else None,
        peft_config=peft_config,
        callbacks=[validation_callback, kl_health, VariantProgressCallback(bar, variant.name)],
    )
    trainer.remove_callback(PrinterCallback)  # the shared progress bar replaces per-step log dicts on stdout
    # A real model's vocabulary is large: smaller batches keep the (batch, length, vocabulary) logits small.
    batch_size = 64 if demo is None else 16
    # The starting policy (a new LoRA adapter adds zero) answers prompts whose answers are then scored as it trains:
    # the held-out prompts of the user's dataset, which has no reference solutions; on the chat task also general
    # prompts (`tasks.general`), no more of them than validation problems (`--quick` stays quick).
    start_policy = trainer.accelerator.unwrap_model(trainer.model)
    if settings.task == "dataset":
        held_out = own_answers_dataset(start_policy, tokenizer, validation["prompt"], max_new_tokens)
    else:
        held_out = solutions
    general = None
    if settings.task == "chat":
        prompts = general_chat_prompts(settings.n_validation)
        general = own_answers_dataset(start_policy, tokenizer, prompts, max_new_tokens)
    retentions = [
        RetentionCallback(
            trainer, dataset, eval_steps=settings.eval_every, batch_size=batch_size, prefix=prefix, kl_to_start=True
        )
        for prefix, dataset in (("retention", held_out), ("general", general))
        if dataset is not None
    ]
    for retention in retentions:
        trainer.add_callback(retention)
    setup = run_setup(settings.setup, variant.name, variant.overrides.get("seed", settings.seed))
    record = RunRecord(start, validation_callback, retentions, kl_health, setup=setup)
    trainer.add_callback(record)
    checkpoint = latest_checkpoint(args.output_dir) if settings.resume else None
    if checkpoint is not None:
        # The start is the policy before the resume loads the trained weights: measure it now, as an uninterrupted
        # run did at its train begin, then take up what the run had recorded by the checkpoint.
        for retention in retentions:
            retention.record_start()
        record.resume(*checkpoint)
    trainer.train(resume_from_checkpoint=None if checkpoint is None else checkpoint[0])
    history = [entry for entry in trainer.state.log_history if "reward" in entry and "step" in entry]
    return VariantRun(
        variant.name,
        {"beta": args.beta, "trainer": variant_trainer(variant, settings), **variant.overrides},
        history,
        validation_callback.evaluations,
        record.seconds(),
        retention=merged_by_step(*(retention.history for retention in retentions)),
        kl_warnings=kl_health.episodes,
        samples=validation_callback.samples,
        resumed_at=record.resumed_at,
    )


def merged_by_step(*histories: list[dict]) -> list[dict]:
    """One entry per evaluated step with every history's metrics of that step (`retention/*` and `general/*`)."""
    merged: dict[int, dict] = {}
    for history in histories:
        for entry in history:
            merged.setdefault(entry["step"], {}).update(entry)
    return [merged[step] for step in sorted(merged)]


def variant_output_dir(out: str, name: str) -> str:
    """`<out>/runs/<variant name as a file name>`: the trainer's output directory for the variant named `name`."""
    slug = "".join(c if c.isalnum() or c in "._-" else "_" for c in name.replace(", ", "__").replace("=", "-"))
    return os.path.join(out, "runs", slug)


def check_variants(variants: list[Variant], settings: DemoSettings) -> None:
    """Builds every variant's config, so that an invalid one raises (naming the variant) before any run starts."""
    for variant in variants:
        try:
            make_config(variant, settings, variant_output_dir(settings.out, variant.name))
        except (ValueError, TypeError, NotImplementedError) as error:
            raise ValueError(f"variant {variant.name!r}: {error}") from None


def run_comparison(variants: list[Variant], settings: DemoSettings, progress: bool = True) -> list[VariantRun]:
    """Runs every variant in turn with a progress bar over all their steps (configs are validated before any run)."""
    from tqdm.auto import tqdm

    check_variants(variants, settings)
    # disable=None: no bar when the output is not a terminal (logs, CI), unless progress is off altogether.
    bar = tqdm(
        total=len(variants) * settings.steps, unit="step", disable=None if progress else True, dynamic_ncols=True
    )
    try:
        return [run_variant(variant, settings, bar) for variant in variants]
    finally:
        bar.close()
