"""Model and dataset names: a local path or a hub id."""

from __future__ import annotations


def looks_like_local_path(text: str) -> bool:
    """Whether `text` is meant as a local path rather than a hub id ("name" or "owner/name")."""
    return text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text
