"""`adaptive-kl grpo`: TRL's `trl grpo` training script, with `AdaptiveKLGRPOConfig` in place of `GRPOConfig`.

    adaptive-kl grpo --config demos/grpo_recipe.yaml                        # a TRL recipe, plus our KL fields
    adaptive-kl grpo --config recipe.yaml --kl_adaptation_method clip --beta 0.04     # flags override the recipe
    adaptive-kl grpo --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name data.jsonl \\
        --reward_funcs my_rewards:correctness --use_peft --unsloth --output_dir out

Arguments are TRL's script's, parsed by `TrlParser` (`--config recipe.yaml`, then flags): its script arguments
(`dataset_name`, `reward_funcs`, ...), the trainer's config (every `GRPOConfig` field and every KL field of
`AdaptiveKLGRPOConfig`), `ModelConfig` (PEFT/LoRA, dtype, quantization) and `DatasetMixtureConfig`, plus `unsloth`
and `unsloth_max_seq_length`. What this script adds to TRL's:

- `dataset_name` may be a local file (JSON Lines, JSON, Parquet, CSV: the `dataset_train_split` split), a local
  directory (of such files, named by split, or saved with `save_to_disk`), or a hub id;
- `reward_funcs` takes this package's task rewards (`format_reward`, `answer_accuracy_reward`), TRL's
  (`accuracy_reward`, `reasoning_accuracy_reward`, `think_format_reward`, `get_soft_overlong_punishment`, with TRL's
  script's settings) and `module.path:function` (or TRL's `module.path.function`) for the user's own;
- `unsloth: true` loads the model with Unsloth's `FastLanguageModel` (a CUDA GPU) and the PEFT flags become its LoRA;
- every input is checked before any model is loaded: a key that is no field, a missing file, an unknown reward
  function or split, a dataset without prompts each end as `adaptive-kl: error: ...` (exit status 2).

Importing this module imports TRL: `adaptive_kl.cli.command` imports Unsloth first when the command asks for it.
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass, field

import torch
import yaml
from trl import DatasetMixtureConfig, ModelConfig, TrlParser, get_dataset, get_peft_config, get_quantization_config
from trl.scripts.grpo import GRPOScriptArguments

from ..tasks import recipe
from ..tasks.policies import resolve_policy
from ..tasks.recipe import RecipeError, load_dataset_dict, resolve_reward_func
from ..trainers.config import AdaptiveKLGRPOConfig
from ..trainers.grpo import AdaptiveKLGRPOTrainer
from ..trainers.hooks import close_progress_bars
from ..trainers.inputs import RewardOutputError
from ..trainers.scorer import install_cpu_scorer_if_needed
from ..usage import UsageError, check_local_path, check_model, closest


PROG = "adaptive-kl grpo"


@dataclass
class AdaptiveKLScriptArguments(GRPOScriptArguments):
    """TRL's GRPO script arguments, plus the Unsloth loader."""

    unsloth: bool = field(
        default=False,
        metadata={"help": "Load the model with Unsloth's FastLanguageModel (a CUDA GPU and adaptive-kl[unsloth])."},
    )
    unsloth_max_seq_length: int = field(
        default=2048,
        metadata={"help": "unsloth: the longest prompt + completion, in tokens, that FastLanguageModel prepares for."},
    )


DATACLASSES = (AdaptiveKLScriptArguments, AdaptiveKLGRPOConfig, ModelConfig, DatasetMixtureConfig)


@dataclass(frozen=True)
class TrainingScript:
    """A training command built on TRL's script: its name, `TrlParser`'s dataclasses (script arguments, the trainer's
    config, `ModelConfig`, `DatasetMixtureConfig`) and its trainer. `adaptive-kl rloo` (`adaptive_kl.cli.rloo`) is
    this script with RLOO's."""

    prog: str
    dataclass_types: tuple
    trainer_cls: type


