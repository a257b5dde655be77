# Targets named in the README. PYTHON is the interpreter of the environment to use (e.g. a virtualenv's).
PYTHON ?= python

.PHONY: install demo quickstart test ci

install:  ## the package with its test dependencies (install torch first: pip install torch==2.13.0 on CPU)
	$(PYTHON) -m pip install -e ".[dev]"

demo:  ## the main job: the five KL methods on the embedded policy and task (CPU, ~5 min); results in adaptive-kl-demo/
	$(PYTHON) -m adaptive_kl demo

quickstart:  ## a short run with an adaptive KL method on a tiny offline model
	$(PYTHON) examples/quickstart.py

test:  ## the test suite (CPU, offline)
	$(PYTHON) -m pytest tests -q

ci:  ## what CI runs: fresh environments for the newest TRL and TRL 1.15, each running the test suite
	bash .ci/run
