"""`diversity_metrics=True`: the trainer logs `diversity/*` of each generation batch, computed on its completions."""

from __future__ import annotations

import pytest
from test_placement import GenerationRecorder
from tiny import make_trainer

from adaptive_kl import AdaptiveKLGRPOConfig, AdaptiveKLGRPOTrainer, HashedNgramEmbedder
from adaptive_kl.metrics.diversity import distinct_n, mean_pairwise_cosine, unique_fraction


class RecordingEmbedder:
    def __init__(self):
        self.calls, self.inner = [], HashedNgramEmbedder()

    def __call__(self, completions):
        self.calls.append(list(completions))
        return self.inner(completions)


@pytest.mark.parametrize("beta", [0.0, 0.1], ids=["stock", "adaptive"])
def test_logged_diversity_is_that_of_the_generated_completions(tiny_model_dir, tmp_path, beta):
    embedder = RecordingEmbedder()
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, beta=beta, diversity_metrics=True, max_steps=2,
        bf16=False, output_dir=str(tmp_path / "out"), trainer_kwargs={"diversity_embedder": embedder},
    )  # fmt: skip
    recorder = GenerationRecorder(trainer)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "diversity/unique_fraction" in h]
    assert len(logged) == len(recorder.batches) == len(embedder.calls) == 2
    g = trainer.num_generations
    for entry, batch, texts in zip(logged, recorder.batches, embedder.calls):
        out = batch["output"]
        ids = [row[mask.bool()].tolist() for row, mask in zip(out["completion_ids"], out["completion_mask"])]
        assert texts == trainer.processing_class.batch_decode(ids, skip_special_tokens=True)
        assert entry["diversity/unique_fraction"] == pytest.approx(unique_fraction(ids, g))
        assert entry["diversity/distinct_1"] == pytest.approx(distinct_n(ids, g, 1))
        assert entry["diversity/distinct_2"] == pytest.approx(distinct_n(ids, g, 2))
        assert entry["diversity/embedding_similarity"] == pytest.approx(mean_pairwise_cosine(embedder.inner(texts), g))
        assert entry["diversity/entropy"] == entry["entropy"]  # TRL's token entropy, on the diversity panel


def test_no_diversity_metrics_by_default(tiny_model_dir, tmp_path):
    trainer = make_trainer(AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, beta=0.1, max_steps=1,
                           output_dir=str(tmp_path / "out"))  # fmt: skip
    trainer.train()
    assert not any(k.startswith("diversity/") for h in trainer.state.log_history for k in h)


def test_truncated_completions_masked_whole_are_measured_on_their_tokens(tiny_model_dir, tmp_path):
    """`mask_truncated_completions` zeroes a truncated row's mask; its diversity still counts its tokens, not ""."""
    embedder = RecordingEmbedder()
    trainer = make_trainer(
        AdaptiveKLGRPOTrainer, AdaptiveKLGRPOConfig, tiny_model_dir, beta=0.1, diversity_metrics=True, max_steps=1,
        mask_truncated_completions=True, generation_kwargs={"min_new_tokens": 8}, output_dir=str(tmp_path / "out"),
        trainer_kwargs={"diversity_embedder": embedder},
    )  # fmt: skip
    recorder = GenerationRecorder(trainer)
    trainer.train()
    out = recorder.batches[0]["output"]
    assert not out["completion_mask"].any()  # every completion ran to max_completion_length: all masked
    assert all(len(text) > 0 for text in embedder.calls[0])
    (entry,) = [h for h in trainer.state.log_history if "diversity/unique_fraction" in h]
    ids = [row.tolist() for row in out["completion_ids"]]
    assert entry["diversity/unique_fraction"] == pytest.approx(unique_fraction(ids, trainer.num_generations))
