"""Command-line input checks shared by the `adaptive-kl` subcommands: each bad input is a `UsageError`, which the
command prints as `adaptive-kl: error: ...` and exits with status 2, before anything is trained."""

from __future__ import annotations

import difflib
import importlib.util
import os

from ..models.paths import looks_like_local_path


class UsageError(Exception):
    """Bad input: reported as `adaptive-kl: error: ...` with exit status 2."""


def closest(name: str, candidates) -> str:
    """` (did you mean 'x'?)` for the candidates closest to `name`, or an empty string."""
    matches = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(m) for m in matches)}?)" if matches else ""


def import_unsloth(option: str = "--unsloth") -> None:
    """Imports Unsloth before anything imports TRL (Unsloth patches TRL's trainers on import), or says why not."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"{option} needs a CUDA GPU, and none is available here; drop {option} to use plain TRL")
    if importlib.util.find_spec("unsloth") is None:
        raise UsageError(f"{option} needs Unsloth: pip install 'adaptive-kl[unsloth]'")
    import unsloth  # noqa: F401


def check_local_path(option: str, path: str) -> None:
    """A path meant as local (not a hub id) must exist."""
    if looks_like_local_path(path) and not os.path.exists(os.path.expanduser(path)):
        raise UsageError(f"{option} {path}: no such file or directory")


def check_model(option: str, model: str | None) -> None:
    """Fails before any training when the model's config cannot be loaded."""
    if model is None:
        return
    from ..demo.policies import MissingModelError, is_named_policy, resolve_policy

    if is_named_policy(model):
        try:
            resolve_policy(model)  # converts the packaged model on first use
        except MissingModelError as error:
            raise UsageError(f"{option} {model}: {error}") from None
        return
    check_local_path(option, model)
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(os.path.expanduser(model))
    except (OSError, ValueError) as error:
        raise UsageError(f"{option} {model}: cannot load its config ({str(error).splitlines()[0]})") from None


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
