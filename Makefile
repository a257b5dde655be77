# Targets named in the README. PYTHON is the interpreter of the environment to use (e.g. a virtualenv's).
PYTHON ?= python

.PHONY: install demo quickstart test bench bench-smollm2 soak studies real-studies ci

install:  ## the package with its test dependencies (install torch first: pip install torch==2.13.0 on CPU)
	$(PYTHON) -m pip install -e ".[dev]"

demo:  ## the main job: the five KL methods on the embedded policy and task (CPU, about 5 min); results in adaptive-kl-demo/
	$(PYTHON) -m adaptive_kl demo

quickstart:  ## a short run with an adaptive KL method on a tiny offline model
	$(PYTHON) demos/quickstart.py

test:  ## the test suite (CPU, offline)
	$(PYTHON) -m pytest tests -q -n auto

bench:  ## speed and memory vs stock GRPOTrainer on the CPU (tiny and 30M models, the reference, KL term alone); ~40 min
	$(PYTHON) benchmarks/step_overhead.py --steps 40 --warmup 5 --rounds 5 --output benchmarks/results/cpu-step-tiny.md
	$(PYTHON) benchmarks/step_overhead.py --shape small-30m --steps 16 --warmup 2 --rounds 3 --completion-length 16 \
		--scalings none --output benchmarks/results/cpu-step-small-30m.md
	$(PYTHON) benchmarks/reference_cost.py --shape small-30m --steps 14 --warmup 2 --rounds 3 --completion-length 16 \
		--output benchmarks/results/cpu-reference-cost-small-30m.md
	$(PYTHON) benchmarks/kl_term.py --output benchmarks/results/cpu-kl-term.md
	$(PYTHON) benchmarks/kl_term.py --shape tiny --output benchmarks/results/cpu-kl-term-tiny.md

# reference_cost.py on SmolLM2 holds its 8 trainers at once (full fine-tuning with a reference copy among them):
# about 17 GiB of memory. Run it alone on a 24 GiB machine (beside a test suite it was OOM-killed, 2026-11-25).
bench-smollm2:  ## step, reference, β = 0 and drift-measurement costs on SmolLM2-135M-Instruct (LoRA; the reference ones add full fine-tuning); ~110 min
	$(PYTHON) benchmarks/step_overhead.py --model smollm2 --lora --steps 6 --warmup 1 --rounds 2 --completion-length 48 \
		--scalings none --output benchmarks/results/cpu-step-smollm2-lora.md
	$(PYTHON) benchmarks/reference_cost.py --model smollm2 --steps 5 --warmup 1 --rounds 2 --completion-length 48 \
		--output benchmarks/results/cpu-reference-cost-smollm2.md
	$(PYTHON) benchmarks/zero_beta_cost.py --model smollm2 --lora --steps 22 --switch-step 12 --warmup 1 --rounds 1 \
		--completion-length 48 --output benchmarks/results/cpu-zero-beta-smollm2-lora.md
	$(PYTHON) benchmarks/drift_cost.py --model smollm2 --lora --steps 11 --warmup 1 --rounds 2 --completion-length 48 \
		--output benchmarks/results/cpu-drift-cost-smollm2-lora.md

soak:  ## 300 steps of every KL method on the tiny model: no NaN, resident memory growth < 5% after warm-up; ~5 min
	$(PYTHON) benchmarks/soak.py --output benchmarks/results/cpu-soak.md

studies:  ## the seed studies of docs/studies/ (5 seeds each, two side by side on 2 cores; ~90 min; skips finished ones)
	$(PYTHON) scripts/run_studies.py

real-studies:  ## the real-model studies of docs/studies/real/ (hours on 2 cores; skips finished runs; run it with nohup)
	$(PYTHON) scripts/run_real_studies.py

ci:  ## what CI runs: fresh environments for the newest TRL and TRL 1.15, each running the test suite
	bash .ci/run
