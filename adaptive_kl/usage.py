"""What the `adaptive-kl` subcommands share, the training command (`adaptive_kl.cli`) and the demo's
(`adaptive_kl.demo.command`) alike: the input checks, each bad input a `UsageError`, which the subcommand prints as
`adaptive-kl: error: ...` and exits with status 2, before anything is trained; and the host libraries' start (Unsloth
first, then TRL and Transformers, quieted)."""

from __future__ import annotations

import importlib.util
import os
import warnings

from .models import MissingModelError
from .models.paths import looks_like_local_path
from .tasks.policies import resolve_policy
from .tasks.recipe import closest  # noqa: F401  (the commands take the hint from here)


class UsageError(Exception):
    """Bad input: reported as `adaptive-kl: error: ...` with exit status 2."""


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
    try:
        if resolve_policy(model) != model:  # a named policy: its packaged model, converted on first use
            return
    except MissingModelError as error:
        raise UsageError(f"{option} {model}: {error}") from None
    check_local_path(option, model)
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(os.path.expanduser(model))
    except (OSError, ValueError) as error:
        raise UsageError(f"{option} {model}: cannot load its config ({str(error).splitlines()[0]})") from None


def quiet_host_libraries() -> None:
    """Deprecation notices between TRL and Transformers versions are not the user's to act on here, and per-model
    loading bars would interleave with the run's own progress bar."""
    import datasets
    from transformers.utils import logging as transformers_logging

    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|trl)\b")
    transformers_logging.disable_progress_bar()
    datasets.disable_progress_bars()
