#!/bin/bash
# One device call of at most 10 minutes (docs/gpu_runbook.md): the llama_60m protocol's runs beside tests/gpu, then
# the CUDA timings with the GPU to themselves. Every part is bounded by a deadline in seconds from the start, and the
# results are archived into $OUT/results.tgz after each part, so a part cut off leaves the others.
#
#   bash scripts/gpu_check.sh   # on the device: run(command="bash scripts/gpu_check.sh", carry=[".whl", "data/shakespeare",
#                               #   "data/tokenizers", "runs/gpu60m"]) (docs/gpu_runbook.md §1)
#
# Settings (environment): TRAIN and TRAIN2 (the protocol's arms and lrs, two calls side by side; TRAIN2= skips it),
# TRAIN_END (s; the timings start then), END (s; the last part ends by then), SIZES (step_time's, space-separated,
# the first timed first), MODEL_SIZES / MODEL_SIZES_7B (model_refresh), and for a dry run on a CPU DEV=cpu with a tiny
# MODEL, STEPS, BATCH, LEN, EVERY, EVAL_TOKENS, GAP, PROJ_RANK, MB (corpus MB) and RUNS (the protocol's runs folder:
# a dry run's tiny runs must not replace the device's, whose commands differ, in runs/gpu60m).
# The variables are deliberately not named RANK or WORLD_SIZE: exported, those make torchrun_main.py a rank of a
# process group (a dry run with RANK=4 wrote no metrics).
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
export PYTHONPATH=$PWD/.whl/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:?set by the device tool}
END=${END:-560}; TRAIN_END=${TRAIN_END:-440}; DEV=${DEV:-cuda}
MODEL=${MODEL:-configs/llama_60m.json}; STEPS=${STEPS:-1000}; BATCH=${BATCH:-64}; LEN=${LEN:-256}; EVERY=${EVERY:-100}
EVAL_TOKENS=${EVAL_TOKENS:-200000}; GAP=${GAP:-200}; PROJ_RANK=${PROJ_RANK:-128}; MB=${MB:-60}; RUNS=${RUNS:-runs/gpu60m}
SIZES=${SIZES-350m 130m}; MODEL_SIZES=${MODEL_SIZES:-350m}; MODEL_SIZES_7B=${MODEL_SIZES_7B:-7b}
# Session 43 ran the large-batch defaults here (float32 three seeds, 8-bit seed 0, docs/results.md §3); next: 8-bit's
# seeds 1-2 for both arms at 1e-2 (TRAIN2), and plumage_adafactor's default since session 81 (GaLore's top-r basis at
# scale 0.25, the regular group at 4x) to the end of a run against GaLore's Adafactor recipe (reused at 1e-2), beside
# the float32 large-batch default at 5e-3 (its lr bracketed below; TRAIN). On the CPU the default's best lr was 0.5-0.7x
# the recipe's (7e-3 against 1e-2 at 600 updates, both 3e-3 at 5000), hence 5e-3 here. Five new runs.
TRAIN=${TRAIN:---arms galore_adafactor_recipe,galore_adafactor_recipe_gram_ratio4,galore_recipe_gram_ratio2_fira --pin_lr galore_adafactor_recipe=1e-2,galore_adafactor_recipe_gram_ratio4=5e-3,galore_recipe_gram_ratio2_fira=5e-3 --seeds 0 --jobs 3}
TRAIN2=${TRAIN2---arms galore8bit_recipe,galore8bit_recipe_gram_ratio2_fira --pin_lr galore8bit_recipe=1e-2,galore8bit_recipe_gram_ratio2_fira=1e-2 --seeds 0,1,2 --jobs 4}
ROWS="plumage_adamw default,large-batch pretraining default,κ = 1 (gram),ours plumage (gram64),ours plumage (svd),ours svd (gram)"
# the compiled rows compile for tens of seconds first: left out of the others and timed in a call of their own (session
# 46), only the float32 large-batch default's (the target's row; "/ adamw8bit" also contains "/ adamw"), 150 s at most
COMPILED="compile_update"; COMPILED_ROW="large-batch pretraining default + foreach + compile_update"
W=/tmp/gpu_check; mkdir -p $W
log() { echo "[$SECONDS s] $*" | tee -a $W/timeline.txt; }
left() { local t=$(( $1 - SECONDS )); [ $t -gt $2 ] && t=$2; [ $t -lt 1 ] && t=1; echo $t; }
pack() { tar czf $OUT/results.tgz -C $W . -C $PWD $(find $RUNS -name metrics.jsonl -o -name command.json \
  -o -name diverged -o -name stderr.txt 2>/dev/null); }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, bitsandbytes; print(torch.__version__, torch.version.cuda, transformers.__version__, bitsandbytes.__version__)"
  cat .whl/commit 2>/dev/null
} > $W/device.txt 2>&1; cat $W/device.txt

