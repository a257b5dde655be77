"""Where the tests find the repository's files, wherever in `tests/` a test module lives."""

import os


TESTS = os.path.dirname(os.path.abspath(__file__))  # the helpers (tiny.py, the workers) live here
REPO = os.path.dirname(TESTS)
