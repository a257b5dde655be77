"""The `adaptive-kl` command: bad input fails early with a clear message, and a quick run writes its report."""

from __future__ import annotations

import csv
import math
import os
import statistics
import sys

import pytest
import torch
from repo_paths import REPO
from tiny import run_python

from adaptive_kl.console import main
from adaptive_kl.demo.arguments import build
from adaptive_kl.demo.report import (
    CSV_COLUMNS,
    SUMMARY_HEADER,
    TERMINAL_COLUMNS,
    diversity_table,
    step_rows,
    summarize,
    summary_table,
    write_report,
)
from adaptive_kl.demo.runner import TRAINER_DEFAULTS, DemoSettings, VariantRun
from adaptive_kl.demo.variants import DEMO_METHODS, parse_field_value, variant_grid


def fails_with(capsys, argv, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("adaptive-kl: error:")
    for fragment in fragments:
        assert fragment in err, err
    return err


# --- bad input: non-zero exit and a message naming the problem, before any training ------------------------------


def test_unknown_method(capsys, tmp_path):
    fails_with(
        capsys,
        ["compare", "--kl_adaptation_method", "none,bogus", "--out", str(tmp_path)],
        "bogus",
        "kl_adaptation_method",
    )


def test_unknown_field_suggests_the_close_one(capsys, tmp_path):
    fails_with(capsys, ["compare", "--kl_scalng", "none,log", "--out", str(tmp_path)], "kl_scalng", "kl_scaling")


def test_invalid_value_names_the_field(capsys, tmp_path):
    fails_with(capsys, ["compare", "--kl_scaling", "none,cubic", "--out", str(tmp_path)], "kl_scaling", "cubic")
    fails_with(capsys, ["demo", "--set", "beta=high", "--out", str(tmp_path)], "beta", "high")
    fails_with(capsys, ["demo", "--set", "beta", "--out", str(tmp_path)], "FIELD=VALUE")


def test_compare_needs_a_varied_field_and_demo_takes_none(capsys, tmp_path):
    fails_with(capsys, ["compare", "--out", str(tmp_path)], "at least one varied field")
    fails_with(capsys, ["demo", "--kl_scaling", "log", "--out", str(tmp_path)], "unrecognized", "compare")


def test_missing_model_path(capsys, tmp_path):
    fails_with(capsys, ["demo", "--model", str(tmp_path / "no-such-model"), "--out", str(tmp_path)], "no such file")
    fails_with(capsys, ["demo", "--model", "./relative/missing", "--out", str(tmp_path)], "no such file")


def test_model_directory_without_a_config(capsys, tmp_path):
    (tmp_path / "empty-model").mkdir()
    fails_with(capsys, ["demo", "--model", str(tmp_path / "empty-model"), "--out", str(tmp_path)], "cannot load")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_unsloth_without_gpu(capsys, tmp_path, tiny_model_dir):
    fails_with(capsys, ["demo", "--unsloth", "--model", tiny_model_dir, "--out", str(tmp_path)], "needs a CUDA GPU")


def test_unsloth_needs_a_model(capsys, tmp_path):
    fails_with(capsys, ["demo", "--unsloth", "--out", str(tmp_path)], "--unsloth", "--model")


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["compare", "--beta="], ["--beta needs at least one value"]),
        (["compare", "--beta", "0.1", "--beta", "0.2"], ["given twice"]),
        (["compare", "--beta", "0.1,0.2", "--set", "beta=0.5"], ["beta is both varied and fixed"]),
        (["demo", "--set", "kl_adaptation_method=clip"], ["demo varies kl_adaptation_method"]),
        (["compare", "--output_dir", "x"], ["output_dir", "--out"]),
        (["demo", "--set", "max_steps=3"], ["max_steps", "--steps"]),
        (["demo", "--unsl"], ["unrecognized arguments: --unsl"]),  # no abbreviation of --unsloth
        (["compare", "--seed", "0,x"], ["--seed expects an integer"]),
        (["demo", "--seed", "0,1"], ["demo runs one seed"]),
        (["demo", "--task", "gsm8k"], ["--task gsm8k needs --model"]),
        (["compare", "--reward_weights", "1,2"], ["reward_weights", "cannot be varied"]),
        (["demo", "--set", "reward_weights=1,2"], ["reward_weights"]),
        (
            ["compare", "--variant", "beta=0", "--kl_scaling", "log"],
            ["--variant lists whole variants", "--kl_scaling"],
        ),
        (["compare", "--variant", "beta"], ["--variant 'beta'", "FIELD=VALUE"]),
        (["compare", "--variant", "beta=0 beta=0.1"], ["sets beta twice"]),
        (["compare", "--variant", "beta=0", "--variant", "beta=0"], ["listed more than once"]),
        (["compare", "--variant", "beta=0", "--set", "beta=0.1"], ["beta is both varied and fixed"]),
        (["compare", "--variant", "bta=0"], ["Unknown", "bta", "beta"]),
        (["compare", "--variant", "max_steps=3"], ["max_steps", "--steps"]),
        (["compare", "--variant", "reward_weights=[1,2]"], ["reward_weights", "--set"]),
        (["demo", "--variant", "beta=0"], ["unrecognized arguments"]),
    ],
)
def test_conflicting_or_malformed_options(capsys, tmp_path, argv, fragments):
    fails_with(capsys, [*argv, "--out", str(tmp_path)], *fragments)


