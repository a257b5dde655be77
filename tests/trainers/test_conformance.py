"""Drop-in conformance: every GRPO feature of TRL that runs on a CPU, run by stock `GRPOTrainer` and by ours.

Each row of `FEATURES` is one feature: the config fields and trainer arguments that turn it on. For every row the
same tiny model, data and seed train for 2 steps three times, and must agree:

- stock TRL refuses the input (at construction or in training) → ours refuses it with the same exception type, with
  every new field at its default and with adaptation on;
- stock TRL trains → ours, every new field at its default, logs every value stock logs, exactly equal, at every step
  (the loss, gradient norm, reward, TRL's `kl`, `policy_loss`, ...: all but the wall-clock `step_time`), adding only
  its own `adaptive_kl/*`; ours with adaptation on (`clip+dynamic`, `kl_scaling="log"`) finishes with finite
  `adaptive_kl/*` metrics.

`RLOO_FEATURES` does the same for `RLOOTrainer` and `AdaptiveKLRLOOTrainer`. Adding a TRL feature is one row. Left
out, with the reason (`LEFT_OUT`): what needs a GPU, a download or a model this suite cannot build offline. Fields
were enumerated from TRL's `GRPOConfig` and `GRPOTrainer.__init__` (1.15, 1.16), and `RLOOConfig`, `RLOOTrainer`.
"""

from __future__ import annotations

import asyncio
import math
import os

import pytest
import torch
from datasets import Dataset, IterableDataset, IterableDatasetDict
from peft import LoraConfig
from tiny import CHAT_TEMPLATE, TRAIN_KWARGS, length_reward
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification
from trl import GRPOConfig, GRPOTrainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.kl.aggregation import LOSS_TYPES


BETA = 0.1
ADAPTATION = dict(kl_adaptation_method="clip+dynamic", kl_scaling="log", reward_threshold=0.0)
OURS = "adaptive_kl/"  # the only keys ours logs that stock does not
CLOCK = ("step_time",)  # measured, not computed


def standard_rows(n: int = 16) -> list[dict]:
    return [{"prompt": f"{i}+{i % 7}=", "answer": str(i + i % 7)} for i in range(n)]


def conversational_rows(n: int = 16) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"{i}+{i % 7}="}], "answer": str(i + i % 7)} for i in range(n)]


def iterable(rows_fn):
    def make():
        rows = rows_fn()
        return IterableDataset.from_generator(lambda: iter(rows))

    return make


def iterable_split(rows_fn):
    def make():
        rows = rows_fn()
        return IterableDatasetDict({"train": IterableDataset.from_generator(lambda: iter(rows))})["train"]

    return make


def digit_reward(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in str(c))) for c in completions]


async def async_length_reward(completions, **kwargs):
    await asyncio.sleep(0)
    return length_reward(completions)


