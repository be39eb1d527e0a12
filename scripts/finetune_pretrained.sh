#!/bin/bash
# The offline which-play task fine-tuned from `make demo`'s checkpoint (runs/demo/model_300) and from the same
# llama_tiny with fresh weights, seeds 0-2, plumage_adamw at 1e-3 for 2 epochs; each run's summary is the `final`
# record of runs/glue-{pre,scratch}-s<seed>/metrics.jsonl. Run from the repository root after `make demo`.
set -euo pipefail
checkpoint=${1:-runs/demo/model_300}
common=(--optimizer plumage_adamw --lora_all_modules --learning_rate 1e-3 --num_train_epochs 2 --no-progress)
for seed in 0 1 2; do
  .venv/bin/python run_glue.py --model_name_or_path "$checkpoint" "${common[@]}" --seed "$seed" \
    --output_dir "runs/glue-pre-s$seed"
  .venv/bin/python run_glue.py --eval_llama --model_name_or_path configs/llama_tiny.json --tokenizer "$checkpoint" \
    "${common[@]}" --seed "$seed" --output_dir "runs/glue-scratch-s$seed"
done