def test_lora_options_are_refused_where_no_lora_is_trained(capsys, tmp_path, tiny_model_dir):
    fails_with(capsys, ["demo", "--lora", "--out", str(tmp_path)], "--lora needs --model")
    fails_with(
        capsys, ["demo", "--model", tiny_model_dir, "--lora-r", "8", "--out", str(tmp_path)], "--lora-r", "add --lora"
    )
    fails_with(
        capsys,
        ["demo", "--model", tiny_model_dir, "--lora", "--lora-r", "0", "--out", str(tmp_path)],
        "--lora-r must be at least 1, got 0",
    )
    fails_with(
        capsys,
        ["demo", "--model", tiny_model_dir, "--lora", "--lora-alpha", "0", "--out", str(tmp_path)],
        "--lora-alpha must be at least 1",
    )


def test_a_hub_model_trains_in_full_at_its_stated_settings_or_a_lora_with_lora(tmp_path, tiny_model_dir, monkeypatch):
    """A hub id or path (here the tiny model's directory) trains the whole model at `budgets.HUB_MODEL`, each setting
    stated in `--model`'s help and overridable with `--set`; with `--lora` and its options TRL wraps it in that LoRA
    (rank, alpha, target modules) at the LoRA learning rate: only the adapter's weights are trainable and in the
    optimizer, and a checkpoint holds the adapter alone."""
    from adaptive_kl import AdaptiveKLGRPOTrainer
    from adaptive_kl.demo.arguments import run_options
    from adaptive_kl.demo.budgets import HUB_LORA, HUB_LORA_LEARNING_RATE, HUB_MODEL
    from adaptive_kl.demo.runner import make_config, run_variant

    help_text = " ".join(next(a for a in run_options()._actions if a.dest == "model").help.split())
    run = ["compare", "--model", tiny_model_dir, "--variant", "beta=0.1", "--out", str(tmp_path / "full")]
    settings, (variant,), _, _ = build(run)
    config = make_config(variant, settings, "unused")
    assert settings.adapter is None
    for name, value in HUB_MODEL.items():
        assert getattr(config, name) == value and f"{name}={value}" in help_text, name
    assert f"learning_rate={HUB_LORA_LEARNING_RATE} with --lora" in help_text
    page = open(os.path.join(REPO, "docs", "demo.md")).read()
    for name, value in HUB_MODEL.items():  # the table of docs/demo.md, which docs/frontier.md's example points to
        assert f"| `{name}` | {value} |" in page, name
    assert f"{HUB_LORA_LEARNING_RATE} with `--lora` or `--unsloth`" in page
    modules = " ".join(HUB_LORA["target_modules"])
    assert (
        f"rank `--lora-r` ({HUB_LORA['r']}), `--lora-alpha` ({HUB_LORA['lora_alpha']}), "
        f"`--lora-target-modules` (`{modules}`" in " ".join(page.split())
    )
    settings, (variant,), _, _ = build([*run, "--set", "num_generations=4", "--set", "learning_rate=3e-6"])
    overridden = make_config(variant, settings, "unused")
    assert (overridden.num_generations, overridden.learning_rate) == (4, 3e-6)

    out = tmp_path / "lora"
    argv = ["compare", "--model", tiny_model_dir, "--lora", "--lora-r", "4", "--lora-alpha", "8"]
    argv += ["--lora-target-modules", "q_proj", "v_proj", "--variant", "beta=0.1", "--steps", "2", "--eval-every", "2"]
    argv += ["--n-validation", "4", "--set", "max_completion_length=8", "--save-every", "2", "--out", str(out)]
    settings, (variant,), _, _ = build(argv)
    assert settings.adapter == {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    trainers = []
    train = AdaptiveKLGRPOTrainer.train
    monkeypatch.setattr(AdaptiveKLGRPOTrainer, "train", lambda self, **kw: trainers.append(self) or train(self, **kw))
    run_variant(variant, settings)
    (trainer,) = trainers
    assert trainer.args.learning_rate == HUB_LORA_LEARNING_RATE
    lora = trainer.model.peft_config["default"]
    assert (lora.r, lora.lora_alpha, set(lora.target_modules)) == (4, 8, {"q_proj", "v_proj"})
    trainable = {name: p for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in name or "lora_B" in name for name in trainable)
    adapted = {module for name in trainable for module in ("q_proj", "k_proj", "v_proj") if module in name}
    assert adapted == {"q_proj", "v_proj"}
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in trainable.values()}
    (checkpoint,) = (out / "runs").glob("*/checkpoint-2")
    assert (checkpoint / "adapter_model.safetensors").is_file() and not list(checkpoint.glob("model*.safetensors"))


