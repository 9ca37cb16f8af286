# The two set-up commands: `make demo` (translate the demo sentences with the shipped model) and
# `make test` (the test suite). Each makes or reuses the virtual environment .venv, installing
# the CPU build of torch before the package so that pip never pulls a CUDA build of several GB.
VENV ?= .venv
PYTHON ?= python3
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python

.PHONY: demo test venv

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) translate.py -model data/multi30k_en_de_raw.pt -src data/demo.en -output - -beam_size 5

test: $(VENV)/.installed
	$(PY) -m pytest -q -n auto --maxprocesses 4

$(VENV)/.installed: setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@
