"""The `diversity/*` metrics: how different the completions of one prompt are from each other.

A generation batch holds its completions in global order, each consecutive block of ``num_generations`` (G)
answering the same prompt (a group). Every metric is computed within groups and averaged over groups, so two
prompts that get the same answer never count as a lack of diversity:

- ``diversity/unique_fraction``: distinct completions (as token sequences) / G.
- ``diversity/distinct_{n}``: distinct token n-grams / total token n-grams over the group's completions.
- ``diversity/embedding_similarity``: mean cosine similarity over the unordered pairs i < j of the group, of
  embeddings from a pluggable `Embedder`; the default `HashedNgramEmbedder` makes it lexical overlap.

Lower `unique_fraction`/`distinct_n` and higher `embedding_similarity` mean a less diverse policy (mode collapse).

Cost is bounded by the batch: O(total tokens · n) for the token metrics (one set per group), O(total characters ·
n) to embed with the default embedder, and O(N·D + Σ_groups G²·D) for the pairwise cosines of N embeddings of
dimension D (one (G, G) Gram matrix per group; G is small, typically ≤ 16).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


DIVERSITY_METRICS = (
    "diversity/unique_fraction",
    "diversity/distinct_1",
    "diversity/distinct_2",
    "diversity/embedding_similarity",
)


def _num_groups(num_items: int, num_generations: int) -> int:
    """Number of groups; ValueError unless `num_items` is a multiple of a positive `num_generations`."""
    if isinstance(num_generations, bool) or not isinstance(num_generations, int) or num_generations < 1:
        raise ValueError(f"num_generations must be a positive integer, got {num_generations!r}.")
    if num_items % num_generations:
        raise ValueError(
            f"The number of completions ({num_items}) must be a multiple of num_generations ({num_generations})."
        )
    return num_items // num_generations


def unique_fraction(completion_ids: Sequence[Sequence[int]], num_generations: int) -> float:
    """Mean over groups of (distinct completions in the group) / `num_generations`.

    Args:
        completion_ids (`list[list[int]]` of length `N`): token ids of each completion, in global order.
        num_generations (`int`): G, the group size; `N` must be a multiple of it.

    Returns:
        `float` in [1/G, 1]; NaN when there is no completion.
    """
    num_groups = _num_groups(len(completion_ids), num_generations)
    g = num_generations
    # As lists: a tensor's or an array's elements would hash by identity, not by value
    lists = [ids.tolist() if hasattr(ids, "tolist") else ids for ids in completion_ids]
    fractions = [len({tuple(ids) for ids in lists[k * g : (k + 1) * g]}) / g for k in range(num_groups)]
    return sum(fractions) / len(fractions) if fractions else math.nan


def distinct_n(completion_ids: Sequence[Sequence[int]], num_generations: int, n: int) -> float:
    """Mean over groups of (distinct token n-grams) / (total token n-grams) over the group's completions.

    N-grams do not cross completions. A group without any n-gram (every completion shorter than `n`) has no ratio
    and is left out of the mean rather than counted as 0 or 1.

    Args:
        completion_ids (`list[list[int]]` of length `N`): token ids of each completion, in global order.
        num_generations (`int`): G, the group size; `N` must be a multiple of it.
        n (`int`): n-gram size, ≥ 1.

    Returns:
        `float` in (0, 1]; NaN when no group has an n-gram.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}.")
    num_groups = _num_groups(len(completion_ids), num_generations)
    g = num_generations
    ratios = []
    for k in range(num_groups):
        group = completion_ids[k * g : (k + 1) * g]
        total = sum(max(len(ids) - n + 1, 0) for ids in group)
        if total:
            distinct = set()
            for ids in group:
                ids = ids.tolist() if hasattr(ids, "tolist") else ids  # as in `unique_fraction`
                # its n-grams: tuples of n consecutive ids (for n = 1, the ids themselves)
                distinct.update(zip(*(ids[i:] for i in range(n))) if n > 1 else ids)
            ratios.append(len(distinct) / total)
    return sum(ratios) / len(ratios) if ratios else math.nan