def test_missing_gsm8k_path(capsys, tmp_path, tiny_model_dir):
    argv = ["demo", "--model", tiny_model_dir, "--task", "gsm8k", "--gsm8k-path", str(tmp_path / "gsm8k.jsonl")]
    fails_with(capsys, [*argv, "--out", str(tmp_path)], "--gsm8k-path", "no such file")


def test_unwritable_output_directory(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    fails_with(capsys, ["demo", "--quick", "--out", str(blocker / "out")], "--out", "cannot write")


def test_non_positive_budget(capsys, tmp_path):
    fails_with(capsys, ["demo", "--steps", "0", "--out", str(tmp_path)], "--steps", "at least 1")


# --- variants ------------------------------------------------------------------------------------------------------


def test_field_values_take_the_config_field_types():
    assert parse_field_value("reward_weights", "[1, 0.5]") == [1, 0.5]
    assert parse_field_value("report_to", "none") == "none"  # a string member wins over None
    assert parse_field_value("max_completion_length", "None") is None
    assert parse_field_value("beta", "0.1") == 0.1
    assert parse_field_value("max_completion_length", "24") == 24
    assert parse_field_value("bf16", "false") is False
    assert parse_field_value("kl_scaling", "sqrt") == "sqrt"
    with pytest.raises(ValueError, match="max_completion_length"):
        parse_field_value("max_completion_length", "long")


def test_variant_grid_is_the_product_in_order():
    variants = variant_grid({"kl_scaling": ["none", "log"], "beta": ["0.1", "0.01"]})
    assert [v.overrides for v in variants] == [
        {"kl_scaling": "none", "beta": 0.1},
        {"kl_scaling": "none", "beta": 0.01},
        {"kl_scaling": "log", "beta": 0.1},
        {"kl_scaling": "log", "beta": 0.01},
    ]
    assert variants[1].name == "kl_scaling=none, beta=0.01"
    assert [v.name for v in variant_grid({"kl_adaptation_method": list(DEMO_METHODS)})] == list(DEMO_METHODS)
    assert [v.name for v in variant_grid({"beta": ["0", "0.1"]})] == ["beta=0", "beta=0.1"]  # a bare number is unclear
    with pytest.raises(ValueError, match="more than once"):
        variant_grid({"kl_scaling": ["log", "log"]})


def test_listed_variants_are_written_out_one_by_one_and_crossed_with_seeds(tmp_path):
    settings, variants, title, _ = build(
        ["compare", "--variant", "beta=0", "--variant", "kl_placement=reward kl_estimator=k1", "--seed", "3,4",
         "--out", str(tmp_path)]
    )  # fmt: skip
    assert [v.name for v in variants] == [
        "beta=0, seed=3",
        "beta=0, seed=4",
        "kl_placement=reward, kl_estimator=k1, seed=3",
        "kl_placement=reward, kl_estimator=k1, seed=4",
    ]
    assert variants[3].overrides == {"kl_placement": "reward", "kl_estimator": "k1", "seed": 4}
    assert variants[0].overrides == {"beta": 0.0, "seed": 3}
    assert title == "adaptive-kl compare: beta=0; kl_placement=reward, kl_estimator=k1"
    assert settings.seed == 3
    # one seed: the names carry no seed, and each variant keeps the other's defaults
    _, variants, _, _ = build(
        ["compare", "--variant", "beta=0", "--variant", "kl_estimator=k2", "--out", str(tmp_path)]
    )
    assert [(v.name, v.overrides) for v in variants] == [
        ("beta=0", {"beta": 0.0}),
        ("kl_estimator=k2", {"kl_estimator": "k2"}),
    ]


# --- report on a fabricated run: numbers against hand computation --------------------------------------------------


def fabricated_run(name="clip"):
    history = [
        {"step": 1, "reward": 1.0, "adaptive_kl/raw_kl": 0.2, "adaptive_kl/adapted_kl": 0.1,
         "adaptive_kl/current_beta": 0.04, "completions/mean_length": 10.0},
        {"step": 2, "reward": 1.5, "adaptive_kl/raw_kl": 0.4, "adaptive_kl/adapted_kl": 0.3,
         "adaptive_kl/current_beta": 0.02, "completions/mean_length": 14.0, "custom/metric": 7.0},
    ]  # fmt: skip
    evaluations = [
        {"step": 0, "val_accuracy": 0.3},
        {"step": 1, "val_accuracy": 0.5},
        {"step": 2, "val_accuracy": 0.4},
    ]
    return VariantRun(name, {"kl_adaptation_method": name}, history, evaluations, wall_time=12.0)


def test_summary_numbers():
    s = summarize(fabricated_run())
    assert s["final_accuracy"] == 0.4
    assert math.isclose(s["delta_from_start"], 0.1) and math.isclose(s["delta_from_best"], -0.1)
    assert math.isclose(s["mean_raw_kl"], 0.3) and math.isclose(s["mean_adapted_kl"], 0.2)
    assert s["final_beta"] == 0.02 and s["mean_completion_length"] == 12.0
    table = summary_table([fabricated_run("clip"), fabricated_run("sigmoid")]).splitlines()
    assert table[0] == "| " + " | ".join(SUMMARY_HEADER) + " |"
    assert table[2].startswith("| clip | 0.400 | +0.100 | -0.100 | 0.3000 | 0.2000 | 0.02 | 12.0 | 12 |")
    assert len(table) == 4


def test_the_format_free_accuracy_is_reported_beside_the_accuracy():
    """The right final number, marker or not (`val_answer_accuracy`), at step 0 and at the end: a column only where
    a run evaluated it."""
    run = fabricated_run()
    assert math.isnan(summarize(run)["start_answer_accuracy"])
    assert "format-free accuracy" not in summary_table([run])
    for evaluation, answer_accuracy in zip(run.evaluations, (0.266, 0.5, 0.125)):
        evaluation["val_answer_accuracy"] = answer_accuracy
    s = summarize(run)
    assert (s["start_answer_accuracy"], s["final_answer_accuracy"]) == (0.266, 0.125)
    header, _, row = summary_table([run]).splitlines()
    cells = dict(zip(header.strip("| ").split(" | "), row.strip("| ").split(" | ")))
    assert cells["format-free accuracy (step 0)"] == "0.266" and cells["format-free accuracy (final)"] == "0.125"


# What the command prints: the columns a reader compares (summary.md keeps every column).
TERMINAL_HEADER = [
    "variant",
    "val. accuracy (final)",
    "reward (last quarter)",
    "mean raw KL",
    "final β",
    "mean completion length",
    "held-out KL to start (final)",
    "wall time (s)",
]


def test_the_printed_table_keeps_the_columns_a_reader_compares():
    """The printed table (`TERMINAL_COLUMNS`) is the summary table cut to accuracy, reward, KL, β, length, drift and
    wall time, with the same cells; the full table (summary.md's) is unchanged."""
    runs = [fabricated_run("clip"), fabricated_run("sigmoid")]
    full = [[c.strip() for c in line.strip("|").split("|")] for line in summary_table(runs).splitlines()]
    short = [
        [c.strip() for c in line.strip("|").split("|")] for line in summary_table(runs, TERMINAL_COLUMNS).splitlines()
    ]
    assert full[0] == list(SUMMARY_HEADER) and short[0] == TERMINAL_HEADER
    assert len(short) == len(full) == 4 and short[1] == ["---"] * len(TERMINAL_HEADER)
    for full_row, short_row in zip(full[2:], short[2:], strict=True):
        assert short_row == [full_row[full[0].index(header)] for header in TERMINAL_HEADER]
    assert short[2] == ["clip", "0.400", "1.500", "0.3000", "0.02", "12.0", "n/a", "12"]


def test_step_rows_merge_evaluations_and_keep_every_metric():
    rows = step_rows([fabricated_run()])
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0] == {"variant": "clip", "step": 0, "val_accuracy": 0.3}
    assert rows[2]["custom/metric"] == 7.0 and rows[2]["val_accuracy"] == 0.4 and rows[2]["reward"] == 1.5


