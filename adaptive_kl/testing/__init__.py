"""Scaffolding for tests, examples and benchmarks: tiny random-weight models built offline (`tiny_model`) and
fabricated micro-batches to compare two trainers' losses and gradients (`batches`). Library code never imports it
(tests/test_layout.py checks it); the CPU stand-in for TRL 1.15's scorer is runtime code, in `trainers.scorer`."""
