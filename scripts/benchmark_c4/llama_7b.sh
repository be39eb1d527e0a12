#!/usr/bin/env bash
# LLaMA-7B (configs/llama_7b.json) pretrained on C4 with plumage_adamw.
# Reproduces the 7B run of GaLore's C4 benchmark: same model, data, tokenizer, 512 sequences x 256 tokens
# per update, 150000 update steps, rank 1024. What differs is the optimizer
# (plumage_adamw's defaults: since session 17 GaLore's SVD basis with v_floor m2; --projector plumage for PLUMAGE's
# draws), its recommended lr 1e-2 / scale 0.25, refresh every 200 steps and no gradient clipping (GaLore's 7B: SVD,
# lr 5e-3, scale 0.25, refresh every 500 steps, --grad_clipping 1.0; append those flags to match it).
# Hardware assumed: 8 GPUs with 80 GB each, one node. Batch 8 per GPU -> 8 accumulation steps.
# GaLore ran 8 nodes x 8 A100 (no accumulation); --standalone is one node only, so for several nodes run
# the same torchrun_main.py arguments under torchrun with your cluster's rendezvous flags.
# Set the GPU count with NPROC=<n> (512 must be a multiple of batch_size x NPROC). Flags appended to the
# command line override the ones below (argparse keeps the last). The optimizer name picks
# the projector and realignment, so switching method is one flag plus its lr, e.g. GaLore's settings:
#   scripts/benchmark_c4/llama_7b.sh --optimizer galore_adamw --lr 1e-2 --galore_scale 0.25
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."   # repository root: configs/ and torchrun_main.py live there

torchrun --standalone --nproc_per_node "${NPROC:-8}" torchrun_main.py \
    --model_config configs/llama_7b.json \
    --dataset allenai/c4 \
    --tokenizer t5-base \
    --max_length 256 \
    --optimizer plumage_adamw \
    --rank 1024 \
    --update_proj_gap 200 \
    --scheduler cosine \
    --min_lr_ratio 0.1 \
    --warmup_steps 15000 \
    --num_training_steps 150000 \
    --batch_size 8 \
    --total_batch_size 512 \
    --weight_decay 0 \
    --dtype bfloat16 \
    --eval_every 1000 \
    --save_every 10000 \
    --save_dir checkpoints/plumage_7b \
    "$@"
