"""`adaptive-kl rloo`: TRL's RLOO script with `AdaptiveKLRLOOConfig`, trained end to end on a local model and data."""

from __future__ import annotations

import json
import sys

import pytest

from adaptive_kl.console import main


ROWS = [{"prompt": f"Q: {a}+1=? A: ", "answer": str(a + 1)} for a in range(16)]
RUN = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "4"]
RUN += ["--max_completion_length", "8", "--report_to", "none", "--use_cpu", "true", "--logging_steps", "1"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory with a JSON Lines dataset and a reward module (imported from there, as in TRL)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "my_rloo_rewards", raising=False)
    (tmp_path / "my_rloo_rewards.py").write_text(
        "def longer_is_better(completions, **kwargs):\n    return [len(c) / 10 for c in completions]\n"
    )
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(row) for row in ROWS))
    return tmp_path


def test_a_recipe_trains_with_the_adapted_penalty(workdir, tiny_model_dir, capsys):
    recipe = workdir / "recipe.yaml"
    recipe.write_text(
        f"model_name_or_path: {tiny_model_dir}\ndataset_name: train.jsonl\n"
        "reward_funcs: [my_rloo_rewards:longer_is_better]\n"
        f"output_dir: {workdir / 'out'}\nbeta: 0.1\nkl_adaptation_method: dynamic+clip\nreward_threshold: 0.0\n"
    )
    assert main(["rloo", "--config", str(recipe), *RUN]) == 0
    printed = capsys.readouterr().out
    assert "rewards/longer_is_better/mean" in printed and "adaptive_kl/reward_penalty" in printed
    assert "'adaptive_kl/current_beta': '0.09'" in printed  # decayed once (reward_threshold reached)
    assert (workdir / "out" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--kl_placement", "reward"], "unknown argument 'kl_placement'"),
        (["--kl_estimator", "k3+"], "kl_estimator must be one of"),
        (["--unsloth", "true"], "unknown argument 'unsloth'"),
    ],
)
def test_bad_inputs_are_usage_errors(workdir, tiny_model_dir, capsys, argv, message):
    base = ["--model_name_or_path", tiny_model_dir, "--dataset_name", "train.jsonl", "--output_dir", "out"]
    assert main(["rloo", *base, *RUN, *argv]) == 2
    assert message in capsys.readouterr().err


def test_help_lists_the_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "rloo" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["rloo", "--help"])
    printed = capsys.readouterr().out
    assert "--kl_adaptation_method" in printed and "--normalize_advantages" in printed
    assert "--kl_placement" not in printed
