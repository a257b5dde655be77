"""Deprecated alias of `adaptive_kl.metrics.diversity`, which this module moved to (see `adaptive_kl._deprecation`)."""

from adaptive_kl._deprecation import alias_moved_module


alias_moved_module(__name__)
