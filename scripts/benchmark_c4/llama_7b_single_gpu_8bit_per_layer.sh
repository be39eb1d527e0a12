#!/usr/bin/env bash
# LLaMA-7B (configs/llama_7b.json) pretrained on C4 on ONE GPU: 8-bit plumage_adamw with per-layer updates
# (each weight steps inside its gradient hook, so full-size gradients never accumulate) and activation
# checkpointing. Reproduces GaLore's single-GPU 7B recipe (8-bit GaLore-Adam per layer, batch 16 per step,
# 512 sequences x 256 tokens per update, 150000 update steps, rank 1024) with plumage_adamw8bit's defaults at GaLore's
# lr 5e-3 and scale 0.25, refresh every 200 steps (GaLore: SVD, lr 5e-3, scale 0.25, refresh every 500).
# Since session 17 those defaults are GaLore's SVD basis with v_floor m2 (V ← max(V, M²) before each low-rank update),
# so the state is exactly GaLore's. With --projector plumage (PLUMAGE's draws, the default of sessions 14-16) a draw
# before every update comes from a pool of the top 2r singular vectors, stored in bfloat16 (pool_bf16), so the state
# is GaLore's plus r values of 1/p and 2r of p and order per weight (a float32 pool would need 3.5 GiB more).
# Expected peak (benchmarks/peak_memory.py, docs/memory.md; counted on a CPU, not measured on a GPU): 22.6 GiB at
# batch 16 (weights 12.55, 8-bit state 7.07, the largest gradient 0.24, checkpointed activations 2.33, the largest
# refresh SVD 0.40). GaLore reports 22.8 GB for its version on an RTX 4090. Batch 16 -> 32 accumulation steps.
# --residual none (the default since session 17; kept for --projector plumage): Fira's complement reads each weight's full gradient at its
# update, so under accumulation per-layer mode would keep all 13.5 GB of bf16 gradients; without it the micro-batch
# gradients are projected and summed in the low-rank space, and freed at once.
# No gradient clipping: per-layer updates step before a global gradient norm exists, so clipping is
# refused in this mode (--grad_clipping 0 is passed explicitly).
# Flags appended to the command line override the ones below (argparse keeps the last); to run GaLore's
# optimizer instead (the name picks projector and realignment):
#   scripts/benchmark_c4/llama_7b_single_gpu_8bit_per_layer.sh --optimizer galore_adamw8bit_per_layer \
#       --lr 5e-3 --galore_scale 0.25 --update_proj_gap 500
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."   # repository root: configs/ and torchrun_main.py live there

torchrun --standalone --nproc_per_node "${NPROC:-1}" torchrun_main.py \
    --model_config configs/llama_7b.json \
    --dataset allenai/c4 \
    --tokenizer t5-base \
    --max_length 256 \
    --single_gpu \
    --optimizer plumage_adamw8bit_per_layer \
    --activation_checkpointing \
    --rank 1024 \
    --lr 5e-3 \
    --galore_scale 0.25 \
    --update_proj_gap 200 \
    --scheduler cosine \
    --min_lr_ratio 0.1 \
    --warmup_steps 15000 \
    --num_training_steps 150000 \
    --batch_size 16 \
    --total_batch_size 512 \
    --grad_clipping 0 \
    --residual none \
    --weight_decay 0 \
    --dtype bfloat16 \
    --eval_every 1000 \
    --save_every 10000 \
    --save_dir checkpoints/plumage_7b_single_gpu_8bit_per_layer \
    "$@"
