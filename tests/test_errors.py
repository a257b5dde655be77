"""Bad input, and options the package refuses.

Every row of docs/errors.md, run: the bad input, its exit status or exception type, and the documented message. Each
case builds its input (files in `tmp_path`, the tiny model) and returns what the user sees: for the command,
`"<exit status>: <stderr>"`; for Python, `"<exception type>: <message>"`. The row's quoted excerpt must be in it, and
no traceback.

Then the options whose code path would bypass the KL term, refused at init, and the others shown to go through it;
what the controllers do when `sync_ref_model=True` moves the reference; the warning for a PEFT model whose trained
adapter would be compared against the adapter-disabled base.
"""

from __future__ import annotations

import json
import os
import re
import warnings

import peft
import pytest
import torch
import transformers.trainer
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from repo_paths import REPO
from tiny import TRAIN_KWARGS, fabricated_inputs, length_reward, loss_and_grads, make_trainer, prompt_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.console import main
from adaptive_kl.experimental.binomial import BinomialKLConfig, BinomialKLTrainer
from adaptive_kl.trainers.hooks import HOST_INTERNALS, UnsupportedTRLError, check_host


TABLE = os.path.join(REPO, "docs", "errors.md")
ROW = re.compile(r"^\| `(?P<id>[a-z0-9-]+)` \| .* \| `(?P<excerpt>.*)` \|$")


def documented_rows() -> dict[str, str]:
    rows = {}
    with open(TABLE, encoding="utf-8") as table:
        for line in table:
            match = ROW.match(line.strip())
            if match:
                rows[match["id"]] = match["excerpt"]
    return rows


class Context:
    """What a case needs: a scratch directory, the captured output, the tiny model."""

    def __init__(self, tmp_path, capsys, tiny_model_dir):
        self.tmp, self.capsys, self.model = tmp_path, capsys, tiny_model_dir
        self.stderr = ""

    def command(self, *argv: str) -> str:
        """`"<exit status>: <the error>"`: stderr from its last `adaptive-kl: error:` line on (progress bars of dataset
        loading may come before it; a list of what differs may follow it), else its last line."""
        status = main(list(argv))
        self.stderr = self.capsys.readouterr().err
        lines = self.stderr.strip().splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("adaptive-kl: error: ")]
        return f"{status}: {chr(10).join(lines[starts[-1] if starts else -1 :]) if lines else ''}"

    def write(self, name: str, text: str) -> str:
        path = self.tmp / name
        path.write_text(text)
        return str(path)

    def jsonl(self, name: str, rows: list[dict]) -> str:
        return self.write(name, "".join(json.dumps(row) + "\n" for row in rows))

    def recipe(self, **fields) -> str:
        """A CPU recipe on the tiny model and a 16-row local dataset, with `fields` changed (None: removed)."""
        rows = [{"prompt": f"Q: {i}+1? A: ", "answer": str(i + 1)} for i in range(16)]
        base = dict(
            model_name_or_path=self.model, dataset_name=self.jsonl("train.jsonl", rows),
            reward_funcs=["format_reward"], output_dir=str(self.tmp / "out"), max_steps=1, learning_rate=1e-4,
            per_device_train_batch_size=8, num_generations=4, max_completion_length=8, use_cpu=True, bf16=False,
            report_to="none", save_strategy="no", beta=0.1, gradient_checkpointing=False,
        )  # fmt: skip
        merged = {k: v for k, v in {**base, **fields}.items() if v is not None}
        return self.write("recipe.yaml", json.dumps(merged))  # JSON is YAML

    def trained(self, kind: str, setup: dict) -> None:
        """Leaves in the scratch directory what a run trained with `setup` leaves: the checkpoint of the compare run
        of `--variant beta=0.1` (`kind="checkpoint"`), or the frontier's finished run of β = 0, seed 0."""
        if kind == "checkpoint":
            record = dict(seconds=1.0, resumed_at=[], evaluations=[], samples=[], retention={}, kl_health={})
            state = {"stateful_callbacks": {"RunRecord": {"args": {}, "attributes": {**record, "setup": setup}}}}
            checkpoint = self.tmp / "runs" / "beta-0.1" / "checkpoint-2"
            checkpoint.mkdir(parents=True)
            (checkpoint / "trainer_state.json").write_text(json.dumps(state))
            return
        run = dict(name="beta=0", config={}, history=[], evaluations=[], wall_time=1.0, provenance={"setup": setup})
        finished = self.tmp / "runs" / "beta_0" / "seed-0"
        finished.mkdir(parents=True)
        (finished / "runs.json").write_text(json.dumps([run]))

    def grpo(self, *argv: str, **fields) -> str:
        return self.command("grpo", "--config", self.recipe(**fields), *argv)

    def user_rewards(self, monkeypatch, source: str) -> None:
        monkeypatch.chdir(self.tmp)
        monkeypatch.delitem(__import__("sys").modules, "my_rewards", raising=False)
        self.write("my_rewards.py", source)