def mean_pairwise_cosine(embeddings: torch.Tensor, num_generations: int) -> float:
    """Mean over groups of the mean cosine similarity over the group's unordered pairs i < j.

    The cosine with a zero vector is 0 (as in `torch.nn.functional.cosine_similarity`): a completion that an
    embedder maps to zero (e.g. an empty one) is dissimilar to every other, and never produces NaN (a non-finite
    embedding does).

    Args:
        embeddings (`torch.Tensor` of shape `(N, D)`): one embedding per completion, in global order.
        num_generations (`int`): G, the group size; `N` must be a multiple of it.

    Returns:
        `float` in [−1, 1]; NaN when no group has a pair (G = 1 or `N` = 0).
    """
    if embeddings.dim() != 2 or embeddings.size(1) == 0:
        raise ValueError(f"embeddings must have shape (N, D) with D ≥ 1, got {tuple(embeddings.shape)}.")
    num_groups = _num_groups(embeddings.size(0), num_generations)
    g = num_generations
    if num_groups == 0 or g < 2:
        return float("nan")
    x = embeddings.detach().float()
    # Scaling each row by its largest |x| first keeps ‖x‖ from overflowing (or underflowing) float32. Dividing by
    # max(·, tiny) leaves zero vectors at zero, so their cosines are exactly 0.
    tiny = torch.finfo(x.dtype).tiny
    x = x / x.abs().amax(dim=-1, keepdim=True).clamp(min=tiny)
    x = x / x.norm(dim=-1, keepdim=True).clamp(min=tiny)
    x = x.reshape(num_groups, g, -1)
    gram = torch.bmm(x, x.transpose(1, 2)).clamp(-1.0, 1.0)  # (groups, G, G); clamp: rounding past ±1
    i, j = torch.triu_indices(g, g, offset=1, device=gram.device)
    return gram[:, i, j].mean(-1).mean().item()


class Embedder(Protocol):
    """Anything that maps `N` completion texts to a `(N, D)` tensor, e.g. a sentence-transformers model as
    ``lambda texts: model.encode(texts, convert_to_tensor=True)``."""

    def __call__(self, completions: list[str]) -> torch.Tensor: ...


