# ProcessBench recipe: how good are MC labels and judge labels? ingest -> mc-label -> judge -> eval.
#
#   make -f recipes/processbench.mk SAMPLE=20                 # bundled model on CPU, 20 random rows per split
#   make -f recipes/processbench.mk SPLITS="gsm8k math" SAMPLE= MODEL=/models/Qwen2.5-Math-7B-Instruct \
#        JUDGE_MODEL=/models/Qwen2.5-7B-Instruct ENGINE_ARGS="--tensor-parallel-size 1"   # GPU machine
#
# Per split: `ingest processbench` (human first-error labels; gold answers recovered from GSM8K test /
# MATH-500), `judge` (JUDGE_MODEL, configured independently; needs no gold answer), `mc-label` on the
# judge's output (the completer MODEL), so one shard holds both labelers; then `eval processbench` prints
# the F1 of mc_first_error and of judge_first_error per split and averaged, and `eval agreement` compares
# the two labelers. Figures go to $(WORK)/eval/*.json.
# ProcessBench math rows without a recoverable gold answer (437 of 1000) cannot be MC-labelled: they are
# kept with an error (counted as missing predictions by eval), hence MC_MAX_ERROR_RATE.
SHELL := bash
STEPKIT ?= .venv/bin/stepkit
DATA ?= ../shared/data
SPLITS ?= gsm8k
# Rows per split: a seeded random sample (ProcessBench lists all erroneous samples first), empty = all.
SAMPLE ?= 20
SEED ?= 0
WORK ?= out/processbench
MODEL ?= smollm2-135m
JUDGE_MODEL ?= $(MODEL)
ENGINE_ARGS ?=
JUDGE_ENGINE_ARGS ?= $(ENGINE_ARGS)
K ?= 4
MC_ARGS ?= --max-tokens 192
MC_MAX_ERROR_RATE ?= 0.5
VOTES ?= 1
JUDGE_ARGS ?= --max-tokens 512

VARS := SPLITS=$(SPLITS) SAMPLE=$(SAMPLE) SEED=$(SEED) MODEL=$(MODEL) JUDGE_MODEL=$(JUDGE_MODEL) K=$(K) MC_ARGS=$(MC_ARGS) VOTES=$(VOTES) JUDGE_ARGS=$(JUDGE_ARGS) MC_MAX_ERROR_RATE=$(MC_MAX_ERROR_RATE) ENGINE_ARGS=$(ENGINE_ARGS) JUDGE_ENGINE_ARGS=$(JUDGE_ENGINE_ARGS) DATA=$(DATA)
include $(dir $(lastword $(MAKEFILE_LIST)))record-vars.mk

LABELED := $(SPLITS:%=$(WORK)/labeled/%.parquet)

.PHONY: all eval
.SECONDARY:
all: eval

$(WORK)/pb/%.parquet:
	$(STEPKIT) ingest processbench $(DATA)/processbench/$*.json $@ $(if $(SAMPLE),--sample $(SAMPLE) --seed $(SEED)) \
		--answers $(DATA)/gsm8k/test.jsonl --answers $(DATA)/math500/test.jsonl

$(WORK)/judged/%.parquet: $(WORK)/pb/%.parquet
	$(STEPKIT) judge $< $@ --model $(JUDGE_MODEL) --votes $(VOTES) $(JUDGE_ARGS) --no-progress $(JUDGE_ENGINE_ARGS)

$(WORK)/labeled/%.parquet: $(WORK)/judged/%.parquet
	$(STEPKIT) mc-label $< $@ --model $(MODEL) --continuations $(K) $(MC_ARGS) \
		--max-error-rate $(MC_MAX_ERROR_RATE) --no-progress $(ENGINE_ARGS)

eval: $(LABELED)
	$(STEPKIT) eval processbench $(WORK)/labeled --pred mc_first_error --json $(WORK)/eval/f1-mc.json
	$(STEPKIT) eval processbench $(WORK)/labeled --pred judge_first_error --json $(WORK)/eval/f1-judge.json
	$(STEPKIT) eval agreement $(WORK)/labeled --a mc_first_error --b judge_first_error --json $(WORK)/eval/agreement.json
