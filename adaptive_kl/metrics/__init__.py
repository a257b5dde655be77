"""Measurements of generations beside the KL: the `diversity/*` metrics of a generation batch (`diversity`), torch
only, like the formula sheet, and never importing the trainers."""

from .diversity import DIVERSITY_METRICS, Embedder, HashedNgramEmbedder, diversity_metrics


__all__ = ["DIVERSITY_METRICS", "Embedder", "HashedNgramEmbedder", "diversity_metrics"]