def raised(call) -> str:
    try:
        call()
    except (ValueError, TypeError) as error:
        return f"{type(error).__name__}: {error}"
    raise AssertionError("no error was raised")


def api_trainer_error(ctx, reward, dataset=None, binomial=False) -> str:
    """The error of building, then training, a trainer on the tiny model with `reward` and `dataset`."""
    config_cls, trainer_cls = (
        (BinomialKLConfig, BinomialKLTrainer) if binomial else (AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer)
    )

    def build_and_train():
        args = config_cls(**{**TRAIN_KWARGS, "output_dir": str(ctx.tmp / "api"), "max_steps": 1})
        dataset_ = prompt_dataset() if dataset is None else dataset
        trainer_cls(model=ctx.model, reward_funcs=[reward], args=args, train_dataset=dataset_).train()

    return raised(build_and_train)


def forgot_return(completions, **kwargs):
    """A reward function without its return statement."""


def nested(completions, **kwargs):
    return [[1.0] for _ in completions]


CASES = {
    "demo-negative-learning-rate": lambda c, m: c.command("demo", "--set", "learning_rate=-1", "--out", str(c.tmp)),
    "demo-zero-learning-rate": lambda c, m: c.command("demo", "--set", "learning_rate=0", "--out", str(c.tmp)),
    "demo-too-many-validation-problems": lambda c, m: c.command(
        "demo", "--n-validation", "100000", "--out", str(c.tmp)
    ),
    "demo-unknown-field": lambda c, m: c.command("compare", "--kl_estimater", "k1,k3", "--out", str(c.tmp)),
    "compare-rloo-grpo-only-field": lambda c, m: c.command(
        "compare", "--trainer", "rloo", "--kl_placement", "loss,reward", "--out", str(c.tmp)
    ),
    "compare-variant-with-field-lists": lambda c, m: c.command(
        "compare", "--variant", "beta=0", "--kl_scaling", "none,log", "--out", str(c.tmp)
    ),
    "compare-variant-without-value": lambda c, m: c.command(
        "compare", "--variant", "kl_placement", "--out", str(c.tmp)
    ),
    "demo-zero-steps": lambda c, m: c.command("demo", "--steps", "0", "--out", str(c.tmp)),
    "demo-missing-model": lambda c, m: c.command("demo", "--model", "./no-such-model", "--out", str(c.tmp)),
    "compare-dataset-without-prompts": lambda c, m: c.command(
        *("compare", "--beta", "0,0.1", "--reward-funcs", "format_reward", "--out", str(c.tmp), "--dataset"),
        c.jsonl("questions.jsonl", [{"question": f"{i}+1?", "answer": str(i + 1)} for i in range(8)]),
    ),
    "frontier-dataset-too-small": lambda c, m: c.command(
        *("frontier", "--reward-funcs", "format_reward", "--n-validation", "16", "--out", str(c.tmp), "--dataset"),
        c.jsonl("train.jsonl", [{"prompt": f"Q: {i}+1? A: ", "answer": str(i + 1)} for i in range(16)]),
    ),
    "compare-resume-another-setup": lambda c, m: (
        c.trained(
            "checkpoint",
            {"command": "compare", "--steps": 4, "--gsm8k-path": "openai/gsm8k", "variant": "beta=0.1", "seed": 0},
        ),
        c.command(
            "compare", "--variant", "beta=0.1", "--steps", "5", "--save-every", "2", "--resume", "--out", str(c.tmp)
        ),
    )[1],
    "frontier-another-setup": lambda c, m: (
        c.trained(
            "finished",
            {"command": "compare", "--steps": 4, "--gsm8k-path": "openai/gsm8k", "variant": "beta=0", "seed": 0},
        ),
        c.command("frontier", "--steps", "5", "--betas", "0", "--seeds", "0", "--out", str(c.tmp)),
    )[1],
    "grpo-unknown-recipe-key": lambda c, m: c.grpo(kl_estimater="k2"),
    "grpo-unknown-flag": lambda c, m: c.grpo("--learnig_rate", "1e-5"),
    "grpo-missing-recipe": lambda c, m: (m.chdir(c.tmp), c.command("grpo", "--config", "missing.yaml"))[1],
    "grpo-recipe-not-a-mapping": lambda c, m: c.command("grpo", "--config", c.write("list.yaml", "- a\n- b\n")),
    "grpo-bad-kl-field": lambda c, m: c.grpo("--kl_estimator", "k9"),
    "grpo-straight-through-in-reward": lambda c, m: c.grpo("--kl_placement", "reward", "--kl_estimator", "k3+"),
    "grpo-unknown-dynamic-trigger": lambda c, m: c.grpo(
        "--kl_adaptation_method", "dynamic", "--dynamic_trigger", "entropy"
    ),
    "grpo-zero-learning-rate": lambda c, m: c.grpo("--learning_rate", "0"),
    "grpo-missing-model": lambda c, m: (m.chdir(c.tmp), c.grpo("--model_name_or_path", "./no-such-model"))[1],
    "grpo-no-reward": lambda c, m: c.grpo(reward_funcs=None),
    "grpo-unknown-reward": lambda c, m: c.grpo("--reward_funcs", "acuracy_reward"),
    "grpo-reward-module-missing": lambda c, m: c.grpo("--reward_funcs", "no_such_module:score"),
    "grpo-reward-function-missing": lambda c, m: (
        c.user_rewards(m, "def score(completions, **kw):\n    return [1.0] * len(completions)\n"),
        c.grpo("--reward_funcs", "my_rewards:scor"),
    )[1],
    "grpo-reward-not-callable": lambda c, m: (
        c.user_rewards(m, "THRESHOLD = 0.5\n"),
        c.grpo("--reward_funcs", "my_rewards:THRESHOLD"),
    )[1],
    "grpo-missing-dataset": lambda c, m: (m.chdir(c.tmp), c.grpo("--dataset_name", "./missing.jsonl"))[1],
    "grpo-unsupported-data-file": lambda c, m: (
        m.chdir(c.tmp),
        c.write("notes.txt", "prompt\n"),
        c.grpo("--dataset_name", "notes.txt"),
    )[2],
    "grpo-unknown-split": lambda c, m: (
        (c.tmp / "splits").mkdir(),
        c.jsonl("splits/train.jsonl", [{"prompt": "Q: 1+1? A: "}] * 8),
        c.jsonl("splits/test.jsonl", [{"prompt": "Q: 2+2? A: "}] * 8),
        c.grpo("--dataset_name", str(c.tmp / "splits"), "--dataset_train_split", "validation"),
    )[3],
    "grpo-no-prompt-column": lambda c, m: c.grpo(
        dataset_name=c.jsonl("questions.jsonl", [{"question": "1+1?", "answer": "2"}] * 8)
    ),
    "grpo-empty-prompt": lambda c, m: c.grpo(
        dataset_name=c.jsonl(
            "gaps.jsonl", [{"prompt": "Q: 1+1? A: " if i != 2 else "", "answer": "2"} for i in range(8)]
        )
    ),
    "grpo-string-rewards": lambda c, m: (
        c.user_rewards(m, "def as_text(completions, **kw):\n    return ['1.0'] * len(completions)\n"),
        c.grpo("--reward_funcs", "my_rewards:as_text"),
    )[1],
    "grpo-embedder-path": lambda c, m: (
        m.chdir(c.tmp),
        c.grpo("--diversity_metrics", "true", "--diversity_embedder", "./no-such-embedder"),
    )[1],
    "grpo-embedder-without-metrics": lambda c, m: c.grpo("--diversity_embedder", "minilm"),
    "grpo-resets-with-sync-ref-model": lambda c, m: c.grpo("--ref_reset_steps", "50", "--sync_ref_model", "true"),
    "grpo-drift-without-target": lambda c, m: c.grpo("--kl_controller", "drift", "--max_steps", "10"),
    "grpo-drift-without-test-split": lambda c, m: c.grpo(
        "--kl_controller", "drift", "--target_drift", "0.1", "--max_steps", "10"
    ),
    "api-drift-without-held-out-texts": lambda c, m: raised(
        lambda: make_trainer(
            AdaptiveKLGRPOTrainer,
            AdaptiveKLGRPOConfig,
            c.model,
            output_dir=str(c.tmp),
            beta=0.04,
            kl_controller="drift",
            target_drift=0.1,
            max_steps=10,
        )  # fmt: skip
    ),
    "api-negative-learning-rate": lambda c, m: raised(
        lambda: AdaptiveKLGRPOConfig(str(c.tmp), learning_rate=-1, use_cpu=True, bf16=False)
    ),
    "api-kl-mask-without-beta": lambda c, m: raised(
        lambda: AdaptiveKLGRPOConfig(str(c.tmp), kl_mask_zero_std_groups=True, use_cpu=True, bf16=False)
    ),
    "api-reset-optimizer-alone": lambda c, m: raised(
        lambda: AdaptiveKLGRPOConfig(str(c.tmp), beta=0.04, ref_reset_optimizer=True, use_cpu=True, bf16=False)
    ),
    "api-kl-scaling-rate-above-one": lambda c, m: raised(
        lambda: AdaptiveKLGRPOConfig(
            str(c.tmp), beta=0.04, kl_scaling="exp", kl_scaling_rate=1.5, use_cpu=True, bf16=False
        )
    ),
    "api-kl-log-ratio-clip-too-large": lambda c, m: raised(
        lambda: AdaptiveKLGRPOConfig(str(c.tmp), beta=0.04, kl_log_ratio_clip=100.0, use_cpu=True, bf16=False)
    ),
    "api-saturation-threshold-zero": lambda c, m: raised(
        lambda: AdaptiveKLGRPOConfig(str(c.tmp), beta=0.04, saturation_threshold=0.0, use_cpu=True, bf16=False)
    ),
    "api-empty-prompt": lambda c, m: api_trainer_error(
        c, forgot_return, Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1?"}], []]})
    ),
    "api-no-prompt-column": lambda c, m: api_trainer_error(
        c, forgot_return, Dataset.from_dict({"text": ["a", "b"]}), binomial=True
    ),
    "api-reward-returns-none": lambda c, m: api_trainer_error(c, forgot_return),
    "api-reward-returns-list-per-completion": lambda c, m: api_trainer_error(c, nested),
}


