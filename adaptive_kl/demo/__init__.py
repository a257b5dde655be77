"""The demo: `adaptive-kl demo` and `compare`, which train variants of the trainer on a task (`adaptive_kl.tasks`) with
the same seed and budget, and report them side by side.

| module | what |
|---|---|
| `command` | the two subcommands: train the variants, write the report, print its main columns |
| `arguments` | their command line, read into settings and variants (`UsageError` on bad input) |
| `embedded` | the shipped reference policy (`reference_policy/`) and the embedded task's split it was tuned on |
| `budgets` | the demo's budget for each named policy (`smollm2`) |
| `variants` | the variants a comparison trains, from command-line values to configs |
| `runner` | trains and evaluates each variant |
| `seeds` | several seeds of a comparison: groups, intervals |
| `report` | the summary table, CSV and plots |
| `run_files` | a comparison's runs saved to and read from `runs.json` |

Beside the training command (`adaptive_kl.cli`), which it never imports; the dispatcher `adaptive_kl.console` stands
on both, and the library never imports either. Names are imported on first use, so `adaptive-kl --unsloth` can import
Unsloth before anything imports TRL.
"""

from .._exports import lazy_exports


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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
