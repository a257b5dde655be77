"""The wiring of the formula sheet into TRL's `GRPOTrainer` and `RLOOTrainer`.

One scored batch, from TRL's hook to the loss, reads in three files: `hooks/mixin.py` (what TRL calls),
`lifecycle.py` (what both trainers do with it) and `grpo.py` or `rloo.py` (what their host differs in).

| module | what |
|---|---|
| `kl_fields` | `AdaptiveKLFields`: the KL fields, checks and properties both configs share |
| `config` | `AdaptiveKLGRPOConfig`: `GRPOConfig` plus the KL fields and GRPO's own (placement, mask, diversity) |
| `rloo_config` | `AdaptiveKLRLOOConfig`: `RLOOConfig` plus the KL fields |
| `lifecycle` | `AdaptiveKLRun`, both trainers' base: a scored batch (`ScoredBatch`), each micro-batch, step, run |
| `grpo` | `AdaptiveKLGRPOTrainer`: the KL term added to the host's loss, or its penalty in the reward |
| `rloo` | `AdaptiveKLRLOOTrainer`: RLOO's KL penalty in the reward, adapted |
| `hooks` | the seam with TRL: the table of its undocumented names, their readers, the checks of a host, `HostHooks` |
| `unsloth` | the same KL term inside Unsloth's memory-efficient GRPO loss |
| `zero_beta` | the reference skipped, then released, while β is 0 for good |
| `reference` | reference resets: when (`ReferenceResets`), and what a reset does to models and checkpoints |
| `monitoring` | `KLMonitor`: the KL statistics per optimizer step (for β) and per log line (`adaptive_kl/*`) |
| `state` | the β controller's and the resets' state in every checkpoint, and the checks on resume |
| `run_warnings` | the warnings given once per run |
| `inputs` | checks of what the user hands the trainer: the training dataset's prompts, reward functions' outputs |
| `embedding` | the completion embedders of the diversity metrics, named by the config |
| `scorer` | a plain-torch stand-in for TRL's fused log-probability scorer where it cannot train (a CPU) |
| `callbacks` | `KLHealthCallback` and `RetentionCallback` |
| `generation` | greedy and sampled generation for evaluations beside training |

Nothing is imported here: importing `config` or `grpo` imports TRL, which must come after `import unsloth`.
"""