def test_every_documented_row_has_a_case_and_every_case_a_row():
    assert sorted(documented_rows()) == sorted(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_documented_message(case, tmp_path, capsys, monkeypatch, tiny_model_dir):
    context = Context(tmp_path, capsys, tiny_model_dir)
    seen = CASES[case](context, monkeypatch)
    excerpt = documented_rows()[case]
    if case.startswith("api-"):
        assert excerpt in seen, seen
    else:
        assert seen.startswith("2: adaptive-kl: error: "), seen
        assert excerpt in seen, seen
    assert "Traceback" not in seen + getattr(context, "stderr", "")


# --- the reward output check itself ------------------------------------------------------------------------------


def test_reward_check_passes_every_reward_trl_accepts_unchanged():
    import asyncio

    import numpy as np
    import torch

    from adaptive_kl.trainers.inputs import checked_reward_func

    rewards = [1.0, 0, True, None, np.float32(0.5), np.int64(2), torch.tensor(0.25), torch.tensor([3.0]), float("nan")]
    check = checked_reward_func(lambda completions, **kw: rewards, "fine")
    assert check(completions=["x"] * len(rewards)) is rewards
    torch.tensor([float("nan") if r is None else r for r in rewards])  # what TRL does next: it must accept them

    async def scored_remotely(completions, **kwargs):
        return ["good"] * len(completions)

    checked_async = checked_reward_func(scored_remotely, "scored_remotely")
    assert asyncio.iscoroutinefunction(checked_async)  # TRL gathers it with the other async reward functions
    with pytest.raises(TypeError, match=r"'scored_remotely' returned 'good' \(str\) for completion 0"):
        asyncio.run(checked_async(completions=["a"]))


def test_reward_functions_are_the_users_own_outside_scoring(tiny_model_dir, tmp_path):
    """The check wraps the functions only while a batch is scored: `trainer.reward_funcs` stays the user's list."""

    def seen(completions, **kwargs):
        calls.append(list(completions))
        return [float(len(c)) for c in completions]

    calls = []
    args = AdaptiveKLGRPOConfig(**{**TRAIN_KWARGS, "output_dir": str(tmp_path), "max_steps": 1, "beta": 0.1})
    trainer = AdaptiveKLGRPOTrainer(
        model=tiny_model_dir, reward_funcs=[seen], args=args, train_dataset=prompt_dataset()
    )
    trainer.train()
    assert trainer.reward_funcs == [seen] and len(calls) == 1
    assert [e["rewards/seen/mean"] for e in trainer.state.log_history if "rewards/seen/mean" in e]


def test_empty_prompts_are_named_by_the_datasets_own_rows():
    """Text and chat prompts, nulls, and a dataset seen through `select` (its rows, not the underlying table's)."""
    from adaptive_kl.trainers.inputs import check_train_dataset

    text = Dataset.from_dict({"prompt": ["Q: 1? A: ", "", "Q: 2? A: ", None, "Q: 3? A: "]})
    with pytest.raises(ValueError, match=r"has 2 empty prompt\(s\) \(rows 1, 3\)"):
        check_train_dataset(text)
    with pytest.raises(ValueError, match=r"has 1 empty prompt\(s\) \(rows 2\)"):
        check_train_dataset(text.select([4, 0, 1]))
    check_train_dataset(text.select([0, 2, 4]))  # no empty prompt left: accepted
    chat = Dataset.from_dict({"prompt": [[{"role": "user", "content": "1?"}], [], [{"role": "user", "content": ""}]]})
    with pytest.raises(ValueError, match=r"has 1 empty prompt\(s\) \(rows 1\)"):  # a message, even empty, is a prompt
        check_train_dataset(chat)
    with pytest.raises(ValueError, match=r"has 7 empty prompt\(s\) \(rows 0, 1, 2, 3, 4, \.\.\.\)"):
        check_train_dataset([{"prompt": ""}] * 7)


# --- options refused at init, and those shown to reach the KL term ---------------------------------------------------


def _config(tmp_path, **kwargs):
    return AdaptiveKLGRPOConfig(**{**TRAIN_KWARGS, "output_dir": str(tmp_path), "beta": 0.1, **kwargs})


# --- Liger and the host's loss path ---------------------------------------------------------------------------------


def test_liger_fused_loss_is_refused_before_loading(tmp_path, monkeypatch):
    """A host that routes `use_liger_kernel=True` to Liger's fused GRPO loss is refused at init, naming the field."""
    monkeypatch.setattr(GRPOTrainer, "_compute_liger_loss", lambda *a, **k: None, raising=False)
    with pytest.raises(ValueError, match="use_liger_kernel=True .* never calls AdaptiveKLGRPOTrainer's loss"):
        AdaptiveKLGRPOTrainer(
            model="/nonexistent/model",  # refused before anything is loaded
            reward_funcs=[length_reward],
            args=_config(tmp_path, use_liger_kernel=True),
            train_dataset=prompt_dataset(),
        )


def test_liger_layer_kernels_keep_our_loss(tiny_model_dir, tmp_path, monkeypatch):
    """On TRL 1.15/1.16 `use_liger_kernel=True` only swaps layer kernels: the loss still goes through our KL term.

    Liger needs a GPU, so its kernel application is replaced by a recorder; what is tested is the trainer's path.
    """
    patched = []
    monkeypatch.setattr(transformers.trainer, "apply_liger_kernel", lambda model, config: patched.append(config))
    assert not hasattr(GRPOTrainer, "_compute_liger_loss")
    common = dict(beta=0.1, use_liger_kernel=True, max_steps=1, output_dir=str(tmp_path / "o"))
    stock = make_trainer(GRPOTrainer, GRPOConfig, tiny_model_dir, **common)
    ours = make_trainer(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, **common)
    inputs = fabricated_inputs(stock)
    stock_loss, _ = loss_and_grads(stock, inputs)
    ours_loss, _ = loss_and_grads(ours, inputs)
    assert ours_loss.item() == pytest.approx(stock_loss.item(), rel=1e-6)
    assert ours.kl_monitor.log_sums["train"]  # the loss went through our KL term
    ours.train()
    assert patched == [{"fused_linear_cross_entropy": False}]  # Liger applied, its fused loss disabled by TRL
    assert any("adaptive_kl/raw_kl" in h for h in ours.state.log_history)


def test_host_without_the_hooked_methods_is_refused(tmp_path):
    """A GRPOTrainer lacking a hooked method (a TRL outside the range) is refused, naming what is missing."""
    methods = [internal.name for internal in HOST_INTERNALS if internal.kind == "method"]
    old_host = type("GRPOTrainer", (), {"_tag_names": [], **{name: lambda self: None for name in methods[1:]}})
    # The fake host has no training loop either, so the training attribute it sets is named after the method.
    with pytest.raises(UnsupportedTRLError, match=rf"has no \['{methods[0]}'(, '\w+')*\].*trl>=1\.15,<1\.17"):
        check_host(old_host, "grpo", _config(tmp_path), "AdaptiveKLGRPOTrainer", own_loss=True)
    check_host(GRPOTrainer, "grpo", _config(tmp_path), "AdaptiveKLGRPOTrainer", own_loss=True)  # all there


# --- sync_ref_model -------------------------------------------------------------------------------------------------


def _sync_run(tiny_model_dir, tmp_path, sync: bool):
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer,
        AdaptiveKLGRPOConfig,
        tiny_model_dir,
        output_dir=str(tmp_path / f"sync-{sync}"),
        reward_funcs=[lambda completions, **kwargs: [float(i % 4) for i in range(len(completions))]],  # never tied
        beta=0.1,
        kl_controller="stepwise",
        target_kl=1e-3,
        beta_max=1.0,  # room to raise β above its start
        sync_ref_model=sync,
        ref_model_sync_steps=2,
        ref_model_mixup_alpha=1.0,  # the reference becomes the policy at each sync
        bf16=False,
        max_steps=4,
    )
    trainer.train()
    logs = {h["step"]: h for h in trainer.state.log_history if "adaptive_kl/raw_kl" in h}
    return trainer, logs


