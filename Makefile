# Set-up and test entry points. `make test` and `make lab` each create .venv on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Simulated GPUs for the demo when the machine has no NVIDIA driver (always shown as simulated).
LAB_GPUS := $(shell nvidia-smi -L >/dev/null 2>&1 || echo 4x16GiB)

.PHONY: install test lint lab demo clean

# The JupyterLab extension (labextension/) is built by pip's build hook (jupyter-builder,
# Node.js >= 20.19) and installed prebuilt; editing its sources re-runs that build.
LABEXT_STAMP := $(VENV)/.labextension
LABEXT_SRC := $(wildcard labextension/src/*.ts labextension/style/*) \
	labextension/package.json labextension/tsconfig.json labextension/yarn.lock

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)
	touch $(LABEXT_STAMP)

$(LABEXT_STAMP): $(STAMP) $(LABEXT_SRC)
	$(PY) -m pip install -q --no-deps -e .
	touch $(LABEXT_STAMP)

install: $(STAMP) $(LABEXT_STAMP)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check jupyter_dlsched tests benchmarks
	$(VENV)/bin/mypy

test: install lint
	$(VENV)/bin/pytest

# JupyterLab on the quickstart notebook, the sidebar on the left, simulated GPUs when there are none.
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
lab: install
	DLSCHED_SIMULATE_GPUS=$${DLSCHED_SIMULATE_GPUS:-$(LAB_GPUS)} $(VENV)/bin/jupyter lab $(LAB_ROOT) notebooks/quickstart.ipynb

demo: lab

clean:
	rm -rf $(VENV) build dist *.egg-info
