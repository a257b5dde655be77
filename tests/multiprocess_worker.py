"""Trains the tiny model with `AdaptiveKLGRPOTrainer` (and `AdaptiveKLRLOOTrainer`) and records, per process, what the
multi-process tests compare.

Run by `tests/trainers/test_multiprocess.py`, once as a plain process and once under
`accelerate launch --multi_gpu --num_processes 2` (on a CPU, with `use_cpu=True`, accelerate runs gloo DDP). Both
runs have the same global batch: the single process takes `PROCESSES` times the per-device batch.

Completions come from a `rollout_func` (TRL's public hook; RLOO, which has none, gets the same completions from an
override of its single-turn generation) that makes each completion a function of its prompt and of its index within
the prompt's group, not of a random draw: sampling consumes each process's random stream differently, so it would give
the two runs different data. Everything else (log-probabilities, rewards, advantages, the loss, the KL term, β) is the
trainer's own.

Usage: python multiprocess_worker.py MODEL_DIR OUT_DIR PER_DEVICE_BATCH [SPLIT]
Writes OUT_DIR/<config>-rank<i>.json and OUT_DIR/<config>-params-rank<i>.pt. SPLIT (default 1) splits each process's
batch of a step into that many more micro-batches (the per-device batch divided by it, the accumulation multiplied):
the same global batch, summed in another order, the control whose spread is the float32 rounding of each quantity.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from datasets import Dataset
from tiny import TRAIN_KWARGS, prompt_dataset
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer, AdaptiveKLRLOOConfig, AdaptiveKLRLOOTrainer
from adaptive_kl.trainers.rloo import REFERENCE_LOGPS, SAMPLING_LOGPS
from adaptive_kl.trainers.scorer import install_cpu_scorer_if_needed


GROUP = 4  # num_generations
STEPS = 4

# One run per entry, in order, in the same processes. Groups never span processes (the per-device batch is a multiple
# of GROUP), and the two token-sum/sequence-mean loss types are those whose loss does not depend on how a batch is
# split across processes.
CONFIGS = {
    "dynamic-sqrt": dict(
        kl_adaptation_method="dynamic+clip",
        kl_clip_threshold=0.05,
        kl_scaling="sqrt",
        dynamic_beta_decay=0.5,
        # The global mean reward of steps 1-4 is 0.242, 0.250, 0.244, 0.256: β decays after steps 2 and 4. Process 0's
        # own rewards would give a decay after step 3 only.
        reward_threshold=0.245,
        loss_type="dapo",
        gradient_accumulation_steps=2,
    ),
    "adaptive": dict(kl_controller="adaptive", target_kl=0.1, kl_horizon=100, loss_type="grpo"),
    "stepwise": dict(kl_controller="stepwise", target_kl=0.002, kl_estimator="k2", loss_type="dapo", beta_max=0.15),
    # KL in the reward: the penalties of both processes enter every group's advantages (gathered in TRL's order).
    "reward-adaptive": dict(
        kl_placement="reward", kl_estimator="k1", kl_controller="adaptive", target_kl=0.1, kl_horizon=100
    ),
    # A reference reset after step 2 (applied before step 3), on every process.
    "resets": dict(kl_controller="adaptive", target_kl=0.1, kl_horizon=100, ref_reset_steps=2),
    # The zero-std KL mask: half the prompts give every completion the same reward, so their groups' KL is left out,
    # decided on the rewards of every process.
    # The package's own term (the mask), with TRL's entropy bonus where TRL has it: its `policy_loss` then carries our
    # term, averaged over the processes as TRL averages its loss. The bonus is a per-process token mean, which a split
    # changes: at 1e-12 it moves the loss by some 1e-14, far below its rounding, so the loss and gradients compare as
    # the split-invariant quantities they are without it.
    "mask": dict(
        kl_mask_zero_std_groups=True,
        kl_controller="adaptive",
        target_kl=0.1,
        kl_horizon=100,
        reward="tied-half",
        **({"entropy_coef": 1e-12} if "entropy_coef" in GRPOConfig.__dataclass_fields__ else {}),
    ),  # fmt: skip
    # The drift controller: the drift of 5 held-out texts (`DRIFT_TEXTS`; one process scores 3, the other 2 and a
    # zero-weight copy), summed over the processes, after steps 2 and 4.
    "drift": dict(kl_controller="drift", target_drift=0.05, drift_every=2, drift_samples=5, beta_max=1.0),
    # RLOO: `dynamic` on the global mean reward, its penalty in the reward (gathered across processes).
    "rloo-dynamic": dict(
        trainer="rloo", kl_adaptation_method="dynamic", dynamic_beta_decay=0.5, reward_threshold=0.245
    ),
    # RLOO with the zero-β skip: β is 0 from step 3 on (`beta_schedule_steps`), and both processes skip the reference.
    "rloo-zero-beta": dict(
        trainer="rloo",
        kl_adaptation_method="dynamic",
        kl_scaling="sqrt",
        beta_schedule_steps=3,
        reward_threshold=10.0,
        kl_monitor_steps=0,
    ),  # fmt: skip
}
# The drift controller's held-out texts: prompts of the training set's form, with completions of its completions' form.
DRIFT_TEXTS = Dataset.from_dict(
    {"prompt": [f"{i}+{i % 3}=" for i in range(5)], "completion": ["77", "1", "333", "5", "2"]}
)
# What a config's `reward` names (default: shorter is better, which varies within every group).
TIED_PROMPTS = "tied-half"


def completion_text(prompt: str, index: int) -> str:
    """A completion fixed by the prompt and its index in the group: 1 to 7 characters, different lengths per group."""
    code = sum(map(ord, prompt))
    return str((code + 3 * index) % 10) * (1 + (code + 5 * index) % 7)


def deterministic_rollout(prompts: list[str], trainer) -> dict:
    tokenizer = trainer.processing_class
    completions = [completion_text(p, i % GROUP) for i, p in enumerate(prompts)]
    return {
        "prompt_ids": [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts],
        "completion_ids": [tokenizer(c, add_special_tokens=False)["input_ids"] for c in completions],
        "logprobs": None,
    }


class Recorder:
    """The raw material of the checks, recorded on this process: rewards, KL sums, β."""

    def __init__(self):
        self.rewards: dict[int, list[float]] = {}  # optimizer step → the rewards computed on this process
        self.kl: dict[
            int, list[float]
        ] = {}  # optimizer step → [tokens, Σ m·k] summed over this process's micro-batches
        self.beta: dict[int, float] = {}  # optimizer step → β_t used in its loss
        self.state: dict[int, dict] = {}  # optimizer step → controller state after it

    tied_prompts: bool = False  # `reward="tied-half"`: prompts with an even character sum give a tied reward

    def reward(self, prompts, completions, trainer_state, **kwargs):
        rewards = [
            0.5 if self.tied_prompts and sum(map(ord, p)) % 2 == 0 else 1.0 / (1.0 + len(c))
            for p, c in zip(prompts, completions)
        ]
        self.rewards.setdefault(trainer_state.global_step + 1, []).extend(rewards)
        return rewards


def record_kl_sums(recorder: Recorder, step: int, log_ratio: torch.Tensor, mask: torch.Tensor, estimator: str):
    """This process's token count and Σ m·k, from the estimator's own formula in float64 (independent of
    adaptive_kl.kl)."""
    r, mask = log_ratio.detach().double(), mask.double()
    k = {"k1": r, "k2": 0.5 * r**2, "k3": torch.exp(-r) + r - 1}[estimator]
    sums = recorder.kl.setdefault(step, [0.0, 0.0])
    sums[0] += mask.sum().item()
    sums[1] += (k * mask).sum().item()


class RecordingTrainer(AdaptiveKLGRPOTrainer):
    recorder: Recorder

    def captured_policy_logps(self, capture, training):
        self.recorded_logps = super().captured_policy_logps(capture, training)  # the log-probabilities the KL reads
        return self.recorded_logps

    def _loss_and_kl_sums(self, model, inputs, *args):
        self.recorded_logps = None
        result = super()._loss_and_kl_sums(model, inputs, *args)
        if self.recorded_logps is not None:  # scored with the reference: the KL's tokens
            log_ratio = self.recorded_logps - inputs["ref_per_token_logps"]
            step = self.state.global_step + 1
            record_kl_sums(self.recorder, step, log_ratio, inputs["completion_mask"], self.args.kl_estimator)
        return result


class RecordingRLOOTrainer(AdaptiveKLRLOOTrainer):
    recorder: Recorder

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields):
        """`deterministic_rollout`'s completions, in place of sampled ones."""
        prompts = self.processing_class.batch_decode(prompt_ids)
        return deterministic_rollout(prompts, self)["completion_ids"]

    def _loss_and_kl_sums(self, model, inputs, *args):
        if REFERENCE_LOGPS in inputs:  # scored with the reference: the penalty's tokens
            log_ratio = inputs[SAMPLING_LOGPS] - inputs[REFERENCE_LOGPS]
            step = self.state.global_step + 1
            record_kl_sums(self.recorder, step, log_ratio, inputs["completion_mask"], self.args.kl_estimator)
        return super()._loss_and_kl_sums(model, inputs, *args)


