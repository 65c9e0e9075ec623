# ProcessBench recipe: how good are judge labels and MC labels? ingest -> judge -> mc-label -> eval.
#
#   make -f recipes/processbench.mk SAMPLE=20                      # bundled model on CPU, 20 random rows
#   make -f recipes/processbench.mk WORK=out/pb-7b SPLITS="gsm8k math" SAMPLE= \
#        MODEL=/models/Qwen2.5-Math-7B-Instruct JUDGE_MODEL=/models/Qwen2.5-7B-Instruct \
#        JUDGE_ARGS="--max-tokens 4096 --max-model-len 8192" MC_ARGS="--max-tokens 1024"   # a GPU machine
#   make -f recipes/processbench.mk WORK=out/pb-served LABELERS=judge SAMPLE= JUDGE_MODEL=qwen-72b \
#        JUDGE_ENGINE_ARGS="--engine openai --base-url http://judge-host:8000/v1"      # a served judge only
#
# Per split: `ingest processbench` (human first-error labels; gold answers recovered from GSM8K test /
# MATH-500), `judge` (JUDGE_MODEL, configured independently; needs no gold answer), `mc-label` on the
# judge's output (the completer MODEL), so one shard holds both labelers; then `eval processbench` prints
# the F1 of each labeler per split and averaged, and `eval agreement` compares the two. Figures go to
# $(WORK)/eval/*.json. LABELERS picks the labelers to run: "judge mc" (default), "judge" or "mc".
# ProcessBench math rows without a recoverable gold answer (412 of 1000) cannot be MC-labelled: they keep
# an error and count as missing MC predictions, so mc-label may fail up to MC_MAX_ERROR_RATE of the rows.
# The settings are recorded in $(WORK)/recipe.vars: another set of settings needs another WORK.
SHELL := bash
STEPKIT ?= .venv/bin/stepkit
DATA ?= ../shared/data
SPLITS ?= gsm8k
# Rows per split: a seeded random sample (ProcessBench lists all erroneous samples first), empty = all.
SAMPLE ?= 20
SEED ?= 0
WORK ?= out/processbench
LABELERS ?= judge mc
MODEL ?= smollm2-135m
JUDGE_MODEL ?= $(MODEL)
ENGINE_ARGS ?=
JUDGE_ENGINE_ARGS ?= $(ENGINE_ARGS)
K ?= 4
MC_ARGS ?= --max-tokens 192
MC_MAX_ERROR_RATE ?= 1
VOTES ?= 1
JUDGE_ARGS ?= --max-tokens 512

VARS := SPLITS=$(SPLITS) SAMPLE=$(SAMPLE) SEED=$(SEED) LABELERS=$(LABELERS) MODEL=$(MODEL) JUDGE_MODEL=$(JUDGE_MODEL) K=$(K) MC_ARGS=$(MC_ARGS) VOTES=$(VOTES) JUDGE_ARGS=$(JUDGE_ARGS) MC_MAX_ERROR_RATE=$(MC_MAX_ERROR_RATE) ENGINE_ARGS=$(ENGINE_ARGS) JUDGE_ENGINE_ARGS=$(JUDGE_ENGINE_ARGS) DATA=$(DATA)
include $(dir $(lastword $(MAKEFILE_LIST)))record-vars.mk

JUDGE := $(filter judge,$(LABELERS))
MC := $(filter mc,$(LABELERS))
ifeq ($(JUDGE)$(MC),)
$(error LABELERS must name judge, mc or both, got "$(LABELERS)")
endif
# The last stage's folder holds every labeler's columns.
FINAL := $(if $(MC),labeled,judged)

.PHONY: all eval
.SECONDARY:
all: eval

$(WORK)/pb/%.parquet:
	$(STEPKIT) ingest processbench $(DATA)/processbench/$*.json $@ $(if $(SAMPLE),--sample $(SAMPLE) --seed $(SEED)) \
		--answers $(DATA)/gsm8k/test.jsonl --answers $(DATA)/math500/test.jsonl

$(WORK)/judged/%.parquet: $(WORK)/pb/%.parquet
	$(STEPKIT) judge $< $@ --model $(JUDGE_MODEL) --votes $(VOTES) $(JUDGE_ARGS) --no-progress $(JUDGE_ENGINE_ARGS)

$(WORK)/labeled/%.parquet: $(WORK)/$(if $(JUDGE),judged,pb)/%.parquet
	$(STEPKIT) mc-label $< $@ --model $(MODEL) --continuations $(K) $(MC_ARGS) \
		--max-error-rate $(MC_MAX_ERROR_RATE) --no-progress $(ENGINE_ARGS)

eval: $(SPLITS:%=$(WORK)/$(FINAL)/%.parquet)
	$(if $(MC),$(STEPKIT) eval processbench $(WORK)/$(FINAL) --pred mc_first_error --json $(WORK)/eval/f1-mc.json)
	$(if $(JUDGE),$(STEPKIT) eval processbench $(WORK)/$(FINAL) --pred judge_first_error --json $(WORK)/eval/f1-judge.json)
	$(if $(JUDGE),$(if $(MC),$(STEPKIT) eval agreement $(WORK)/$(FINAL) --a mc_first_error --b judge_first_error \
		--json $(WORK)/eval/agreement.json))
