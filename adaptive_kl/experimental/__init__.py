"""Algorithm variants beside the adaptive-KL GRPO trainer, one folder each (as TRL keeps `trl/experimental/<name>/`).

- `binomial`: the binomial-KL ("SPO") objective (`BinomialKLConfig`, `BinomialKLTrainer`).

Their API may change between minor releases.
"""