@dataclass(frozen=True)
class HashedNgramEmbedder:
    """Bag of character n-grams hashed into `dim` buckets: a download-free `Embedder` whose cosine similarity is
    the lexical overlap of two completions.

    Texts shorter than `n` are right-padded with U+0000 to `n` characters, so every text, the empty one included,
    has at least one n-gram (its embedding is never zero, and two empty completions are identical). The bucket
    of an n-gram is a fixed polynomial hash of its code points (integer arithmetic, vectorized over the batch):
    identical in every process and run, unlike Python's salted `hash` of a `str`. Texts with disjoint character
    sets share no n-gram, so their cosine is 0 unless two n-grams collide in a bucket.

    Args:
        n (`int`): n-gram size in characters.
        dim (`int`): number of hash buckets D.

    Returns (when called on `N` texts):
        `torch.Tensor` of shape `(N, dim)`, float32 n-gram counts.
    """

    _PRIME = 2**31 - 1
    _BASE = 1_000_003
    _MIX = 1_597_334_677  # scrambles the polynomial hash before it is reduced to a bucket (product < 2⁶²)

    n: int = 3
    dim: int = 1024

    def __post_init__(self):
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be a positive integer, got {self.n!r}.")
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1:
            raise ValueError(f"dim must be a positive integer, got {self.dim!r}.")

    def __call__(self, completions: list[str]) -> torch.Tensor:
        n, dim = self.n, self.dim
        texts = [text.ljust(n, "\0") for text in completions]
        if not texts:
            return torch.zeros(0, dim)
        lengths = torch.tensor([len(text) for text in texts])
        # UTF-32 has exactly one 4-byte unit per code point, so offsets in the joined string are `lengths`' sums.
        codes = torch.frombuffer(bytearray("".join(texts).encode("utf-32-le")), dtype=torch.int32).long() + 1
        num_windows = codes.numel() - n + 1  # windows of the joined text, those across two texts included
        # h = Σ_k (c_k + 1)·BASE^(n−1−k) mod PRIME; reducing only when the next step could overflow int64 gives the
        # same value (c + 1 < 2²¹, BASE < 2²⁰) with no reduction at all for n ≤ 3.
        h, bound = codes[:num_windows], 2**21
        for k in range(1, n):
            if bound * self._BASE + 2**21 >= 2**63:
                h, bound = h % self._PRIME, self._PRIME
            h, bound = h * self._BASE + codes[k : k + num_windows], bound * self._BASE + 2**21
        buckets = (h % self._PRIME) * self._MIX % self._PRIME % dim
        flat = torch.repeat_interleave(torch.arange(len(texts)) * dim, lengths)[:num_windows] + buckets
        # The n − 1 windows that start in the last n − 1 characters of a text (all but the last) run into the next
        # one: they go to an extra bin, dropped below.
        ends = torch.cumsum(lengths, 0)[:-1]
        flat[(ends[:, None] - torch.arange(1, n)).flatten()] = len(texts) * dim
        counts = torch.bincount(flat, minlength=len(texts) * dim + 1)[:-1]
        return counts.view(len(texts), dim).float()


def diversity_metrics(
    completion_ids: Sequence[Sequence[int]],
    completions: Sequence[str],
    num_generations: int,
    embedder: Embedder | None = None,
    ngram_sizes: Sequence[int] = (1, 2),
) -> dict[str, float]:
    """The `diversity/*` metrics of one generation batch.

    Args:
        completion_ids (`list[list[int]]` of length `N`): token ids of each completion (padding removed), in
            global order: each consecutive block of `num_generations` answers the same prompt.
        completions (`list[str]` of length `N`): the decoded completions, in the same order.
        num_generations (`int`): G, the group size; `N` must be a multiple of it.
        embedder (`Embedder`, *optional*): maps the texts to a `(N, D)` tensor; `HashedNgramEmbedder()` if None.
            It is not called when no group has a pair (G = 1 or `N` = 0).
        ngram_sizes (`tuple[int, ...]`): the n of the `diversity/distinct_{n}` entries.

    Returns:
        `dict[str, float]`: `diversity/unique_fraction`, `diversity/distinct_{n}` for each n, and
        `diversity/embedding_similarity` (`DIVERSITY_METRICS` for the default `ngram_sizes`).
    """
    if len(completion_ids) != len(completions):
        raise ValueError(
            f"completion_ids and completions must have the same length, got {len(completion_ids)} and "
            f"{len(completions)}."
        )
    num_groups = _num_groups(len(completions), num_generations)
    metrics = {"diversity/unique_fraction": unique_fraction(completion_ids, num_generations)}
    for n in ngram_sizes:
        metrics[f"diversity/distinct_{n}"] = distinct_n(completion_ids, num_generations, n)
    similarity = math.nan
    if num_groups and num_generations > 1:
        embedder = HashedNgramEmbedder() if embedder is None else embedder
        embeddings = torch.as_tensor(embedder(list(completions)))  # as_tensor: numpy output is accepted too
        if embeddings.dim() != 2 or embeddings.size(0) != len(completions):
            raise ValueError(
                f"The embedder must return one row per completion, shape ({len(completions)}, D); got "
                f"{tuple(embeddings.shape)}."
            )
        similarity = mean_pairwise_cosine(embeddings, num_generations)
    metrics["diversity/embedding_similarity"] = similarity
    return metrics