def test_controllers_follow_the_kl_to_the_synced_reference(tiny_model_dir, tmp_path):
    """With `sync_ref_model`, the controllers keep their state and see the KL to the reference in use.

    The reference is replaced by the policy after step 2 (alpha 1), so step 3 measures KL 0 and the stepwise
    controller lowers β for step 4 (× 0.75), where the run without sync raises it (× 1.5). β is never reset.
    """
    _, synced = _sync_run(tiny_model_dir, tmp_path, sync=True)
    _, plain = _sync_run(tiny_model_dir, tmp_path, sync=False)
    assert synced[2]["adaptive_kl/raw_kl"] == pytest.approx(plain[2]["adaptive_kl/raw_kl"], rel=1e-6)
    assert synced[2]["adaptive_kl/raw_kl"] > 1.5e-3
    assert synced[3]["adaptive_kl/raw_kl"] < 1e-7 < 1.5e-3 < plain[3]["adaptive_kl/raw_kl"]
    beta = {t: synced[t]["adaptive_kl/current_beta"] for t in synced}
    assert beta[1] == pytest.approx(0.1)
    assert beta[2] == pytest.approx(0.075)  # step 1: KL 0 (policy = reference) → × 0.75
    assert beta[3] == pytest.approx(0.1125)  # step 2: KL above 1.5 × target → × 1.5, kept across the sync
    assert beta[4] == pytest.approx(0.084375)  # step 3: KL 0 to the synced reference → × 0.75
    assert plain[4]["adaptive_kl/current_beta"] == pytest.approx(0.16875)


