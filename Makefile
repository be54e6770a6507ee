# Two commands do everything: `make demo` (the main job) and `make test` (ruff, then the
# test suite); `make docs` builds the documentation site (MkDocs) into build/docs.
# Both install ge2jit with its dependencies into .venv first (CuPy, NVRTC and the CUDA headers
# come from pip; no CUDA toolkit is needed). CUDA 12 drivers: `make test CUDA=cuda12`, which
# uses an environment of its own, .venv-cuda12 (CuPy's cuda12x and cuda13x wheels in one
# environment conflict).
PYTHON ?= python3
CUDA ?= cuda13
VENV ?= $(if $(filter cuda13,$(CUDA)),.venv,.venv-$(CUDA))
PY := $(VENV)/bin/python
# the markers of ge2jit installed for another CUDA major in $(VENV) (a VENV= given by hand)
OTHER_CUDA := $(filter-out $(VENV)/.installed-$(CUDA),$(wildcard $(VENV)/.installed-cuda*))

.PHONY: demo test test-slow test-gpu docs clean

$(VENV)/.installed-$(CUDA): pyproject.toml
	$(if $(OTHER_CUDA),$(error $(VENV) holds ge2jit for $(patsubst $(VENV)/.installed-%,%,\
	$(OTHER_CUDA)), not $(CUDA): leave VENV unset (CUDA=$(CUDA) uses .venv-$(CUDA)) or name \
	another VENV))
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

# the docs extra (MkDocs, Material, mkdocstrings) added to the same environment
$(VENV)/.installed-docs: $(VENV)/.installed-$(CUDA) pyproject.toml
	$(PY) -m pip install -q -e ".[docs]"
	touch $@

# --strict: a warning (a broken link or anchor, a docstring griffe cannot read) fails the build
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/docs

clean:
	rm -rf $(VENV) .venv .venv-cuda12 build dist
