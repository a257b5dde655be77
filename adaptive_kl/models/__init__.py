"""Where models come from: real pretrained models available offline, as local checkpoint directories
(`smollm2_path`), and local paths told from hub ids (`looks_like_local_path`)."""

from .paths import looks_like_local_path
from .smollm2 import SMOLLM2_HUB_ID, MissingModelError, smollm2_path


__all__ = ["SMOLLM2_HUB_ID", "MissingModelError", "looks_like_local_path", "smollm2_path"]
