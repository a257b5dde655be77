"""The demo and comparisons behind the `adaptive-kl` command: variants, runner and reports."""

from .report import summary_table, write_report
from .runner import DemoSettings, VariantRun, run_comparison, run_variant
from .variants import DEMO_METHODS, Variant, method_variants, variant_grid


__all__ = [
    "DEMO_METHODS",
    "DemoSettings",
    "Variant",
    "VariantRun",
    "method_variants",
    "run_comparison",
    "run_variant",
    "summary_table",
    "variant_grid",
    "write_report",
]