class StepEnd(TrainerCallback):
    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.recorder.beta[state.global_step] = self.trainer.kl_monitor.last_beta["train"][0]
        self.trainer.recorder.state[state.global_step] = self.trainer.beta_controller.state_dict()


def train(name: str, fields: dict, model_dir: str, out_dir: str, per_device_batch: int, split: int) -> None:
    recorder = Recorder()
    fields = dict(fields)
    fields["gradient_accumulation_steps"] = fields.get("gradient_accumulation_steps", 1) * split
    per_device_batch //= split
    rloo = fields.pop("trainer", "grpo") == "rloo"
    recorder.tied_prompts = fields.pop("reward", None) == TIED_PROMPTS
    config_cls, trainer_cls = (
        (AdaptiveKLRLOOConfig, RecordingRLOOTrainer) if rloo else (AdaptiveKLGRPOConfig, RecordingTrainer)
    )
    args = config_cls(
        **{
            **TRAIN_KWARGS,
            "per_device_train_batch_size": per_device_batch,
            "num_generations": GROUP,
            # Plain SGD: Adam's first steps move every parameter by ±lr whatever its gradient's size, so a
            # rounding-level difference in a near-zero gradient would flip a whole step; SGD keeps it at rounding
            # level.
            "optim": "sgd",
            "learning_rate": 0.5,
            "lr_scheduler_type": "constant",
            "bf16": False,  # TRL's default; on a CPU it means bf16 autocast, whose rounding would hide the comparison
        },
        output_dir=os.path.join(out_dir, name),
        beta=0.1,
        max_steps=STEPS,
        **fields,
    )
    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=[recorder.reward],
        args=args,
        train_dataset=prompt_dataset(64),
        eval_dataset=DRIFT_TEXTS if fields.get("kl_controller") == "drift" else None,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        **({} if rloo else {"rollout_func": deterministic_rollout}),
    )
    trainer.recorder = recorder
    trainer.add_callback(StepEnd(trainer))
    trainer.train()
    rank = trainer.accelerator.process_index
    record = {
        "num_processes": trainer.accelerator.num_processes,
        "rewards": recorder.rewards,
        "kl": recorder.kl,
        "beta": recorder.beta,
        "state": recorder.state,
        "log_history": [h for h in trainer.state.log_history if "step" in h and "loss" in h],
    }
    with open(os.path.join(out_dir, f"{name}-rank{rank}.json"), "w") as f:
        json.dump(record, f)
    params = torch.cat([p.detach().flatten() for p in trainer.accelerator.unwrap_model(trainer.model).parameters()])
    torch.save(params, os.path.join(out_dir, f"{name}-params-rank{rank}.pt"))


def main() -> None:
    model_dir, out_dir, per_device_batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    split = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL
    install_cpu_scorer_if_needed()
    torch.set_num_threads(1)
    for name, fields in CONFIGS.items():
        train(name, fields, model_dir, out_dir, per_device_batch, split)
    if torch.distributed.is_initialized():  # leave together: a rank exiting while gloo serves the other aborts it
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
