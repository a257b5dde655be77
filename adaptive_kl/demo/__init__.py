"""The `adaptive-kl` command and what it runs: the embedded task and policy, variants, the runner and reports, and
the TRL-style training script.

| module | what |
|---|---|
| `cli` | the `adaptive-kl` command (`demo`, `compare`, `grpo`) |
| `grpo_script` | `adaptive-kl grpo`: TRL's GRPO script with our config (recipes, local datasets, reward functions) |
| `usage` | the command-line checks shared by the subcommands (`UsageError`) |
| `task/` | the math task: problems, answer extraction, rewards, the GSM8K loader, accuracy |
| `embedded` | the shipped reference policy (`reference_policy/`) and the task's datasets |
| `variants` | the variants a comparison trains, from command-line values to configs |
| `runner` | trains and evaluates each variant |
| `report` | the summary table, CSV and plots |

The top of the package stack: it uses the library, which never imports it. Names are imported on first use, so
`adaptive-kl --unsloth` can import Unsloth before anything imports TRL.
"""

import importlib


_EXPORTS = {
    "DEMO_METHODS": "variants",
    "Variant": "variants",
    "method_variants": "variants",
    "variant_grid": "variants",
    "DemoSettings": "runner",
    "VariantRun": "runner",
    "run_comparison": "runner",
    "run_variant": "runner",
    "summary_table": "report",
    "write_report": "report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