GRPO_SCRIPT = TrainingScript(PROG, DATACLASSES, AdaptiveKLGRPOTrainer)


# --- reward functions and data --------------------------------------------------------------------------------------


def reward_funcs_of(script_args) -> list:
    """Reward model and functions, in TRL's script's order: the reward model first."""
    funcs = [script_args.reward_model_name_or_path] if script_args.reward_model_name_or_path else []
    try:
        funcs += [resolve_reward_func(spec) for spec in script_args.reward_funcs or []]
    except RecipeError as error:
        raise UsageError(f"reward_funcs {error}") from None
    if not funcs:
        raise UsageError(
            "no reward: give reward_funcs (e.g. --reward_funcs format_reward answer_accuracy_reward) or "
            "reward_model_name_or_path"
        )
    return funcs


def load_datasets(script_args, dataset_args):
    """The dataset dictionary of the run, as TRL's script picks it (`datasets` mixture first, else `dataset_name`)."""
    if dataset_args.datasets:
        return get_dataset(dataset_args)
    name = script_args.dataset_name
    if not name:
        raise UsageError("no data: give dataset_name (a local file or directory, or a hub id) or a datasets mixture")
    check_local_path("dataset_name", name)
    try:
        return load_dataset_dict(
            name, script_args.dataset_train_split, script_args.dataset_config, script_args.dataset_streaming
        )
    except RecipeError as error:
        raise UsageError(f"dataset_name {error}") from None


def split_of(dataset_dict, split: str, option: str, name: str):
    try:
        return recipe.split_of(dataset_dict, split, name)
    except RecipeError as error:
        raise UsageError(f"{option} {error}") from None


# --- the run ---------------------------------------------------------------------------------------------------------


def parse(argv: list[str], script: TrainingScript = GRPO_SCRIPT):
    """`(script_args, training_args, model_args, dataset_args)`; every bad input raises `UsageError`."""
    parser = TrlParser(script.dataclass_types, prog=script.prog)
    known = {f.name for cls in script.dataclass_types for f in dataclasses.fields(cls)}
    try:
        *parsed, from_recipe, from_flags = parser.parse_args_and_config(
            argv, return_remaining_strings=True, separate_remaining_strings=True
        )
    except FileNotFoundError as error:
        raise UsageError(f"--config {error.filename}: no such file") from None
    except yaml.YAMLError as error:
        raise UsageError(f"--config: not valid YAML ({str(error).splitlines()[0]})") from None
    except (ValueError, TypeError, ImportError) as error:  # a config's own checks (our fields and TRL's)
        raise UsageError(str(error)) from None
    for source, remaining in (("recipe key", from_recipe), ("argument", from_flags)):
        for token in remaining:
            if token.startswith("--"):
                key = token[2:].split("=")[0].replace("-", "_")
                raise UsageError(f"unknown {source} {key!r}: not a field of {script.prog}{closest(key, known)}")
        if remaining:
            raise UsageError(f"unexpected {source}s {remaining}")
    return parsed


def load_unsloth_model(script_args, training_args, model_args):
    """`(model, tokenizer)` from Unsloth's `FastLanguageModel`; LoRA from the PEFT flags when `use_peft`."""
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_args.model_name_or_path,
        max_seq_length=script_args.unsloth_max_seq_length,
        load_in_4bit=model_args.load_in_4bit,
        load_in_8bit=model_args.load_in_8bit,
        full_finetuning=not model_args.use_peft,
    )
    if model_args.use_peft:
        model = FastLanguageModel.get_peft_model(
            model,
            r=model_args.lora_r,
            lora_alpha=model_args.lora_alpha,
            lora_dropout=model_args.lora_dropout,
            target_modules=model_args.lora_target_modules
            or ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            random_state=training_args.seed,
        )
    return model, tokenizer


