"""Scaffolding for tests, examples and benchmarks: tiny random-weight models built offline (`tiny_model`), a
plain-torch stand-in for TRL 1.15's GPU-only log-probability kernel (`cpu_scorer`), and fabricated micro-batches to
compare two trainers' losses and gradients (`batches`). Library code never imports it."""
