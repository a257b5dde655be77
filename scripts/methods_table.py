"""Builds the methods table of docs/studies/README.md from the methods study's committed summary
(docs/studies/real/methods/summary.md), so that the page's table holds the summary's numbers and nothing else.

    python scripts/methods_table.py            # prints the table
    python scripts/methods_table.py --write    # replaces the table on docs/studies/README.md in place

An arm enters the table once it has 3 seeds (fewer are no result, as the page says). tests/test_docs.py checks that
the page's table is the one this script builds.
"""

from __future__ import annotations

import argparse
import os
import sys


REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY = os.path.join("docs", "studies", "real", "methods", "summary.md")
PAGE = os.path.join("docs", "studies", "README.md")
MIN_SEEDS = 3

NONE = "beta=0.2, loss_type=grpo, kl_adaptation_method=none"
DYNAMIC = "beta=0.2, loss_type=grpo, kl_adaptation_method=dynamic, dynamic_beta_decay=0.9, beta_min=0"
# The page's name of each arm, keyed by the summary's variant label, in the table's order.
LABELS = {
    NONE: "`none`",
    "beta=0, loss_type=grpo": "β = 0 (no KL)",
    "beta=0.2, loss_type=grpo, kl_adaptation_method=clip": "`clip` (threshold 1.0)",
    "beta=0.2, loss_type=grpo, kl_adaptation_method=sigmoid": "`sigmoid` (τ = 0.1)",
    "beta=0.2, loss_type=grpo, kl_placement=reward, kl_estimator=k1, kl_adaptation_method=length_normalized": (
        "`length_normalized` (k1 per token, in the reward)"
    ),
    f"{DYNAMIC}, reward_threshold=0.8": "`dynamic` (reward trigger 0.8, decay 0.9)",
    f"{DYNAMIC}, dynamic_trigger=saturation": "`dynamic` (saturation trigger, decay 0.9)",
}
# The summary's columns the table shows, each as the arm's mean, then paired against `none`.
COLUMNS = ["Δ length (last − first quarter)", "held-out KL to start (final)", "reward (last quarter)"]
# Of those, the primary endpoints: their paired cell also gives the Holm-adjusted p across the study's endpoints.
PRIMARY = COLUMNS[:2]
HEADER = (
    "| method (β = 0.2 unless said) | seeds | what it did | Δ length (tokens) | paired Δ length − `none` (Holm p) "
    "| held-out KL to start | paired − `none` (Holm p) | reward (last quarter) | paired − `none` "
    "| val. accuracy (final) |"
)


def read_tables(text: str) -> dict[str, dict[str, dict[str, str]]]:
    """The summary's markdown tables, each keyed by the line of text just before it, as
    `{caption: {first cell: {column: cell}}}`. A row whose first cell repeats replaces the earlier one: the primary
    endpoints' table, with two rows per comparison, is not read through this."""
    tables, caption, header, rows = {}, "", None, None
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if header is None:
                header, rows = cells, {}
            elif not set(line.strip()) <= set("|-"):  # not the |---| rule under the header
                rows[cells[0]] = dict(zip(header, cells))
            continue
        if header is not None:
            tables[caption], header = rows, None
        if line.strip():
            caption = line.strip()
    return tables


def table_after(tables: dict, prefix: str) -> dict[str, dict[str, str]]:
    """The one table whose caption starts with `prefix`; a summary that changed its layout fails here, loudly."""
    found = [rows for caption, rows in tables.items() if caption.startswith(prefix)]
    if len(found) != 1:
        raise ValueError(f"the summary has {len(found)} tables after a line starting {prefix!r}, not 1")
    return found[0]


def what_it_did(variant: str, activity: dict[str, str]) -> str:
    """The table's "what it did" cell: the arm's activity from the summary's "What each method did" row."""
    if "kl_adaptation_method=clip" in variant:
        return (
            f"clipped {activity['clip fraction (mean over steps)']} of the tokens, kept "
            f"{activity['adapted / raw KL (mean over steps)']} of the KL"
        )
    if "kl_adaptation_method=sigmoid" in variant:
        return f"kept {activity['adapted / raw KL (mean over steps)']} of the KL"
    if "kl_adaptation_method=dynamic" in variant:
        return (
            f"β lowered on {activity['steps that lowered β']} steps, first at step "
            f"{activity['first step at a lower β']}, to {activity['final β']}"
        )
    if "kl_adaptation_method=length_normalized" in variant:
        return "k1 per token subtracted from the reward"
    if variant == NONE:
        return "k3 in the loss, as stock TRL"
    return "no KL, no reference"


def holm_p_values(summary: str) -> dict[tuple[str, str], str]:
    """`(variant, metric header) → Holm-adjusted p` of the summary's primary endpoints table (each row a comparison
    `variant − none` and a metric; read here, not through `read_tables`, whose rows are keyed by their first cell)."""
    lines = summary.split("\n## Primary endpoints", 1)[1].splitlines()
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
    header, *rows = [row for row in rows if not set("".join(row)) <= set("-")]
    column = header.index("Holm-adjusted p")
    return {(row[0].split(" − ")[0], row[1]): row[column] for row in rows}


def methods_table(summary: str) -> list[str]:
    """The page's table (its lines) from the text of the study's summary.md."""
    tables = read_tables(summary)
    holm = holm_p_values(summary)
    means = table_after(tables, "Means over seeds")
    paired = table_after(tables, "Paired differences from")
    activity = table_after(tables, "Per run, then mean")
    unnamed = [variant for variant in means if variant not in LABELS]
    if unnamed:
        raise ValueError(f"the summary has variants with no name on the page: {unnamed}; add them to LABELS")
    lines = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    for variant, label in LABELS.items():
        row = means.get(variant)
        if row is None or int(row["seeds"]) < MIN_SEEDS:
            continue
        cells = [label, row["seeds"], what_it_did(variant, activity.get(variant, {}))]
        for column in COLUMNS:
            difference = "" if variant == NONE else paired[variant][column]
            if (variant, column) in holm:
                difference += f" (Holm p {holm[(variant, column)]})"
            cells += [row[column], difference]
        cells.append(row["val. accuracy (final)"])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def replace_table(page: str, table: list[str], indent: str = "  ") -> str:
    """The page with the table that has `table`'s header line (from that line to the table's end) replaced by
    `table`."""
    lines = page.splitlines(keepends=True)
    (start,) = [i for i, line in enumerate(lines) if line.strip() == table[0]]
    end = start
    while end < len(lines) and lines[end].lstrip().startswith("|"):
        end += 1
    return "".join([*lines[:start], *(f"{indent}{line}\n" for line in table), *lines[end:]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"replace the table on {PAGE} instead of printing it")
    args = parser.parse_args(argv)
    with open(os.path.join(REPOSITORY, SUMMARY)) as f:
        table = methods_table(f.read())
    if not args.write:
        print("\n".join(table))
        return 0
    path = os.path.join(REPOSITORY, PAGE)
    with open(path) as f:
        page = f.read()
    with open(path, "w") as f:
        f.write(replace_table(page, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
