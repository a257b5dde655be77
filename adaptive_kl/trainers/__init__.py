"""The wiring of the formula sheet into TRL's `GRPOTrainer` and `RLOOTrainer`.

One GRPO step reads in three files: `hooks/mixin.py` (what TRL calls), `lifecycle.py` (what both trainers do with a
batch, a micro-batch, a step, a log line) and `grpo.py` or `rloo.py` (what their host differs in: a micro-batch's loss
reads top to bottom in `_loss_and_kl_sums`).

| module | what |
|---|---|
| `kl_fields` | `AdaptiveKLFields`: the KL fields, checks and properties both configs share |
| `config` | `AdaptiveKLGRPOConfig`: `GRPOConfig` plus the KL fields and GRPO's own (placement, mask, diversity) |
| `rloo_config` | `AdaptiveKLRLOOConfig`: `RLOOConfig` plus the KL fields |
| `lifecycle` | `AdaptiveKLRun`, both trainers' base; `KLMonitor`, the KL per step and per log line; β's checkpoints |
| `grpo` | `AdaptiveKLGRPOTrainer`: the KL term added to the host's loss, or its penalty in the reward |
| `rloo` | `AdaptiveKLRLOOTrainer`: RLOO's KL penalty in the reward, adapted |
| `hooks` | the seam with TRL: the table of its undocumented names, the checks of a host, `HostHooks` |
| `unsloth` | the same KL term inside Unsloth's memory-efficient GRPO loss |
| `reference` | the reference model: its resets, the zero-β skip and release, its weights in checkpoints |
| `state` | the β controller's and the resets' state a checkpoint saved, checked on resume |
| `inputs` | checks of what the user hands the trainer: the training dataset's prompts, reward functions' outputs |
| `embedding` | the completion embedders of the diversity metrics, named by the config |
| `scorer` | a plain-torch stand-in for TRL's fused log-probability scorer where it cannot train (a CPU) |
| `callbacks` | `KLHealthCallback` and `RetentionCallback` |
| `generation` | greedy and sampled generation for evaluations beside training |

Nothing is imported here: importing `config` or `grpo` imports TRL, which must come after `import unsloth`.
"""
