"""The training commands, `adaptive-kl grpo` and `adaptive-kl rloo`: TRL's `trl grpo` and `trl rloo` scripts with
`AdaptiveKLGRPOConfig` and `AdaptiveKLRLOOConfig`.

| module | what |
|---|---|
| `command` | its line in the command's parser and its start: Unsloth first when asked for, then the script |
| `grpo` | TRL's GRPO script with our config (recipes, local datasets, reward functions) |
| `rloo` | the same script with RLOO's arguments, config and trainer |

Beside the demo (`adaptive_kl.demo`), which it never imports; the dispatcher `adaptive_kl.console` stands on both.
Importing `command` imports no TRL, so that `--unsloth` can import Unsloth first.
"""
