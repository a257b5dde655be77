"""What the `adaptive-kl demo` and `compare` commands run: the tasks, the embedded and named policies, variants, the
runner and reports (the command itself is `adaptive_kl.cli`).

| module | what |
|---|---|
| `task/` | the math tasks (embedded, chat, GSM8K): problems, answer extraction, rewards, accuracy |
| `embedded` | the shipped reference policy (`reference_policy/`) and the task's datasets |
| `policies` | named policies (`smollm2`) and the real-model demo's budget |
| `variants` | the variants a comparison trains, from command-line values to configs |
| `runner` | trains and evaluates each variant |
| `seeds` | several seeds of a comparison: groups, intervals |
| `report` | the summary table, CSV and plots |
| `run_files` | a comparison's runs saved to and read from `runs.json` |

Above the library, which never imports it; only `adaptive_kl.cli` sits above it. Names are imported on first use, so
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
