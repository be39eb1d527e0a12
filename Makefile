# The two commands of the README's quick start: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test lint demo clean

# torch goes in first, on its own: anything that needs torch, installed before it, would pull the
# multi-GB CUDA build instead of the CPU wheel.
$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]" -c constraints.txt
	touch $(STAMP)

install: $(STAMP)

test: install
	$(PY) -m pytest tests -q

lint: install
	$(VENV)/bin/ruff check .

demo: install
	$(PY) examples/projector_demo.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
