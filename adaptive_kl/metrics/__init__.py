"""Measurements beside the KL: the `diversity/*` metrics of a generation batch (`diversity`), torch only like the
formula sheet, and the record of where a result was measured (`environment`: date, device, versions, command; it
reads TRL's and Transformers' versions when called). Neither imports the trainers."""

from .diversity import DIVERSITY_METRICS, Embedder, HashedNgramEmbedder, diversity_metrics


__all__ = ["DIVERSITY_METRICS", "Embedder", "HashedNgramEmbedder", "diversity_metrics"]
