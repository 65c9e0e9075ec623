# The closed loop for one labeller: labelled trajectories -> export -> train-prm -> prm-label -> eval.
#
#   make -f recipes/prm-loop.mk LABELLED=out/clue.parquet LABELS=clue_label NAME=clue      # any labeller's shard
#   make -f recipes/prm-loop.mk LABELLED=out/mc.parquet LABELS=mc_label NAME=mc BASE=/models/Qwen2.5-Math-1.5B \
#        TRAIN_ARGS="--max-length 2048 --epochs 1 --batch-size 16 --learning-rate 1e-5"     # a GPU machine
#
# LABELLED is a labelled trajectories shard (or folder) whose problems are not ProcessBench's; LABELS its label
# column (step labels, step values or a first-error index: what `export --labels` takes). PB is an ingested
# ProcessBench shard (default: gsm8k, ingested here). The PRM is trained from BASE with TRAIN_ARGS and scored
# by `eval processbench` into $(WORK)/$(NAME)/f1.json at prm-label's threshold (0.5 unless PRM_ARGS says):
# a PRM trained on mostly positive labels puts its scores on one side of 0.5, so give it a threshold tuned
# elsewhere, PRM_ARGS="--calibrate TUNE_SCORED" (a prm-label output of the same PRM on rows with gold first
# errors that are not PB's). bench/closed_loop.py runs this loop for clue, outcome, last-step, mc-label and
# likelihood-label labels on the GSM8K model solutions with one budget, tunes each PRM's threshold on one half
# of ProcessBench gsm8k, and prints the comparison on the other half.
SHELL := bash
STEPKIT ?= .venv/bin/stepkit
DATA ?= ../shared/data
WORK ?= out/prm-loop
NAME ?= labeller
LABELLED ?=
LABELS ?=
BASE ?= smollm2-135m
TRAIN_ARGS ?= --max-length 512 --max-steps 50 --batch-size 4
PB ?= $(WORK)/pb.parquet
PRM_ARGS ?=

ifeq ($(LABELLED)$(LABELS),)
$(error give LABELLED=SHARD and LABELS=COLUMN (e.g. LABELLED=out/clue.parquet LABELS=clue_label))
endif

.PHONY: all
.SECONDARY:
all: $(WORK)/$(NAME)/f1.json

$(WORK)/pb.parquet:
	$(STEPKIT) ingest processbench $(DATA)/processbench/gsm8k.json $@

$(WORK)/$(NAME)/dataset/stepkit.manifest.json: $(LABELLED)
	$(STEPKIT) export $< $(@D) --format trl --labels $(LABELS) --force

$(WORK)/$(NAME)/prm/stepkit-prm.json: $(WORK)/$(NAME)/dataset/stepkit.manifest.json
	$(STEPKIT) train-prm $(<D) $(@D) --base-model $(BASE) $(TRAIN_ARGS) --no-progress --force

$(WORK)/$(NAME)/scored.parquet: $(WORK)/$(NAME)/prm/stepkit-prm.json $(PB)
	$(STEPKIT) prm-label $(PB) $@ --model $(<D) $(PRM_ARGS) --no-progress --force

$(WORK)/$(NAME)/f1.json: $(WORK)/$(NAME)/scored.parquet
	$(STEPKIT) eval processbench $< --pred prm_first_error --json $@
