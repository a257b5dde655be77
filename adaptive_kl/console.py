"""The `adaptive-kl` command (also `python -m adaptive_kl`).

    adaptive-kl demo | compare ...      # the KL methods or any variants on a task (`adaptive_kl.demo.command`)
    adaptive-kl frontier ...            # constant β's reward against drift, methods on it (`demo.frontier_command`)
    adaptive-kl grpo --config recipe.yaml   # train a model from a TRL recipe (`adaptive_kl.cli.command`)
    adaptive-kl rloo --config recipe.yaml   # the same with RLOO (`adaptive_kl.cli.rloo`)

The console entry point: one parser lists the subcommands, and each runs in its own layer, the demo's and the training
command's, which stand side by side and never import each other. Importing this module imports no TRL, so that
`--unsloth` can import Unsloth first.
"""

from __future__ import annotations

import argparse
import sys

from .cli.command import add_grpo_parser, add_rloo_parser
from .cli.command import main as grpo_main
from .demo.arguments import add_compare_parser, add_demo_parser
from .demo.command import main as demo_main
from .demo.frontier_command import add_frontier_parser
from .demo.frontier_command import main as frontier_main


def make_parser() -> argparse.ArgumentParser:
    """The command's parser, every subcommand listed: what `adaptive-kl --help` prints."""
    parser = argparse.ArgumentParser(
        prog="adaptive-kl",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add_demo_parser(commands)
    add_grpo_parser(commands)  # its arguments are TRL's parser's (`adaptive_kl.cli.grpo`)
    add_rloo_parser(commands)  # likewise (`adaptive_kl.cli.rloo`)
    add_compare_parser(commands)
    add_frontier_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["grpo"], ["rloo"]):
        return grpo_main(argv[1:], argv[0])
    if argv[:1] == ["frontier"]:
        return frontier_main(argv)
    if argv[:1] not in (["demo"], ["compare"]):
        # `--help`, no subcommand, an unknown one: argparse answers (and exits) from the whole list
        make_parser().parse_known_args(argv)
    return demo_main(argv)


if __name__ == "__main__":
    sys.exit(main())