log corpus; python3 scripts/code_corpus.py --packages transformers,torch --min_mb $MB --out data/code.jsonl > $W/corpus.txt 2>&1
cp data/code.jsonl.manifest.json $W/ 2>/dev/null
python3 scripts/train_bpe.py data/code.jsonl >> $W/corpus.txt 2>&1; log "corpus rc $? $(tail -1 $W/corpus.txt)"

log training
protocol() {  # name, then the arms' flags
  local name=$1; shift
  OMP_NUM_THREADS=4 RAYON_NUM_THREADS=4 timeout $(left $TRAIN_END 500) python3 benchmarks/pretrain_protocol.py \
    --runs $RUNS --out $W --name $name --model_config $MODEL --dataset data/code.jsonl --steps $STEPS \
    --batch_size $BATCH --max_length $LEN --rank $PROJ_RANK --update_proj_gap $GAP --eval_every $EVERY \
    --eval_tokens $EVAL_TOKENS "$@" > $W/protocol_$name.log 2>&1
}
protocol gpu60m $TRAIN & training=$!
training2=; if [ -n "$TRAIN2" ]; then protocol gpu60m_b $TRAIN2 & training2=$!; fi
timeout $(left $TRAIN_END 260) python3 -m pytest tests/gpu -q -p no:cacheprovider > $W/gpu_tests.log 2>&1
log "tests rc $? $(tail -1 $W/gpu_tests.log)"
timeout $(left $TRAIN_END 120) python3 benchmarks/device_parity.py --device $DEV --out $W/device_parity.md \
  > $W/device_parity.log 2>&1; log "device_parity rc $?"
wait $training; log "training rc $?"; [ -n "$training2" ] && { wait $training2; log "training2 rc $?"; }; pack

log timings
step_time() {  # size [layers [rows [name]]]: ROWS but the compiled ones, or the rows given
  local pick=(--only "$ROWS" --skip "$COMPILED") cap=100
  [ -n "$3" ] && pick=(--only "$3" --skip "/ adamw8bit") && cap=150
  timeout $(left $END $cap) python3 benchmarks/step_time.py --device $DEV --sizes $1 --layers ${2:-1} --reps 15 \
    --refresh-reps 3 "${pick[@]}" --out $W/step_time_cuda_$1_x${2:-1}$4.md >> $W/timings.log 2>&1
  log "step_time $1 x${2:-1}$4 rc $?"; pack
}
# what issue 15's targets name first (a 350M layer; then its compiled rows, session 46: the large-batch default's
# group compiled), then a whole llama_60m's 8 layers in one group (what foreach's batched calls serve in a run;
# session 44), a llama_7b refresh, then the rest while time is left
first_size=${SIZES%% *}; step_time $first_size; step_time $first_size 1 "$COMPILED_ROW" _compiled; step_time 60m 8
timeout $(left $END 90) python3 benchmarks/model_refresh.py --device $DEV --sizes $MODEL_SIZES_7B --reps 1 \
  --only "ours svd (gram)" --batches none --out $W/model_refresh_cuda_7b.md >> $W/timings.log 2>&1
log "model_refresh 7b rc $?"; pack
timeout $(left $END 90) python3 benchmarks/model_refresh.py --device $DEV --sizes $MODEL_SIZES --reps 1 \
  --out $W/model_refresh_cuda.md >> $W/timings.log 2>&1; log "model_refresh rc $?"; pack
for size in ${SIZES#"$first_size"}; do step_time $size; done
log done; pack
