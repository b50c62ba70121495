# Set-up and test entry points. `make test` and `make lab` each create .venv on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Simulated GPUs for the demo when the machine has no NVIDIA driver (always shown as simulated).
LAB_GPUS := $(shell nvidia-smi -L >/dev/null 2>&1 || echo 4x16GiB)

.PHONY: install test lint lab demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check jupyter_dlsched tests benchmarks
	$(VENV)/bin/mypy

test: install lint
	$(VENV)/bin/pytest

lab: install
	DLSCHED_SIMULATE_GPUS=$${DLSCHED_SIMULATE_GPUS:-$(LAB_GPUS)} $(VENV)/bin/jupyter lab notebooks/quickstart.ipynb

demo: lab

clean:
	rm -rf $(VENV) build dist *.egg-info
