# The whole pipeline on GSM8K: ingest -> rollout -> mc-label -> judge -> filter -> export -> publish.
#
#   make -f recipes/pipeline.mk                                   # bundled model on CPU; publish --dry-run
#   make -f recipes/pipeline.mk REPO_ID=my-org/gsm8k-prm          # and upload (HF_TOKEN; HF_HUB_OFFLINE unset)
#   make -f recipes/pipeline.mk MODEL=scripted:echo WORK=out/pipe-scripted   # scripted stand-ins, no model (seconds)
#   make -f recipes/pipeline.mk WORK=out/pipe-7b N=500 MODEL=/models/Qwen2.5-Math-7B-Instruct \
#       JUDGE_MODEL=/models/Qwen2.5-7B-Instruct JUDGE_ARGS="--max-tokens 4096 --max-model-len 8192" \
#       FILTER_RULES="status:mc_status=ok consensus:mc_first_error,judge_first_error truncate-after-first-error:mc_label"
#
# One file per stage under WORK; a rerun only redoes what is missing, and an interrupted stage resumes
# from its committed chunks. With the bundled 135M model few rollouts are correct, so few rows have a
# Monte Carlo signal: the default filter keeps those (status:mc_status=ok) and cuts them after their
# first error; the consensus rule (MC and judge agree) needs models that can label.
# The scripted stand-ins (MODEL=scripted:...) label nothing: scripted:echo answers with the last number of
# the prompt, which is no GSM8K answer, so no continuation ever succeeds and every mc-label row is
# no_signal (and its K continuations are copies: mc-label warns about the distinct share). There the
# defaults are the scripted engine and judge, the rules no-error steps:1- (status:mc_status=ok would match
# no row) and the judge's labels for export, so the whole chain still runs end to end.
SHELL := bash
STEPKIT ?= .venv/bin/stepkit
DATA ?= ../shared/data
WORK ?= out/pipeline
MODEL ?= smollm2-135m
SCRIPTED := $(filter scripted:%,$(MODEL))
JUDGE_MODEL ?= $(if $(SCRIPTED),scripted:judge,$(MODEL))
ENGINE_ARGS ?= $(if $(SCRIPTED),--engine scripted,)
JUDGE_ENGINE_ARGS ?= $(ENGINE_ARGS)
N ?= 8
SAMPLES ?= 4
K ?= 4
RECIPE ?= recipes/gsm8k-rollout.yaml
MC_ARGS ?= --max-tokens 192
JUDGE_ARGS ?= --max-tokens 512
FILTER_RULES ?= $(if $(SCRIPTED),no-error steps:1-,status:mc_status=ok truncate-after-first-error:mc_label)
EXPORT_ARGS ?= --format trl --labels $(if $(SCRIPTED),judge_label,mc_value)
REPO_ID ?=
PUBLISH_ARGS ?=

VARS := N=$(N) SAMPLES=$(SAMPLES) K=$(K) MODEL=$(MODEL) JUDGE_MODEL=$(JUDGE_MODEL) RECIPE=$(RECIPE) MC_ARGS=$(MC_ARGS) JUDGE_ARGS=$(JUDGE_ARGS) ENGINE_ARGS=$(ENGINE_ARGS) JUDGE_ENGINE_ARGS=$(JUDGE_ENGINE_ARGS) FILTER_RULES=$(FILTER_RULES) EXPORT_ARGS=$(EXPORT_ARGS) DATA=$(DATA)
include $(dir $(lastword $(MAKEFILE_LIST)))record-vars.mk

.PHONY: all publish stats
.SECONDARY:
all: publish

$(WORK)/problems.parquet:
	$(STEPKIT) ingest gsm8k $(DATA)/gsm8k/test.jsonl $@ --limit $(N)

$(WORK)/rollouts.parquet: $(WORK)/problems.parquet
	$(STEPKIT) rollout $< $@ --model $(MODEL) --samples $(SAMPLES) --recipe $(RECIPE) --no-progress $(ENGINE_ARGS)

$(WORK)/labeled.parquet: $(WORK)/rollouts.parquet
	$(STEPKIT) mc-label $< $@ --model $(MODEL) --continuations $(K) $(MC_ARGS) --no-progress $(ENGINE_ARGS)

$(WORK)/judged.parquet: $(WORK)/labeled.parquet
	$(STEPKIT) judge $< $@ --model $(JUDGE_MODEL) $(JUDGE_ARGS) --no-progress $(JUDGE_ENGINE_ARGS)

$(WORK)/filtered.parquet: $(WORK)/judged.parquet
	$(STEPKIT) filter $< $@ $(foreach r,$(FILTER_RULES),--rule $(r)) --dropped $(WORK)/dropped.parquet --no-progress

$(WORK)/dataset/stepkit.manifest.json: $(WORK)/filtered.parquet
	$(STEPKIT) export $< $(WORK)/dataset $(EXPORT_ARGS) --force

publish: $(WORK)/dataset/stepkit.manifest.json
	$(STEPKIT) publish $(WORK)/dataset $(if $(REPO_ID),--repo-id $(REPO_ID),--dry-run) $(PUBLISH_ARGS)

stats:
	$(STEPKIT) stats $(WORK)/filtered.parquet
