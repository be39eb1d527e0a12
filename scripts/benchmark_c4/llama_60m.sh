#!/usr/bin/env bash
# LLaMA-60M (configs/llama_60m.json) pretrained on C4 with plumage_adamw.
# Reproduces the 60M run of GaLore's C4 benchmark: same model, data, tokenizer, 512 sequences x 256 tokens
# per update, 10000 update steps, rank 128, projection refreshed every 200 steps. What differs is the
# the optimizer: plumage_adamw's defaults (since session 17 GaLore's SVD basis with v_floor m2, V ← max(V, M²)
# before each low-rank update; --projector plumage for PLUMAGE's draws), lr 1e-2 / scale 0.25 (GaLore: SVD, lr 1e-2,
# scale 0.25).
# Hardware assumed: 1 GPU with 80 GB (GaLore used 1 A100). Batch 256 per GPU -> 2 accumulation steps.
# Set the GPU count with NPROC=<n> (512 must be a multiple of batch_size x NPROC). Flags appended to the
# command line override the ones below (argparse keeps the last). The optimizer name picks
# the projector and realignment, so switching method is one flag plus its lr, e.g. GaLore's settings:
#   scripts/benchmark_c4/llama_60m.sh --optimizer galore_adamw --lr 1e-2 --galore_scale 0.25
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."   # repository root: configs/ and torchrun_main.py live there

torchrun --standalone --nproc_per_node "${NPROC:-1}" torchrun_main.py \
    --model_config configs/llama_60m.json \
    --dataset allenai/c4 \
    --tokenizer t5-base \
    --max_length 256 \
    --optimizer plumage_adamw \
    --rank 128 \
    --update_proj_gap 200 \
    --scheduler cosine \
    --min_lr_ratio 0.1 \
    --warmup_steps 1000 \
    --num_training_steps 10000 \
    --batch_size 256 \
    --total_batch_size 512 \
    --weight_decay 0 \
    --dtype bfloat16 \
    --eval_every 1000 \
    --save_every 10000 \
    --save_dir checkpoints/plumage_60m \
    "$@"
