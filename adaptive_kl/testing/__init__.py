"""Scaffolding for tests, examples and benchmarks: tiny random-weight models built offline (`tiny_model`) and a
plain-torch stand-in for TRL 1.15's GPU-only log-probability kernel (`cpu_scorer`). Library code never imports it."""
