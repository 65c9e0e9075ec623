# GSM8K recipe: ingest -> rollout -> mc-label over a folder of shards, one pattern rule per stage.
#
#   make -f recipes/gsm8k.mk -j2 SHARDS=4 PER_SHARD=8                       # offline vLLM, bundled model
#   make -f recipes/gsm8k.mk -j8 ENGINE_ARGS="--engine openai --base-url http://127.0.0.1:8000/v1"
#
# Each shard is its own chain of targets, so `make -j` runs shards in parallel (with the openai engine,
# many jobs share one inference server), and a rerun only redoes missing outputs. stepkit writes every
# output atomically and resumes killed runs from committed chunks, so an interrupted `make` is safe to
# start again.
SHELL := bash
STEPKIT ?= .venv/bin/stepkit
DATA ?= ../shared/data
WORK ?= out/gsm8k
MODEL ?= smollm2-135m
ENGINE_ARGS ?=
SHARDS ?= 2
PER_SHARD ?= 4
SAMPLES ?= 4
K ?= 4
RECIPE ?= recipes/gsm8k-rollout.yaml
MC_ARGS ?= --max-tokens 192

VARS := SHARDS=$(SHARDS) PER_SHARD=$(PER_SHARD) SAMPLES=$(SAMPLES) K=$(K) MODEL=$(MODEL) RECIPE=$(RECIPE) MC_ARGS=$(MC_ARGS) ENGINE_ARGS=$(ENGINE_ARGS) DATA=$(DATA)
include $(dir $(lastword $(MAKEFILE_LIST)))record-vars.mk

IDS := $(shell seq -f '%05g' 0 $$(( $(SHARDS) - 1 )))
LABELED := $(IDS:%=$(WORK)/labeled/shard-%.parquet)

.PHONY: all stats
.SECONDARY:          # keep problems/rollouts shards: they are inputs of later stages
all: $(LABELED)

# Problems shard i holds GSM8K test problems [i * PER_SHARD, (i + 1) * PER_SHARD).
$(WORK)/problems/shard-%.parquet:
	$(STEPKIT) ingest gsm8k $(DATA)/gsm8k/test.jsonl $@ --skip $$(( 10#$* * $(PER_SHARD) )) --limit $(PER_SHARD)

$(WORK)/rollouts/%.parquet: $(WORK)/problems/%.parquet
	$(STEPKIT) rollout $< $@ --model $(MODEL) --samples $(SAMPLES) --recipe $(RECIPE) --no-progress $(ENGINE_ARGS)

$(WORK)/labeled/%.parquet: $(WORK)/rollouts/%.parquet
	$(STEPKIT) mc-label $< $@ --model $(MODEL) --continuations $(K) $(MC_ARGS) --no-progress $(ENGINE_ARGS)

stats:
	$(STEPKIT) stats $(WORK)/labeled