# --- PEFT model with a trained adapter ------------------------------------------------------------------------------


def _trained_adapter_model(model_dir):
    """A PEFT model whose LoRA adapter already changes the model (lora_B ≠ 0), with `target_parameters`."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=2, target_modules=[], target_parameters=["mlp.gate_proj.weight"], init_lora_weights=False)
    return get_peft_model(model, config)


def _build(model, model_dir, tmp_path, peft_config=None):
    return AdaptiveKLGRPOTrainer(
        model=model,
        reward_funcs=[length_reward],
        args=_config(tmp_path, max_steps=1),
        train_dataset=prompt_dataset(),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=peft_config,
    )


def test_warns_when_a_trained_adapter_is_compared_with_the_base(tiny_model_dir, tmp_path, monkeypatch):
    """peft < 0.20 with `target_parameters`: TRL scores the reference with the adapter disabled; we warn."""
    monkeypatch.setattr(peft, "__version__", "0.19.0")
    with pytest.warns(UserWarning, match="reference policy is the base model with the adapter disabled"):
        trainer = _build(_trained_adapter_model(tiny_model_dir), tiny_model_dir, tmp_path)
    assert "ref" not in trainer.model.peft_config


@pytest.mark.parametrize("case", ["adapter copied as reference", "fresh adapter from peft_config"])
def test_no_warning_when_the_reference_matches_the_starting_policy(tiny_model_dir, tmp_path, case):
    """TRL copies a trained adapter as the reference; a fresh LoRA starts equal to the base: no warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*adapter disabled.*", category=UserWarning)
        if case == "adapter copied as reference":
            trainer = _build(_trained_adapter_model(tiny_model_dir), tiny_model_dir, tmp_path)
            assert "ref" in trainer.model.peft_config
        else:
            model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
            trainer = _build(model, tiny_model_dir, tmp_path, LoraConfig(r=2, target_modules=["q_proj"]))
            assert "ref" not in trainer.model.peft_config
    assert any(torch.count_nonzero(p) == 0 for n, p in trainer.model.named_parameters() if "lora_B" in n) == (
        case == "fresh adapter from peft_config"
    )
