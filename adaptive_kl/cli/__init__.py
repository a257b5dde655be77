"""The `adaptive-kl` command (also `python -m adaptive_kl`): the console entry point `main`.

| module | what |
|---|---|
| `command` | the parser and `main`: `demo`, `compare` (the demo package's runner and reports) and `grpo` |
| `grpo` | `adaptive-kl grpo`: TRL's GRPO script with our config (recipes, local datasets, reward functions) |
| `usage` | the command-line checks shared by the subcommands (`UsageError`) |

The top of the package stack: nothing imports it. Importing it imports no TRL, so that `adaptive-kl --unsloth` can
import Unsloth before anything imports TRL.
"""

from .command import main


__all__ = ["main"]
