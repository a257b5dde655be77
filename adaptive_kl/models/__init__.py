"""Real pretrained models available offline, as local checkpoint directories (`smollm2_path`)."""

from .smollm2 import SMOLLM2_HUB_ID, MissingModelError, smollm2_path


__all__ = ["SMOLLM2_HUB_ID", "MissingModelError", "smollm2_path"]