def test_the_report_without_matplotlib_has_its_table_and_csv(tmp_path, monkeypatch):
    """The default install has no matplotlib (the `demo` extra brings it): the report keeps its table and CSV and
    writes no plot."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    paths = write_report([fabricated_run()], str(tmp_path))
    assert paths["plots"] == [] and not list(tmp_path.glob("*.png"))
    assert "| clip | 0.400 |" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "metrics.csv").read_text().startswith("variant,step,")


# --- end to end: the quick demo as a user runs it ------------------------------------------------------------------

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_png(path):
    import matplotlib.image

    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.01  # not a blank canvas


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    return out, run_python("-m", "adaptive_kl", "demo", "--quick", "--no-progress", "--out", str(out))


def test_quick_demo_table(quick_demo):
    """The table's numbers are those of the CSV, summarized."""
    out, result = quick_demo
    rows = [line for line in (out / "summary.md").read_text().splitlines() if line.startswith("| ")]
    # TRL logs the truncation rate, and the evaluations the format-free accuracy and the format rate: their optional
    # columns follow.
    optional = (
        "truncated (last quarter)",
        "format-free accuracy (step 0)",
        "format-free accuracy (final)",
        "greedy format rate (final)",
    )
    assert rows[0] == "| " + " | ".join((*SUMMARY_HEADER, *optional)) + " |"
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows[1:]] == list(DEMO_METHODS)
    with open(out / "metrics.csv") as f:
        records = list(csv.DictReader(f))
    for row in rows[1:]:
        cells = row.strip("| ").split(" | ")
        mine = [r for r in records if r["variant"] == cells[0]]
        accuracy = [float(r["val_accuracy"]) for r in mine if r["val_accuracy"]]
        assert float(cells[1]) == pytest.approx(accuracy[-1], abs=5e-4)
        assert float(cells[2]) == pytest.approx(accuracy[-1] - accuracy[0], abs=5e-4)
        assert float(cells[3]) == pytest.approx(accuracy[-1] - max(accuracy), abs=5e-4)
        raw = [float(r["adaptive_kl/raw_kl"]) for r in mine if r["adaptive_kl/raw_kl"]]
        assert float(cells[4]) == pytest.approx(sum(raw) / len(raw), abs=5e-5)
        assert float(cells[6]) == pytest.approx(float(mine[-1]["adaptive_kl/current_beta"]), rel=1e-3)
        truncated = [float(r["completions/clipped_ratio"]) for r in mine if r["completions/clipped_ratio"]]
        assert float(cells[-4]) == pytest.approx(statistics.mean(truncated[-max(1, len(truncated) // 4) :]), abs=5e-3)
        answer_accuracy = [float(r["val_answer_accuracy"]) for r in mine if r["val_answer_accuracy"]]
        assert [float(c) for c in cells[-3:-1]] == pytest.approx([answer_accuracy[0], answer_accuracy[-1]], abs=5e-4)
        formats = [float(r["val_format"]) for r in mine if r["val_format"]]
        assert float(cells[-1]) == pytest.approx(formats[-1], abs=5e-4)
    # The printed table: the same rows, cut to the columns a reader compares.
    printed = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert printed[0] == "| " + " | ".join(TERMINAL_HEADER) + " |"
    header = rows[0].strip("| ").split(" | ")
    for row, line in zip(rows[1:], printed[1:], strict=True):
        cells = row.strip("| ").split(" | ")
        assert line.strip("| ").split(" | ") == [cells[header.index(name)] for name in TERMINAL_HEADER]


def test_quick_demo_csv(quick_demo):
    out, _ = quick_demo
    with open(out / "metrics.csv") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames[: len(CSV_COLUMNS)]) == CSV_COLUMNS
        rows = list(reader)
    for method in DEMO_METHODS:
        steps = [int(r["step"]) for r in rows if r["variant"] == method]
        assert steps == list(range(0, 7)), (method, steps)  # step 0 (evaluation only), then 6 optimizer steps
        evaluated = {int(r["step"]) for r in rows if r["variant"] == method and r["val_accuracy"] != ""}
        assert evaluated == {0, 3, 6}
        trained = [r for r in rows if r["variant"] == method and r["step"] != "0"]
        assert all(r["reward"] != "" and 0 <= float(r["reward"]) <= 2 for r in trained)
        assert all(float(r["adaptive_kl/raw_kl"]) >= 0 for r in trained)
    clip_betas = [float(r["adaptive_kl/current_beta"]) for r in rows if r["variant"] == "clip" and r["step"] != "0"]
    assert clip_betas == [TRAINER_DEFAULTS["grpo"]["beta"]] * 6  # a fixed β stays fixed


def test_quick_demo_plots(quick_demo):
    out, _ = quick_demo
    for name in ("metrics", "reward", "validation_accuracy", "kl", "beta", "completion_length"):
        check_png(out / f"{name}.png")


def test_compare_on_a_local_model_path(tiny_model_dir, tmp_path):
    """`--model` with a local path takes the real-model route (instruction in the prompt, real-model settings)."""
    out = tmp_path / "compare"
    argv = ["compare", "--kl_scaling", "none,log", "--model", tiny_model_dir, "--quick", "--no-progress",
            "--set", "max_completion_length=8", "--set", "per_device_train_batch_size=4", "--set", "num_generations=4",
            "--set", "gradient_accumulation_steps=1", "--n-validation", "4", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = [line for line in (out / "summary.md").read_text().splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows[1:]] == ["none", "log"]
    with open(out / "metrics.csv") as f:
        records = list(csv.DictReader(f))
    log_scale = [float(r["adaptive_kl/beta_scale"]) for r in records if r["variant"] == "log" and r["step"] != "0"]
    assert log_scale[0] == 1.0 and math.isclose(log_scale[1], 1 / math.log(3))  # α(t) = 1/ln(t+1) from t = 2
    assert "Model: " + tiny_model_dir in (out / "summary.md").read_text()


def test_demo_script_is_the_same_code(tmp_path):
    script = os.path.join(REPO, "demos", "run_all_methods.py")
    run_python(script, "--steps", "1", "--n-validation", "8", "--out", str(tmp_path))
    assert (tmp_path / "summary.md").read_text().count("\n| ") == 1 + len(DEMO_METHODS)
    check_png(tmp_path / "metrics.png")


def test_a_seed_variant_also_draws_its_data_with_that_seed(tmp_path):
    from adaptive_kl.demo.runner import make_config
    from adaptive_kl.demo.variants import Variant

    args = make_config(Variant("seed=3", {"seed": 3}), DemoSettings(), str(tmp_path))
    assert (args.seed, args.data_seed) == (3, 3)
    args = make_config(Variant("beta=0.2", {"beta": 0.2}), DemoSettings(seed=5), str(tmp_path))
    assert (args.seed, args.data_seed, args.beta) == (5, 5, 0.2)


# --- the seed studies' variants: β sweep, trainer choice, retention and diversity in the report ----------------------


def test_a_beta_sweep_builds_valid_configs_down_to_zero(tmp_path):
    """`compare --beta 0,0.001,0.01,0.1`: the dynamic floor beta_min follows β down (it may not exceed it); without
    `dynamic` nothing reads it, and the config keeps its default."""
    from adaptive_kl.demo.runner import make_config

    for method, floor in (("dynamic", lambda beta: min(0.004, beta)), ("none", lambda beta: 0.0)):
        grid = variant_grid({"beta": ["0.001", "0.01", "0.1"], "kl_adaptation_method": [method]})
        if method == "none":
            grid = variant_grid({"beta": ["0", "0.001", "0.01", "0.1"]})
        for variant in grid:
            args = make_config(variant, DemoSettings(), str(tmp_path))
            assert args.beta == variant.overrides["beta"] and args.beta_min == floor(args.beta)


def test_the_trainer_field_picks_the_config_class(tmp_path):
    from adaptive_kl import AdaptiveKLGRPOConfig
    from adaptive_kl.demo.runner import make_config
    from adaptive_kl.experimental.binomial import BinomialKLConfig

    grpo, binomial = variant_grid({"trainer": ["grpo", "binomial_kl"]})
    assert type(make_config(grpo, DemoSettings(), str(tmp_path))) is AdaptiveKLGRPOConfig
    args = make_config(binomial, DemoSettings(), str(tmp_path))
    assert type(args) is BinomialKLConfig and args.beta == 0.0 and args.correct_reward_threshold == 1.5
    with pytest.raises(ValueError, match="kl_scaling is not a field of BinomialKLConfig"):
        make_config(binomial, DemoSettings(fixed={"kl_scaling": "sqrt"}), str(tmp_path))
    with pytest.raises(ValueError, match="expected one of"):
        parse_field_value("trainer", "spo")


def test_compare_rejects_a_field_of_the_other_trainer(capsys, tmp_path):
    assert main(["compare", "--trainer", "grpo,binomial_kl", "--set", "diversity_metrics=true", "--out",
                 str(tmp_path)]) == 2  # fmt: skip
    assert "diversity_metrics is not a field of BinomialKLConfig" in capsys.readouterr().err


def test_summary_of_retention_warnings_and_diversity():
    run = fabricated_run()
    run.retention = [{"step": 0, "retention/loglik": -0.5}, {"step": 2, "retention/loglik": -0.75}]
    run.kl_warnings = [{"step": 2, "side": "above", "value": 0.3}]
    for h, unique in zip(run.history, (0.5, 0.25)):
        h["diversity/unique_fraction"] = unique
    s = summarize(run)
    assert (s["final_retention"], s["delta_retention"], s["kl_warnings"]) == (-0.75, -0.25, 1.0)
    assert s["late_reward"] == 1.5  # the last quarter of two steps is the last step
    table = diversity_table([run, fabricated_run("sigmoid")]).splitlines()
    assert table[2].startswith("| clip | 0.250 | n/a") and table[3].startswith("| sigmoid | n/a")
    assert diversity_table([fabricated_run()]) == ""  # no run logged diversity/*


@pytest.mark.parametrize("model", [None, "smollm2"])
def test_the_demos_configs_set_no_parameter_their_method_does_not_read(model):
    """The shared defaults of one method (`dynamic`'s threshold, decay and floor) are left out of the others' configs,
    so the demo warns about nothing it did not ask for; a variant that sets one itself keeps it, and is warned."""
    import warnings

    from adaptive_kl.demo.runner import make_config
    from adaptive_kl.demo.variants import Variant

    settings = DemoSettings(model=model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        configs = {m: make_config(Variant(m, {"kl_adaptation_method": m}), settings, "unused") for m in DEMO_METHODS}
    assert [str(w.message) for w in caught if "has no effect" in str(w.message)] == []
    dynamic = configs["dynamic"]
    assert dynamic.reward_threshold != 0.8 and dynamic.beta_min > 0  # the demo's own, not the config's defaults
    with pytest.warns(UserWarning, match="reward_threshold=0.3 has no effect"):
        kept = make_config(Variant("x", {"kl_adaptation_method": "clip", "reward_threshold": 0.3}), settings, "unused")
    assert kept.reward_threshold == 0.3


def test_a_run_that_trained_nothing_is_said_so():
    """`compare --model smollm2 --quick` can end with every gradient 0 (tied rewards, a fresh LoRA): the command says
    so instead of leaving a table that looks trained; it says nothing when every run had a gradient."""
    from adaptive_kl.demo.command import untrained_note
    from adaptive_kl.demo.runner import VariantRun

    def run(name, norms):
        return VariantRun(name, {}, [{"step": i + 1, "grad_norm": g} for i, g in enumerate(norms)], [], wall_time=1.0)

    assert untrained_note([run("none", [0.0, 0.3]), run("clip", [0.1, 0.0])]) is None
    note = untrained_note([run("none", [0.0, 0.0]), run("clip", [0.1, 0.0])])
    assert note.startswith("Note: 1 of 2 runs did not train (none): every step's gradient norm was 0")
    assert untrained_note([run("none", [0.0, 0.0])]).startswith("Note: no run trained (none)")


@pytest.mark.parametrize("trainer", ["grpo", "rloo", "binomial_kl"])
def test_every_trainer_takes_the_named_policys_budget(trainer, tmp_path, monkeypatch):
    """`--model smollm2` trains every trainer at the real model's budget (learning rate, group size, completion
    length, no gradient checkpointing), not at TRL's defaults; the KL trainers also take its β."""
    from adaptive_kl.demo.arguments import build
    from adaptive_kl.demo.budgets import SMOLLM2_DEMO
    from adaptive_kl.demo.runner import make_config

    monkeypatch.setattr("adaptive_kl.demo.arguments.check_model", lambda *args: None)
    argv = ["compare", "--model", "smollm2", "--trainer", trainer, "--variant", "seed=0", "--out", str(tmp_path)]
    settings, (variant,), _, _ = build(argv)
    config = make_config(variant, settings, str(tmp_path / "run"))
    for name, value in SMOLLM2_DEMO["config"].items():
        assert getattr(config, name) == value, name
    assert (config.beta == SMOLLM2_DEMO["kl_config"]["beta"]) == (trainer != "binomial_kl")