def reward_model_dir(root: str) -> str:
    """A tiny sequence-classification model and the tiny tokenizer, saved (TRL loads a reward model by path)."""
    path = os.path.join(root, "reward-model")
    if not os.path.isdir(path):
        from adaptive_kl.testing.tiny_model import build_tokenizer

        tokenizer = build_tokenizer()
        torch.manual_seed(3)
        config = Qwen2Config(
            vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        Qwen2ForSequenceClassification(config).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


# name → {"config": fields, "data": dataset factory, "trainer": extra trainer kwargs (callables get the tmp dir),
#         "rewards": reward functions (a callable of the tmp dir for models), "chat": set a chat template}
FEATURES = {
    "map-style dataset": {},
    "iterable dataset": {"data": iterable(standard_rows), "config": {"max_steps": 2}},
    "iterable dataset from an IterableDatasetDict": {"data": iterable_split(standard_rows),
                                                     "config": {"max_steps": 2}},
    "iterable dataset without max_steps (refused)": {"data": iterable(standard_rows), "config": {"max_steps": -1}},
    "conversational prompts": {"data": conversational_rows, "chat": True},
    "conversational, iterable": {"data": iterable(conversational_rows), "chat": True},
    "chat_template_kwargs": {"data": conversational_rows, "chat": True,
                             "config": {"chat_template_kwargs": {"enable_thinking": False}}},
    "eval dataset, eval_strategy=steps": {
        "config": {"eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 4},
        "trainer": {"eval_dataset": lambda root: Dataset.from_list(standard_rows(4))},
    },
    "several reward functions with reward_weights": {"rewards": [length_reward, digit_reward],
                                                     "config": {"reward_weights": [1.0, 0.5]}},
    "reward model with its own tokenizer": {
        "rewards": lambda root: [reward_model_dir(root), length_reward],
        "trainer": {"reward_processing_classes": lambda root: [AutoTokenizer.from_pretrained(reward_model_dir(root)),
                                                              None]},
    },
    "async reward function": {"rewards": [async_length_reward]},
    "num_iterations=2": {"config": {"num_iterations": 2}},
    "steps_per_generation=2": {"config": {"steps_per_generation": 2}},
    "gradient_accumulation_steps=2": {"config": {"gradient_accumulation_steps": 2}},
    "scale_rewards=batch": {"config": {"scale_rewards": "batch"}},
    "scale_rewards=none": {"config": {"scale_rewards": "none"}},
    "mask_truncated_completions": {"config": {"mask_truncated_completions": True}},
    "top_entropy_quantile=0.5": {"config": {"top_entropy_quantile": 0.5}},
    "importance_sampling_level=sequence": {"config": {"importance_sampling_level": "sequence"}},
    "epsilon_high": {"config": {"epsilon_high": 0.28}},
    "delta (two-sided clipping)": {"config": {"delta": 1.5}},
    "sync_ref_model": {"config": {"sync_ref_model": True, "ref_model_sync_steps": 1, "ref_model_mixup_alpha": 0.5}},
    "PEFT (reference: adapter disabled)": {"trainer": {"peft_config": lambda root: LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")}},
    "generation_kwargs": {"config": {"generation_kwargs": {"top_k": 5}}},
    "temperature 0.7, top_p 0.9": {"config": {"temperature": 0.7, "top_p": 0.9}},
    "num_generations=1 (refused)": {"config": {"num_generations": 1, "per_device_train_batch_size": 4}},
    "batch not divisible by num_generations (refused)": {"config": {"num_generations": 3}},
    **{
        f"loss_type={loss_type}": {"config": {"loss_type": loss_type,
                                              **({"importance_sampling_level": "sequence"} if loss_type == "luspo"
                                                 else {})}}
        for loss_type in LOSS_TYPES
    },
}  # fmt: skip
LEFT_OUT = {
    "vLLM generation (use_vllm)": "needs a GPU and the vllm package",
    "Liger loss (use_liger_kernel)": "Liger's fused kernels need a GPU (Triton)",
    "multimodal prompts": "needs a vision-language model; none can be built offline small enough for this suite",
    "tools / environment_factory": "TRL renders tools through a chat template with tool support, which the tiny "
    "tokenizer lacks; the early data check accepts environment-owned data without prompts as TRL does "
    "(test_environment_owned_data_without_prompts_is_accepted)",
    "torch_compile": "compiling is out of this suite's budget on a 2-core CPU",
    "DeepSpeed, FSDP": "tests/trainers/test_multiprocess.py runs DDP; DeepSpeed and FSDP need GPUs",
}


def build(cls, config_cls, tiny_model_dir, tmp_path, feature: dict, **extra):
    root = str(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    if feature.get("chat"):
        tokenizer.chat_template = CHAT_TEMPLATE
    fields = {**TRAIN_KWARGS, "max_steps": 2, "beta": BETA, **feature.get("config", {}), **extra}
    args = config_cls(output_dir=os.path.join(root, f"out-{cls.__name__}"), **fields)
    rewards = feature.get("rewards", [length_reward])
    rewards = rewards(root) if callable(rewards) else list(rewards)
    data = feature.get("data", standard_rows)()
    train = data if isinstance(data, IterableDataset) else Dataset.from_list(data)
    more = {k: (v(root) if callable(v) else v) for k, v in feature.get("trainer", {}).items()}
    return cls(model=tiny_model_dir, reward_funcs=rewards, args=args, train_dataset=train,
               processing_class=tokenizer, **more)  # fmt: skip


def assert_logs_stock(ours: list[dict], stock: list[dict]) -> None:
    """Every step's log of ours holds exactly stock's values (NaN where stock's is NaN), and nothing else but
    `adaptive_kl/*`."""
    assert len(ours) == len(stock) >= 1
    for step, (mine, theirs) in enumerate(zip(ours, stock, strict=True), 1):
        own = {key for key in mine if key.startswith(OURS)}
        assert set(mine) - own == set(theirs), (step, set(mine) ^ set(theirs))
        for key, value in theirs.items():
            if key in CLOCK:
                continue
            same = mine[key] == value or (isinstance(value, float) and math.isnan(value) and math.isnan(mine[key]))
            assert same, (step, key, mine[key], value)


def outcome(cls, config_cls, tiny_model_dir, tmp_path, feature, **extra):
    """The run's logs per step, or the exception it raised (at construction or in training)."""
    torch.manual_seed(0)
    try:
        trainer = build(cls, config_cls, tiny_model_dir, tmp_path, feature, **extra)
        trainer.train()
    except Exception as error:  # noqa: BLE001  (the outcome to compare is the exception type itself)
        return error
    return [entry for entry in trainer.state.log_history if "loss" in entry and "step" in entry]


@pytest.mark.parametrize("name", list(FEATURES))
def test_feature_behaves_as_in_stock_trl(name, tiny_model_dir, tmp_path):
    feature = FEATURES[name]
    stock = outcome(GRPOTrainer, GRPOConfig, tiny_model_dir, tmp_path / "stock", feature)
    ours = outcome(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, tmp_path / "ours", feature)
    adapted = outcome(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, tmp_path / "adapted", feature, **ADAPTATION
    )
    if isinstance(stock, Exception):
        assert "(refused)" in name, f"stock TRL failed on a feature expected to train: {stock!r}"
        assert type(ours) is type(stock), f"stock raised {stock!r}, ours gave {ours!r}"
        assert type(adapted) is type(stock), f"stock raised {stock!r}, ours (adapted) gave {adapted!r}"
        return
    assert "(refused)" not in name, "stock TRL trained on an input this row expects it to refuse"
    assert not isinstance(ours, Exception), f"stock trained, ours raised {ours!r}"
    assert not isinstance(adapted, Exception), f"stock trained, ours (adapted) raised {adapted!r}"
    assert_logs_stock(ours, stock)
    last = adapted[-1]
    metrics = {k: v for k, v in last.items() if k.startswith("adaptive_kl/")}
    assert metrics and all(math.isfinite(v) for v in metrics.values()), metrics


def test_left_out_features_are_named_with_a_reason():
    assert all(reason for reason in LEFT_OUT.values())
    assert not set(LEFT_OUT) & set(FEATURES)


def test_an_empty_prompt_in_a_stream_is_named_when_drawn(tiny_model_dir, tmp_path):
    """A streaming dataset is not read ahead (construction succeeds, as in stock TRL); an empty prompt is refused with
    the map-style dataset's message when training draws it, before it reaches generation."""
    rows = [dict(row, prompt="") if i else row for i, row in enumerate(standard_rows(8))]  # all but the first
    feature = {"data": iterable(lambda: rows), "config": {"max_steps": 2}}
    trainer = build(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, tmp_path, feature)
    with pytest.raises(ValueError, match=r"train_dataset has \d+ empty prompt\(s\) \(in a drawn batch"):
        trainer.train()


def test_environment_owned_data_without_prompts_is_accepted():
    """With an `environment_factory`, TRL accepts a dataset without a `prompt` column (each `reset()` supplies the
    prompt: e.g. only an `environment` column routing rows); the early check refuses it only without one."""
    from adaptive_kl.trainers.inputs import check_train_dataset

    routing = Dataset.from_dict({"environment": ["maze", "math"]})
    check_train_dataset(routing, environment=True)
    check_train_dataset([{"environment": "maze"}], environment=True)
    with pytest.raises(ValueError, match="no 'prompt' column"):
        check_train_dataset(routing)
    with pytest.raises(ValueError, match="empty prompt"):  # prompts it does have are still checked
        check_train_dataset(Dataset.from_dict({"prompt": ["", "1+1="]}), environment=True)


# --- RLOO ------------------------------------------------------------------------------------------------------------

# The rows of `FEATURES` that `RLOOTrainer` has (it has no loss_type, scale_rewards, importance sampling level,
# top_entropy_quantile or delta), and RLOO's own options. Ours, every new field at its default, logs what stock logs,
# exactly; adapted, it trains with finite `adaptive_kl/*` metrics.
RLOO_FEATURES = {
    **{name: FEATURES[name] for name in (
        "map-style dataset", "iterable dataset", "iterable dataset without max_steps (refused)",
        "conversational prompts", "chat_template_kwargs", "eval dataset, eval_strategy=steps",
        "several reward functions with reward_weights", "reward model with its own tokenizer", "async reward function",
        "num_iterations=2", "steps_per_generation=2", "gradient_accumulation_steps=2", "mask_truncated_completions",
        "epsilon_high", "sync_ref_model", "PEFT (reference: adapter disabled)", "generation_kwargs",
        "temperature 0.7, top_p 0.9", "num_generations=1 (refused)",
        "batch not divisible by num_generations (refused)",
    )},
    "normalize_advantages": {"config": {"normalize_advantages": True}},
    "reward_clip_range": {"config": {"reward_clip_range": (0.0, 0.1)}},
}  # fmt: skip


@pytest.mark.parametrize("name", list(RLOO_FEATURES))
def test_rloo_feature_behaves_as_in_stock_trl(name, tiny_model_dir, tmp_path):
    from trl import RLOOConfig, RLOOTrainer

    from adaptive_kl import AdaptiveKLRLOOConfig, AdaptiveKLRLOOTrainer

    feature = RLOO_FEATURES[name]
    stock = outcome(RLOOTrainer, RLOOConfig, tiny_model_dir, tmp_path / "stock", feature)
    ours = outcome(AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path / "ours", feature)
    adapted = outcome(
        AdaptiveKLRLOOTrainer, AdaptiveKLRLOOConfig, tiny_model_dir, tmp_path / "adapted", feature, **ADAPTATION
    )
    if isinstance(stock, Exception):
        assert "(refused)" in name, f"stock TRL failed on a feature expected to train: {stock!r}"
        assert type(ours) is type(stock), f"stock raised {stock!r}, ours gave {ours!r}"
        assert type(adapted) is type(stock), f"stock raised {stock!r}, ours (adapted) gave {adapted!r}"
        return
    assert "(refused)" not in name, "stock TRL trained on an input this row expects it to refuse"
    assert not isinstance(ours, Exception), f"stock trained, ours raised {ours!r}"
    assert not isinstance(adapted, Exception), f"stock trained, ours (adapted) raised {adapted!r}"
    assert_logs_stock(ours, stock)
    metrics = {k: v for k, v in adapted[-1].items() if k.startswith("adaptive_kl/")}
    assert metrics and all(math.isfinite(v) for v in metrics.values()), metrics
