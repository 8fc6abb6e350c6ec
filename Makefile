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

export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1
export WANDB_MODE ?= offline

.PHONY: setup test lint format clean help

help:  ## list targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install "$(TORCH_SPEC)"; fi
	$(BIN)/python -m pip install -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)  ## create .venv and install selskill with its dev tools

test: $(STAMP)  ## run the offline test suite
	WANDB_MODE=disabled $(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)  ## ruff check
	$(BIN)/ruff check $(wildcard selskill pipelines tests)

format: $(STAMP)  ## ruff format + autofix
	$(BIN)/ruff check --fix $(wildcard selskill pipelines tests)
	$(BIN)/ruff format $(wildcard selskill pipelines tests)

clean:  ## remove the virtual environment
	rm -rf $(VENV)
