# Set-up and test entry points. `make lab` creates .venv with what the lab and the notebooks
# need; `make test` (and `make install`) adds the test tool chain (Ray, Dask, schemathesis,
# Playwright, mypy, ruff, ...).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# everything: the lab, the notebooks and the test tools (`.[lab,test]`)
STAMP := $(VENV)/.installed
# what JupyterLab and notebooks/ need (`.[lab]`); the full install satisfies it too
LAB_STAMP := $(VENV)/.installed-lab
# Simulated GPUs for the demo when the machine has no NVIDIA driver (always shown as simulated).
LAB_GPUS := $(shell nvidia-smi -L >/dev/null 2>&1 || echo 4x16GiB)

.PHONY: install lab-install test lint lab demo clean

# The JupyterLab extension (labextension/) is built by pip's build hook (jupyter-builder,
# Node.js >= 20.19) and installed prebuilt; editing its sources re-runs that build.
LABEXT_STAMP := $(VENV)/.labextension
LABEXT_SRC := $(wildcard labextension/src/*.ts labextension/style/*) \
	labextension/package.json labextension/tsconfig.json labextension/yarn.lock

define make_venv
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
endef

# jsonschema's optional IRI checker (rfc3987-syntax, pulled in by jupyter-events'
# `jsonschema[format-nongpl]`) builds some thirty Earley parsers when jsonschema is imported:
# 1.3 to 1.8 s of CPU in every Jupyter server, notebook job and test worker that imports it. No
# Jupyter schema, and none of ours, uses the `iri` formats it checks; without it jsonschema
# leaves those formats unchecked (`pip check` stays clean). docs/jupyterlab.md tells pip users.
define drop_slow_iri_checker
	$(PY) -m pip uninstall -q -y rfc3987-syntax
endef

$(STAMP): pyproject.toml
	$(make_venv)
	$(PY) -m pip install -q -e ".[lab,test]"
	$(drop_slow_iri_checker)
	touch $(STAMP) $(LAB_STAMP) $(LABEXT_STAMP)

$(LAB_STAMP): pyproject.toml
	$(make_venv)
	$(PY) -m pip install -q -e ".[lab]"
	$(drop_slow_iri_checker)
	touch $(LAB_STAMP) $(LABEXT_STAMP)

$(LABEXT_STAMP): $(LAB_STAMP) $(LABEXT_SRC)
	$(PY) -m pip install -q --no-deps -e .
	touch $(LABEXT_STAMP)

install: $(STAMP) $(LABEXT_STAMP)

lab-install: $(LAB_STAMP) $(LABEXT_STAMP)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check jupyter_dlsched tests benchmarks
	$(VENV)/bin/mypy

# The suite runs in parallel, a file to a worker (tests of one file share its fixtures and
# run in order): two workers more than the cores, since most tests wait on processes (on 2
# cores: 4 workers 10 min 20 s, 3 workers 11 min 11 s). Files go out in collection order,
# the heaviest first (tests/conftest.py, HEAVY_FILES), not reordered by xdist by how many
# tests each holds.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 2 )))

# The package is compiled first: every agent, supervisor, CLI run, kernel and server of the
# suite imports it, and where PYTHONDONTWRITEBYTECODE is set each would compile it again
# (0.1 s of CPU per process, some 1,500 processes).
test: install lint
	$(PY) -m compileall -q jupyter_dlsched tests benchmarks
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# JupyterLab on the quickstart notebook, the sidebar on the left, simulated GPUs when there are none.
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
# ... with a GPU kernelspec ("Python 3 · 1 GPU", docs/kernels.md) in the lab's environment
lab: lab-install
	$(VENV)/bin/dlsched kernels install --gpus 1 --sys-prefix --name python3-1gpu >/dev/null
	DLSCHED_SIMULATE_GPUS=$${DLSCHED_SIMULATE_GPUS:-$(LAB_GPUS)} $(VENV)/bin/jupyter lab $(LAB_ROOT) notebooks/quickstart.ipynb

demo: lab

clean:
	rm -rf $(VENV) build dist *.egg-info
