"""The TRL versions this package supports, checked before TRL is imported, and the layout of TRL's GRPO batches.

The trainer overrides hooks of `GRPOTrainer` (`_get_per_token_logps_and_entropies`, `_calculate_rewards`) and
mirrors its loss normalizers, which TRL changes between minor releases. Outside the tested range it fails at import
with what to install, rather than training with a silently different loss. `ADAPTIVE_KL_ALLOW_UNSUPPORTED_TRL=1`
turns the error into a warning, for trying a new TRL release.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings

from packaging.specifiers import SpecifierSet
from packaging.version import Version


# Keep equal to the `trl` requirement in pyproject.toml (a test checks it).
SUPPORTED_TRL = ">=1.15,<1.17"
ALLOW_UNSUPPORTED_ENV = "ADAPTIVE_KL_ALLOW_UNSUPPORTED_TRL"


def check_trl_version(version: str | None = None) -> None:
    """Raises `ImportError` if the installed TRL (or `version`) is outside `SUPPORTED_TRL`.

    Reads the version from the package metadata, so TRL itself is not imported (Unsloth must be imported first).
    """
    if version is None:
        try:
            version = importlib.metadata.version("trl")
        except importlib.metadata.PackageNotFoundError:
            raise ImportError(f"adaptive-kl needs TRL: pip install 'trl{SUPPORTED_TRL}'") from None
    if Version(version) in SpecifierSet(SUPPORTED_TRL, prereleases=True):
        return
    message = (
        f"adaptive-kl supports trl{SUPPORTED_TRL}, but trl {version} is installed. Install a supported version: "
        f"pip install 'trl{SUPPORTED_TRL}'."
    )
    if os.environ.get(ALLOW_UNSUPPORTED_ENV) == "1":
        warnings.warn(f"{message} Continuing because {ALLOW_UNSUPPORTED_ENV}=1.", UserWarning, stacklevel=2)
        return
    raise ImportError(f"{message} To try this version anyway, set {ALLOW_UNSUPPORTED_ENV}=1.")


# Multimodal inputs of a batch from `GRPOTrainer._generate_and_score_completions` that a policy forward needs.
MULTIMODAL_INPUTS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


def completion_loss_mask(batch: dict):
    """The completion tokens a loss or a KL may count: `completion_mask`, times `tool_mask` when the batch has one
    (tool outputs in a completion were not sampled from the policy)."""
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask
