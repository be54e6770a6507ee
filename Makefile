# Two commands do everything: `make demo` (the main job) and `make test` (ruff, then the
# test suite).
# Both install ge2jit with its dependencies into .venv first (CuPy, NVRTC and the CUDA headers
# come from pip; no CUDA toolkit is needed). CUDA 12 drivers: `make test CUDA=cuda12`.
PYTHON ?= python3
CUDA ?= cuda13
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-slow test-gpu clean

$(VENV)/.installed-$(CUDA): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(CUDA),test]"
	touch $@

demo: $(VENV)/.installed-$(CUDA)
	$(PY) -m ge2jit.demo

test: $(VENV)/.installed-$(CUDA)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

test-slow: $(VENV)/.installed-$(CUDA)
	$(PY) -m pytest -m slow

test-gpu: $(VENV)/.installed-$(CUDA)
	$(PY) -m pytest -m gpu

clean:
	rm -rf $(VENV) build dist
