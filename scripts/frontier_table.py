"""Builds the studies page's frontier tables from the committed summaries of the frontier study
(docs/studies/real/frontier/summary.md) and the second frontier (docs/studies/real/frontier_sum/summary.md), so that
the page holds the summaries' numbers and nothing else: for each, constant β's points (the table to choose a β from)
and each method against the frontier (the primary endpoint).

    python scripts/frontier_table.py            # prints the four tables
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
SUM_SUMMARY = os.path.join("docs", "studies", "real", "frontier_sum", "summary.md")
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


def check_named(rows: dict, labels: dict, where: str) -> None:
    """Refuses a summary whose methods the page has no name for (in `labels`, the constant `where`), rather than
    leaving them out."""
    unnamed = [method for method in rows if method not in labels]
    if unnamed:
        raise ValueError(f"the summary has methods with no name on the page: {unnamed}; add them to {where}")


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
    check_named(rows, METHOD_LABELS, "METHOD_LABELS")
    lines = [METHODS_HEADER, "|" + "---|" * (METHODS_HEADER.count("|") - 1)]
    outside = "seeds read outside the line"
    for method, row in rows.items():
        correction = corrected[method]
        cells = [METHOD_LABELS[method], *(row[name] for name in keep), correction["D: above the frontier"],
                 correction["Holm-adjusted p"], f"{row[outside]} / {correction[outside]}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# The second frontier (issue 69): the full reward, format + correct sum. Its tables name their setting in the first
# column, so that each header is the page's only one; a seed's outcome can be all or nothing (learned the sum or
# not), so both tables say on how many seeds each arm learned it.
SUM_METHOD_LABELS = {
    "beta=0.2, kl_adaptation_method=clip": "`kl_adaptation_method=clip`",
    "beta=0.2, kl_scaling=log": "`kl_scaling=log`",
    "beta=0.2, kl_adaptation_method=dynamic, dynamic_beta_decay=0.9, beta_min=0, reward_threshold=0.8": (
        "`dynamic` (decay 0.9, `beta_min=0`, `reward_threshold=0.8`)"
    ),
    "beta=0.2, kl_controller=stepwise, target_kl=0.184, beta_max=0.2": "`kl_controller=stepwise`, target_kl 0.184, "
    "`beta_max=0.2` (bounded)",
    "beta=0.2, kl_adaptation_method=sigmoid": "`kl_adaptation_method=sigmoid`",
}
SUM_LINE_HEADER = (
    "| β (format + correct sum) | seeds | held-out KL to start (final) | reward (last quarter) "
    "| validation accuracy (final) | seeds that learned the sum (95%, exact) |"
)
SUM_METHODS_HEADER = (
    "| method (format + correct sum; β = 0.2 at the start) | seeds | held-out KL to start | reward (last quarter) "
    "| D: reward above the frontier | Holm-adjusted p | detectable at 80% power | D against the monotone envelope "
    "| seeds read outside the line | seeds that learned the sum (95%, exact) | reading |"
)


def learned_counts(tables: dict) -> dict[str, str]:
    """Per variant, `k of n [low, high]`: its seeds that learned the sum, from the summary's table of them."""
    rows = table_after(tables, "Stated before the runs: a run learned")
    return {variant: f"{row['seeds that learned']} {row['95% interval (exact)']}" for variant, row in rows.items()}


def sum_line_table(summary: str) -> list[str]:
    """The second frontier's constant-β points, with the validation accuracy (the reward's strict reading of the
    greedy answers; not the format-free one, which the reused β-study runs measured with the earlier reader) and the
    seeds that learned the sum; the start's row has neither (nothing trained)."""
    tables = read_tables(summary)
    rows = table_after(tables, "Constant β's points")
    means, learned = table_after(tables, "Means over seeds"), learned_counts(tables)
    keep = ("seeds", "held-out KL to start (final)", "reward (last quarter)")
    lines = [SUM_LINE_HEADER, "|" + "---|" * (SUM_LINE_HEADER.count("|") - 1)]
    for beta, row in rows.items():
        trained = ["—", "—"] if beta == "start" else [
            means[f"beta={beta}"]["val. accuracy (final)"], learned[f"beta={beta}"]
        ]  # fmt: skip
        lines.append("| " + " | ".join([beta, *(row[name] for name in keep), *trained]) + " |")
    return lines


def sum_methods_table(summary: str) -> list[str]:
    """The second frontier's methods against it (D, with Holm across them), named as the page names them."""
    tables = read_tables(summary)
    rows = table_after(tables, "Stated before the runs: for each method")
    check_named(rows, SUM_METHOD_LABELS, "SUM_METHOD_LABELS")
    keep = (
        "seeds", "held-out KL to start (final)", "reward (last quarter)", "D: above the frontier", "Holm-adjusted p",
        "detectable at 80% power", "D against the monotone envelope", "seeds read outside the line",
    )  # fmt: skip
    learned = learned_counts(tables)
    lines = [SUM_METHODS_HEADER, "|" + "---|" * (SUM_METHODS_HEADER.count("|") - 1)]
    for method, row in rows.items():
        cells = [SUM_METHOD_LABELS[method], *(row[name] for name in keep), learned[method], row["reading"]]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def built_tables() -> list[list[str]]:
    """The page's four frontier tables, from the committed summaries."""
    with open(os.path.join(REPOSITORY, SUMMARY)) as f:
        summary = f.read()
    with open(os.path.join(REPOSITORY, SUM_SUMMARY)) as f:
        sum_summary = f.read()
    return [line_table(summary), methods_table(summary), sum_line_table(sum_summary), sum_methods_table(sum_summary)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"replace the tables on {PAGE} instead of printing them")
    args = parser.parse_args(argv)
    tables = built_tables()
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
