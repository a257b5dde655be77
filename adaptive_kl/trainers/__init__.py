"""The wiring of the formula sheet into TRL's `GRPOTrainer`.

| module | what |
|---|---|
| `config` | `AdaptiveKLGRPOConfig`: `GRPOConfig` plus the KL fields, validated at construction |
| `grpo` | `AdaptiveKLGRPOTrainer`: adds β_t·Agg(f(k)) to the host's own loss |
| `hooks` | the seam with TRL: supported versions, host checks, reward and log-probability capture, batch layout |
| `state` | the β controller's state in every checkpoint, and the checks on resume |
| `unsloth` | the same term inside Unsloth's memory-efficient GRPO loss |
| `callbacks` | `KLHealthCallback` and `RetentionCallback` |
| `generation` | greedy generation for evaluations beside training |

Nothing is imported here: importing `config` or `grpo` imports TRL, which must come after `import unsloth`.
"""