def build_trainer(script_args, training_args, model_args, dataset_args, script: TrainingScript = GRPO_SCRIPT):
    """Checks the inputs (`UsageError`), then builds `script`'s trainer as TRL's script does."""
    if model_args.model_name_or_path is None:
        raise UsageError("no model: give model_name_or_path (a local directory or a hub id)")
    check_model("model_name_or_path", model_args.model_name_or_path)
    model_args.model_name_or_path = resolve_policy(model_args.model_name_or_path)  # a named policy: its local path
    reward_funcs = reward_funcs_of(script_args)
    data = load_datasets(script_args, dataset_args)
    source = script_args.dataset_name or "the datasets mixture"
    train = split_of(data, script_args.dataset_train_split, "dataset_train_split", source)
    # TRL's script takes the test split for evaluation; the drift controller measures on it (its held-out prompts)
    evaluate = training_args.eval_strategy != "no" or getattr(training_args, "kl_controller", None) == "drift"
    eval_dataset = split_of(data, script_args.dataset_test_split, "dataset_test_split", source) if evaluate else None
    if getattr(train, "num_rows", None) == 0:
        raise UsageError(f"the {script_args.dataset_train_split!r} split of {source} has no rows")
    if isinstance(script_args, AdaptiveKLScriptArguments) and script_args.unsloth:  # Unsloth applies the PEFT flags
        (model, processing_class), peft_config, quantization_config = (
            load_unsloth_model(script_args, training_args, model_args),
            None,
            None,
        )
    else:  # TRL loads the model from its path, with the model arguments as TRL's script passes them
        model, processing_class = model_args.model_name_or_path, None
        peft_config, quantization_config = get_peft_config(model_args), get_quantization_config(model_args)
        from_model_args = dict(
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
            attn_implementation=model_args.attn_implementation,
            dtype=model_args.dtype,
        )  # the recipe's own model_init_kwargs win, as in TRL's script
        training_args.model_init_kwargs = {**from_model_args, **(training_args.model_init_kwargs or {})}
    try:
        return script.trainer_cls(
            model=model,
            reward_funcs=reward_funcs,
            args=training_args,
            train_dataset=train,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            peft_config=peft_config,
            quantization_config=quantization_config,
        )
    except ValueError as error:  # the trainer's checks of the data (and TRL's of its arguments), before training
        raise UsageError(str(error)) from None


def close_processes(trainer) -> None:
    """Ends the run on every process together. Ranks pass a barrier first, then drop the DDP wrapper (its reducer holds
    the process group) while the group still serves them, then destroy the group. On gloo (CPU), a rank whose
    reducer outlived the group it shared with a rank that had already exited hung in the group's destructor."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    trainer.accelerator.wait_for_everyone()
    trainer.model_wrapped = trainer.model  # drops the DDP wrapper, which holds the process group
    trainer.accelerator.free_memory()  # releases accelerate's references to the prepared (wrapped) model
    gc.collect()
    trainer.accelerator.wait_for_everyone()
    if hasattr(trainer, "end"):  # Transformers >= 5.18: finishes the trackers too
        trainer.end()
    else:
        torch.distributed.destroy_process_group()


def main(argv: list[str], script: TrainingScript = GRPO_SCRIPT) -> int:
    """Runs `adaptive-kl grpo` (the `argv` after `grpo`), or another `script`; a bad input raises `UsageError` before
    any training."""
    script_args, training_args, model_args, dataset_args = parse(argv, script)
    # TRL 1.15's fused scorer needs a GPU: a stand-in when training runs on a CPU, never on a GPU
    install_cpu_scorer_if_needed("cpu" if training_args.use_cpu else None)
    trainer = build_trainer(script_args, training_args, model_args, dataset_args, script)
    try:
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    except RewardOutputError as error:  # found on the first batch a reward function scores
        close_progress_bars(trainer)  # the interrupted progress bar, before the message
        raise UsageError(str(error)) from None
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"Training completed; model saved to {training_args.output_dir}.")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    close_processes(trainer)
    return 0
