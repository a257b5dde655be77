"""`adaptive-kl grpo` and `adaptive-kl rloo`: their lines in the command's parser, and their start: Unsloth first when
`grpo`'s arguments ask for it, then TRL's script with our config (`grpo`, `rloo`), which imports TRL.

Importing this module imports no TRL, so that Unsloth can come before it.
"""

from __future__ import annotations

import argparse
import sys

from ..usage import UsageError, import_unsloth, quiet_host_libraries


def add_grpo_parser(commands: argparse._SubParsersAction) -> None:
    """Lists `grpo` among the command's subcommands; its arguments are TRL's parser's, read by `grpo.parse`."""
    commands.add_parser(
        "grpo",
        add_help=False,
        help="train a model from a TRL GRPO recipe with adaptive KL: adaptive-kl grpo --config recipe.yaml "
        "(see adaptive-kl grpo --help)",
    )


def add_rloo_parser(commands: argparse._SubParsersAction) -> None:
    """Lists `rloo` among the command's subcommands; its arguments are TRL's RLOO parser's (`rloo.RLOO_SCRIPT`)."""
    commands.add_parser(
        "rloo",
        add_help=False,
        help="train a model from a TRL RLOO recipe with an adaptive KL penalty: adaptive-kl rloo --config "
        "recipe.yaml (see adaptive-kl rloo --help)",
    )


TRUE_WORDS = ("true", "1", "yes", "y", "t")  # what Transformers' argument parser takes as True


def grpo_asks_for_unsloth(argv: list[str]) -> bool:
    """Whether `adaptive-kl grpo` arguments ask for Unsloth, read before TRL is imported: `--unsloth` (bare, or with
    a value), else `unsloth: true` in the `--config` recipe (an unreadable recipe is left to the parser to report)."""
    for i, token in enumerate(argv):
        if token == "--unsloth":
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            return not has_value or argv[i + 1].lower() in TRUE_WORDS
        if token.startswith("--unsloth="):
            return token.partition("=")[2].lower() in TRUE_WORDS
    if "--config" in argv[:-1]:
        import yaml

        try:
            with open(argv[argv.index("--config") + 1]) as file:
                recipe = yaml.safe_load(file)
        except (OSError, yaml.YAMLError):
            return False
        return isinstance(recipe, dict) and str(recipe.get("unsloth", False)).lower() in TRUE_WORDS
    return False


def main(argv: list[str], command: str = "grpo") -> int:
    """Runs `adaptive-kl grpo` or `adaptive-kl rloo` (`command`; the `argv` after it): Unsloth first when `grpo`'s
    arguments ask for it (RLOO offers none), then TRL's script with our config. A bad input is
    `adaptive-kl: error: ...`, exit status 2."""
    try:
        if command != "rloo" and grpo_asks_for_unsloth(argv):
            import_unsloth()
        quiet_host_libraries()
        # Imported only now: these import TRL, which must come after Unsloth.
        if command == "rloo":
            from .rloo import RLOO_SCRIPT as script
        else:
            from .grpo import GRPO_SCRIPT as script
        from .grpo import main as run_script

        return run_script(argv, script)
    except UsageError as error:
        print(f"adaptive-kl: error: {error}", file=sys.stderr)
        return 2
