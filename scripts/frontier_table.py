"""Builds the studies page's two frontier tables from the frontier study's committed summary
(docs/studies/real/frontier/summary.md), so that the page holds the summary's numbers and nothing else: constant β's
points (the table to choose a β from) and each method against the frontier (the primary endpoint).

    python scripts/frontier_table.py            # prints both tables
    python scripts/frontier_table.py --write    # replaces them on docs/studies/README.md in place

tests/test_docs.py checks that the page's tables are the ones this script builds.
"""

from __future__ import annotations

import argparse
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from methods_table import LABELS, REPOSITORY, read_tables, replace_table, table_after  # noqa: E402


SUMMARY = os.path.join("docs", "studies", "real", "frontier", "summary.md")
PAGE = os.path.join("docs", "studies", "README.md")
# The page's name of each method the frontier study reads, keyed by the summary's variant label: the methods study's,
# and the frontier study's own arms.
METHOD_LABELS = {
    **{variant: label for variant, label in LABELS.items() if "kl_adaptation_method" in variant},
    "beta=0.2, loss_type=grpo, kl_scaling=log": "`kl_scaling=log` (seed 000's)",
    "beta=0.2, loss_type=grpo, kl_controller=stepwise, target_kl=0.147": "`kl_controller=stepwise`, target_kl 0.147 "
    "(seed 003's)",
    "beta=0.2, loss_type=grpo, kl_controller=stepwise, target_kl=0.147, beta_max=0.2": "`kl_controller=stepwise`, "
    "target_kl 0.147, `beta_max=0.2` (bounded, issue 70)",
    "beta=0.2, loss_type=grpo, kl_controller=adaptive, target_kl=0.147, kl_horizon=35, beta_max=0.2": "`kl_controller="
    "adaptive`, target_kl 0.147, `kl_horizon=35`, `beta_max=0.2` (bounded, issue 70)",
}
LINE_HEADER = (
    "| β | seeds | held-out KL to start (final) | reward (last quarter) | mean completion length "
    "| Δ length (last − first quarter) | Δ retention | format-free accuracy (final) |"
)
METHODS_HEADER = (
    "| method (β = 0.2 at the start) | seeds | held-out KL to start | reward (last quarter) | D: reward above the "
    "frontier | Holm-adjusted p | detectable at 80% power | D against the best constant β at no more drift (added "
    "after the runs began) | mirror: held-out KL beyond the frontier's | reading | correction, after the runs: D with "
    "the start on the line | its Holm-adjusted p | seeds read outside the line, stated D / corrected |"
)


def line_table(summary: str) -> list[str]:
    """Constant β's points, as the summary gives them."""
    rows = table_after(read_tables(summary), "Constant β's points")
    header = list(next(iter(rows.values())))
    if "| " + " | ".join(header) + " |" != LINE_HEADER:
        raise ValueError(f"the summary's constant-β table changed its columns: {header}")
    return [
        LINE_HEADER,
        "|" + "---|" * len(header),
        *("| " + " | ".join(row.values()) + " |" for row in rows.values()),
    ]


def methods_table(summary: str) -> list[str]:
    """Each method against the frontier, named as the page names it, without the per-seed and unadjusted columns."""
    tables = read_tables(summary)
    rows = table_after(tables, "Stated before the runs: for each method")
    corrected = table_after(tables, "Added after the runs, as a correction")
    keep = (
        "seeds", "held-out KL to start (final)", "reward (last quarter)", "D: above the frontier", "Holm-adjusted p",
        "detectable at 80% power", "D against the monotone envelope", "mirror: drift beyond the frontier's",
        "reading",
    )  # fmt: skip
    unnamed = [method for method in rows if method not in METHOD_LABELS]
    if unnamed:
        raise ValueError(f"the summary has methods with no name on the page: {unnamed}; add them to METHOD_LABELS")
    lines = [METHODS_HEADER, "|" + "---|" * (METHODS_HEADER.count("|") - 1)]
    outside = "seeds read outside the line"
    for method, row in rows.items():
        correction = corrected[method]
        cells = [METHOD_LABELS[method], *(row[name] for name in keep), correction["D: above the frontier"],
                 correction["Holm-adjusted p"], f"{row[outside]} / {correction[outside]}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"replace the tables on {PAGE} instead of printing them")
    args = parser.parse_args(argv)
    with open(os.path.join(REPOSITORY, SUMMARY)) as f:
        summary = f.read()
    tables = [line_table(summary), methods_table(summary)]
    if not args.write:
        print("\n\n".join("\n".join(table) for table in tables))
        return 0
    path = os.path.join(REPOSITORY, PAGE)
    with open(path) as f:
        page = f.read()
    for table in tables:
        page = replace_table(page, table)
    with open(path, "w") as f:
        f.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
