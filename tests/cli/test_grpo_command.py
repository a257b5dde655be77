"""`adaptive-kl grpo`: TRL's GRPO script with our config, trained end to end on a local model and local data."""

from __future__ import annotations

import json
import os
import sys
import types

import datasets
import pytest
import torch
from repo_paths import REPO
from safetensors.torch import load_file
from tiny import launch_two_processes

from adaptive_kl.cli import grpo as grpo_command
from adaptive_kl.cli.command import grpo_asks_for_unsloth
from adaptive_kl.console import main
from adaptive_kl.usage import UsageError


RECIPE = os.path.join(REPO, "demos", "grpo_recipe.yaml")
ROWS = [{"prompt": f"Q: Ann has {a} pens and gets 1 more. How many pens does Ann have? A: ", "answer": str(a + 1)}
        for a in range(1, 17)]  # fmt: skip


def tensors(directory: str, name: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(directory, name))


def test_example_recipe_trains_and_logs_adaptive_kl(tmp_path, capsys, monkeypatch):
    """The shipped recipe, as the README runs it from the repository root (its paths are relative to it)."""
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    assert main(["grpo", "--config", RECIPE, "--max_steps", "2", "--output_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "'adaptive_kl/current_beta': '0.1'" in printed and "adaptive_kl/clip_fraction" in printed
    assert "rewards/answer_accuracy_reward/mean" in printed
    start = tensors(os.path.join(REPO, "adaptive_kl", "demo", "reference_policy"), "model.safetensors")
    trained = tensors(str(out), "model.safetensors")
    assert any(not torch.equal(start[k], trained[k]) for k in start), "two optimizer steps left the policy unchanged"


TRL_STYLE_RECIPE = """\
# A recipe in the format of TRL's examples/cli_configs: `trl grpo --config recipe.yaml`
env:
  ADAPTIVE_KL_RECIPE_TEST: from-the-recipe

model_name_or_path:
  {model}
model_revision: main
dtype: float32
use_peft: true
lora_r: 8
lora_alpha: 16
lora_target_modules:
  - q_proj
  - v_proj

dataset_name:
  {data}
reward_funcs:
  - my_rewards:longer_is_better
  - format_reward

output_dir: {out}
report_to:
  none
learning_rate:
  0.001
lr_scheduler_type:
  cosine
max_steps: 2
per_device_train_batch_size: 8
num_generations: 4
max_completion_length: 8
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
use_cpu: true
bf16: false
logging_steps: 1
save_strategy: "no"

beta: 0.05
kl_adaptation_method: sigmoid
kl_target: 0.02
"""


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv"])
def test_trl_recipe_with_lora_a_user_reward_and_a_local_file(tmp_path, capsys, monkeypatch, tiny_model_dir, suffix):
    monkeypatch.chdir(tmp_path)  # `module:function` rewards are imported from the working directory, as in TRL
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    (tmp_path / "my_rewards.py").write_text(
        "def longer_is_better(completions, **kwargs):\n    return [len(c) / 10 for c in completions]\n"
    )
    data = tmp_path / f"train{suffix}"
    frame = datasets.Dataset.from_list(ROWS)
    {".jsonl": frame.to_json, ".parquet": frame.to_parquet, ".csv": frame.to_csv}.get(suffix, lambda p: None)(
        str(data)
    )
    if suffix == ".json":
        data.write_text(json.dumps(ROWS))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(TRL_STYLE_RECIPE.format(model=tiny_model_dir, data=data, out=tmp_path / "out"))
    monkeypatch.delenv("ADAPTIVE_KL_RECIPE_TEST", raising=False)
    assert main(["grpo", "--config", str(recipe)]) == 0
    printed = capsys.readouterr().out
    assert os.environ["ADAPTIVE_KL_RECIPE_TEST"] == "from-the-recipe"
    assert "rewards/longer_is_better/mean" in printed and "adaptive_kl/current_beta" in printed
    adapter = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["q_proj", "v_proj"] and adapter["r"] == 8


def test_flags_override_the_recipe(monkeypatch):
    monkeypatch.chdir(REPO)
    script, config, model, _ = grpo_command.parse(
        ["--config", RECIPE, "--beta", "0.02", "--kl_estimator", "k2", "--reward_funcs", "format_reward"]
    )
    assert (config.beta, config.kl_estimator, config.kl_adaptation_method) == (0.02, "k2", "clip")
    assert script.reward_funcs == ["format_reward"] and model.model_name_or_path.endswith("reference_policy")


def test_local_dataset_forms(tmp_path):
    frame = datasets.Dataset.from_list(ROWS)
    (tmp_path / "split_files").mkdir()
    frame.to_json(str(tmp_path / "split_files" / "train.jsonl"))
    frame.select(range(4)).to_json(str(tmp_path / "split_files" / "test.jsonl"))
    frame.save_to_disk(str(tmp_path / "saved_dataset"))
    datasets.DatasetDict({"train": frame, "test": frame.select(range(3))}).save_to_disk(str(tmp_path / "saved_dict"))
    script = types.SimpleNamespace(dataset_train_split="train", dataset_config=None, dataset_streaming=False)
    mixture = types.SimpleNamespace(datasets=[])
    expected = {
        "split_files": {"train": 16, "test": 4},
        "saved_dataset": {"train": 16},
        "saved_dict": {"train": 16, "test": 3},
    }
    for name, sizes in expected.items():
        script.dataset_name = str(tmp_path / name)
        loaded = grpo_command.load_datasets(script, mixture)
        assert {split: len(loaded[split]) for split in loaded} == sizes, name
        assert loaded["train"][0] == ROWS[0]


def test_reward_functions_by_name_path_and_trl_name(tmp_path, monkeypatch):
    from trl.rewards import think_format_reward

    from adaptive_kl.tasks import format_reward

    monkeypatch.chdir(tmp_path)
    (tmp_path / "user_rewards.py").write_text(
        "def exact(completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.delitem(sys.modules, "user_rewards", raising=False)
    resolve = grpo_command.resolve_reward_func
    assert resolve("format_reward") is format_reward
    assert resolve("think_format_reward") is think_format_reward
    assert resolve("user_rewards:exact")(completions=["a", "b"]) == [1.0, 1.0]
    assert resolve("user_rewards.exact") is resolve("user_rewards:exact")  # TRL's dotted form
    overlong = resolve("get_soft_overlong_punishment")  # TRL's script's settings: 1280 tokens, 256 soft
    assert overlong(completion_ids=[[0] * 1024, [0] * 1280, [0] * 1152]) == [0.0, -1.0, -0.5]
    answer = resolve("answer_accuracy_reward")
    assert answer(completions=["1+2=3 #### 3", "#### 4"], answer=["3", "3"]) == [1.0, 0.0]


def test_unsloth_is_detected_before_trl_is_imported(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("unsloth: true\n")
    assert grpo_asks_for_unsloth(["--unsloth"]) and grpo_asks_for_unsloth(["--unsloth", "true", "--x", "1"])
    assert grpo_asks_for_unsloth(["--unsloth=True"]) and grpo_asks_for_unsloth(["--config", str(recipe)])
    assert not grpo_asks_for_unsloth(["--unsloth", "false"]) and not grpo_asks_for_unsloth(
        ["--config", str(recipe), "--unsloth", "false"]
    )
    assert not grpo_asks_for_unsloth(["--config", str(tmp_path / "missing.yaml")])


def test_unsloth_loader_maps_the_peft_flags(monkeypatch):
    """The FastLanguageModel calls made from TRL's ModelConfig (Unsloth itself needs a GPU: a recording stand-in)."""
    calls = []

    class FastLanguageModel:
        @staticmethod
        def from_pretrained(name, **kwargs):
            calls.append(("from_pretrained", name, kwargs))
            return "model", "tokenizer"

        @staticmethod
        def get_peft_model(model, **kwargs):
            calls.append(("get_peft_model", model, kwargs))
            return "peft-model"

    monkeypatch.setitem(sys.modules, "unsloth", types.SimpleNamespace(FastLanguageModel=FastLanguageModel))
    script, config, model_args, _ = grpo_command.parse(
        ["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--output_dir", "o", "--use_cpu", "--bf16", "false",
         "--use_peft", "--lora_r", "32", "--lora_alpha", "64", "--load_in_4bit", "--unsloth_max_seq_length", "1024"]
    )  # fmt: skip
    assert grpo_command.load_unsloth_model(script, config, model_args) == ("peft-model", "tokenizer")
    (_, name, loading), (_, _, lora) = calls
    assert name == "Qwen/Qwen2.5-0.5B-Instruct"
    assert loading == dict(max_seq_length=1024, load_in_4bit=True, load_in_8bit=False, full_finetuning=False)
    assert (lora["r"], lora["lora_alpha"], lora["random_state"]) == (32, 64, config.seed)


def test_help_lists_the_command_and_every_kl_field(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0 and "grpo" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["grpo", "--help"])
    shown = capsys.readouterr().out
    assert exit_info.value.code == 0
    for flag in ("--kl_adaptation_method", "--kl_controller", "--diversity_embedder", "--reward_funcs", "--use_peft"):
        assert flag in shown


def test_usage_errors_are_raised_before_loading_anything(monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(UsageError, match="did you mean 'kl_estimator'"):
        grpo_command.parse(["--config", RECIPE, "--kl_estimater", "k2"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("how", [["--unsloth"], ["--unsloth", "true"], ["--config", "RECIPE"]])
def test_unsloth_without_gpu_is_refused_before_trl_loads_anything(tmp_path, capsys, how):
    recipe = tmp_path / "unsloth.yaml"
    recipe.write_text(f"unsloth: true\nmodel_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\noutput_dir: {tmp_path}\n")
    argv = [str(recipe) if token == "RECIPE" else token for token in how]
    assert main(["grpo", *argv]) == 2
    assert capsys.readouterr().err == (
        "adaptive-kl: error: --unsloth needs a CUDA GPU, and none is available here; drop --unsloth to use plain TRL\n"
    )


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with the gloo backend is not available",
)
def test_accelerate_launch_on_two_processes(tmp_path, monkeypatch):
    """`accelerate launch -m adaptive_kl grpo ...`, as TRL's script is launched: both ranks train and exit cleanly."""
    monkeypatch.chdir(REPO)  # the recipe's paths are relative to the repository root; the launch inherits it
    out = tmp_path / "out"
    result = launch_two_processes(
        "-m", "adaptive_kl", "grpo", "--config", RECIPE, "--max_steps", "2", "--output_dir", str(out)
    )
    assert result.stdout.count("Training completed") == 1  # printed by the main process only
    assert (out / "model.safetensors").is_file()
