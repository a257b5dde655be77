"""The wiring of the formula sheet into TRL's `GRPOTrainer`.

| module | what |
|---|---|
| `config` | `AdaptiveKLGRPOConfig`: `GRPOConfig` plus the KL fields, validated at construction |
| `grpo` | `AdaptiveKLGRPOTrainer`: adds β_t·Agg(f(k)) to the host's own loss; the wiring of the collaborators below |
| `rloo_config`, `rloo` | `AdaptiveKLRLOOConfig`, `AdaptiveKLRLOOTrainer`: RLOO's KL penalty in the reward, adapted |
| `hooks` | the seam with TRL: the table of its undocumented names and their accessors, host checks, capture |
| `zero_beta` | the reference skipped, then released, while β is 0 for good |
| `resetter` | reference resets applied to the trainer's models and checkpoints (`reference`: when, and the weights) |
| `rollouts` | each scored generation batch: mean reward, KL in the reward, diversity |
| `monitoring` | the KL statistics per optimizer step (the controller) and per log line (`adaptive_kl/*`) |
| `run_warnings` | the warnings given once per run |
| `state` | the β controller's state in every checkpoint, and the checks on resume |
| `unsloth` | the same term inside Unsloth's memory-efficient GRPO loss |
| `callbacks` | `KLHealthCallback` and `RetentionCallback` |
| `generation` | greedy generation for evaluations beside training |

Nothing is imported here: importing `config` or `grpo` imports TRL, which must come after `import unsloth`.
"""
