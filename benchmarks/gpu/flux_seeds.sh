#!/usr/bin/env bash
# The Flux seed faults on the real sd-scripts flux_train_network.py, under trainsup, on one CUDA GPU
# (issue 32's GPU half). Never in CI: it needs a GPU with ~40 GB, ~60 GB of disk and ~90 GB of RAM.
#
# usage (from the repository root): benchmarks/gpu/flux_seeds.sh [OUT]      (README.md beside it)
#   OUT   where the summary, logs and a tarball of every run dir go (default: $OUT, else /tmp/flux_seeds)
# needs, in the repository root (ignored paths, see README.md):
#   .gpu/sd-scripts   an unmodified copy of ../shared/realkohya/sd-scripts
#   .gpu/clip_tok     CLIP-L's vocab.json + merges.txt (the realkohya bed's tokenizer_cache folder)
#   .whl/trainer/     sd-scripts' pinned wheels (transformers 4.54.1, accelerate 1.6.0, diffusers 0.32.1,
#                     safetensors 0.4.5, ...), .whl/old/ safetensors 0.4.1, .whl/ts/ trainsup's missing deps
#                     and a wheel of trainsup built from a commit (README.md)
# env: PY (python with torch; default python3), WORK (default /tmp/flux), BUDGET_S (default 480: stages
#   that would start after it are skipped, each stage's timeout is cut to what is left),
#   STAGES (default "B A D C"), T5LEN (--t5xxl_max_token_length; default: sd-scripts' 512),
#   RES (image and sample size, default 256), FP8 (default --fp8_base; empty on a CPU rehearsal),
#   TRAINER_PY (skip building the trainer venvs: use this interpreter; rehearsals), FLUX_EXTRA (more flags)
#
# Stages, each one `trainsup run -- <trainer python> flux_train_network.py ...` on the same bed:
#   B  safetensors 0.4.1 in the trainer's interpreter (the float8 serializer seed)
#   A  --fp8_base over the bf16 checkpoint, --cache_latents and --cache_text_encoder_outputs on CUDA,
#      --sample_prompts, and a new prompt appended to the prompt file after the step-2 state (trainsup's
#      frozen prompt copies: the edit should wait for the step-4 state and relaunch from it)
#   D  A again with live.snapshot_prompts: false and on_prompt_change: ignore, so the real trainer meets
#      the edit itself at its step-4
#      sample (the 'NoneType'/unpack seed) and trainsup's te_cache_none remedy takes over
#   C  an AE checkpoint less one key, without --fp8_base (the meta-tensor seed's mechanism)
set -u
REPO=$(pwd)
OUT=${1:-${OUT:-/tmp/flux_seeds}}
WORK=${WORK:-/tmp/flux}
PY=${PY:-python3}
WHL=${WHL:-$REPO/.whl}
BUDGET_S=${BUDGET_S:-480}
STAGES=${STAGES:-"B A D C"}
RES=${RES:-256}
FP8=${FP8---fp8_base}
T0=$(date +%s)
mkdir -p "$OUT" "$WORK"
SUMMARY=$OUT/summary.txt
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
# the torch environment beside the trainer's pins holds flax/jax: keep transformers and diffusers on torch
export USE_TORCH=1 USE_TF=0 USE_FLAX=0 USE_JAX=0
say() { printf '[%4ds] %s\n' $(($(date +%s) - T0)) "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }

say "host: $(hostname); $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"
say "disk: $(df -h "$WORK" | tail -1); ram: $(free -g | awk '/Mem/{print $2" GB"}')"

# ------------------------------------------------------------------ interpreters
# trainsup runs in PY's environment (its missing deps from .whl/ts). The trainer gets a venv of its own
# whose site-packages hold sd-scripts' pins and reach PY's torch through a .pth line, so
# `TV/bin/python` is "the trainer's own interpreter" that trainsup's remedies name.
TORCH_SITE=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
make_venv() {  # make_venv DIR WHEEL...
  local dir=$1; shift
  [ -x "$dir/bin/python" ] && return 0
  "$PY" -m venv --without-pip "$dir" || return 1
  local site
  site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$@" 2>&1 | grep -v WARNING
  echo "import site; site.addsitedir('$TORCH_SITE')" >"$site/zz_torch_site.pth"
}
if [ -n "${TRAINER_PY:-}" ]; then
  TV=$TRAINER_PY TV041=${TRAINER_PY_OLD:-}
else
  make_venv "$WORK/tv" "$WHL"/trainer/*.whl || say "trainer venv: FAILED"
  # the same pins with safetensors 0.4.1 in place of 0.4.5
  make_venv "$WORK/tv041" $(ls "$WHL"/trainer/*.whl | grep -v /safetensors-) "$WHL"/old/safetensors-0.4.1-*.whl \
    || say "0.4.1 venv: FAILED"
  TV=$WORK/tv/bin/python TV041=$WORK/tv041/bin/python
fi
# trainsup itself: a wheel of a commit in .whl/ts when there is one (the tree that travels also holds
# other work in progress), else the tree, editable
if ! command -v trainsup >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile "$WHL"/ts/*.whl 2>&1 | grep -v WARNING
  ls "$WHL"/ts/trainsup-*.whl >/dev/null 2>&1 ||
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e "$REPO" 2>&1 | grep -v WARNING
fi
TS=$(command -v trainsup || echo "$(dirname "$(command -v "$PY")")/trainsup")
say "python $("$PY" -V 2>&1); torch $("$PY" -c 'import torch; print(torch.__version__, torch.cuda.is_available())')"
say "trainer: $("$TV" -c 'import transformers, accelerate, safetensors, diffusers; print("transformers", transformers.__version__, "accelerate", accelerate.__version__, "safetensors", safetensors.__version__, "diffusers", diffusers.__version__)' 2>&1 | tail -1)"
[ -n "$TV041" ] && say "trainer041: $("$TV041" -c 'import safetensors; print("safetensors", safetensors.__version__)' 2>&1 | tail -1)"
say "trainsup: $("$TS" --version 2>&1 | tail -1)"

# ------------------------------------------------------------------ the bed
BED=$WORK/bed
say "bed: generating under $BED"
"$TV" "$REPO/benchmarks/gpu/make_flux_bed.py" --out "$BED" --sd-scripts "$REPO/.gpu/sd-scripts" \
  --clip-tokenizer "$REPO/.gpu/clip_tok" --device "${DEVICE:-cuda}" --res "$RES" ${BED_ARGS:-} >"$OUT/gen.log" 2>&1
rc=$?
grep '^\[make_flux_bed' "$OUT/gen.log" | tee -a "$SUMMARY"
[ $rc -eq 0 ] || { say "bed: FAILED rc=$rc"; tail -20 "$OUT/gen.log" >>"$SUMMARY"; exit 1; }

RUNS=$WORK/runs
mkdir -p "$RUNS"
base_args() {  # base_args OUTDIR PROMPTS AE
  echo --pretrained_model_name_or_path "$BED/flux1-dev.safetensors" --clip_l "$BED/clip_l.safetensors" \
    --t5xxl "$BED/t5xxl.safetensors" --ae "$3" --tokenizer_cache_dir "$BED/tokenizers" \
    --dataset_config "$BED/data/dataset.toml" --output_dir "$1" --output_name flux --save_model_as safetensors \
    --network_module networks.lora_flux --network_dim 4 --network_alpha 1 --network_train_unet_only \
    --optimizer_type AdamW --learning_rate 1e-4 --lr_scheduler constant \
    --max_train_steps 8 --save_every_n_steps 2 --save_state --sample_prompts "$2" --sample_every_n_steps 4 \
    --mixed_precision bf16 --save_precision bf16 --gradient_checkpointing \
    --timestep_sampling shift --discrete_flow_shift 3.1582 --model_prediction_type raw --guidance_scale 1.0 \
    --max_data_loader_n_workers 0 --seed 42 ${T5LEN:+--t5xxl_max_token_length $T5LEN} ${FLUX_EXTRA:-}
}
NEW_PROMPT="a blue circle on a white field --w $RES --h $RES --s 2 --d 7"
edit_after_state() {  # edit_after_state OUTDIR PROMPTS: append a prompt once the step-2 state is complete
  local n=0
  while [ $n -lt 6000 ]; do
    if ls "$1"/*step00000002-state/random_states_0.pkl >/dev/null 2>&1; then
      echo "$NEW_PROMPT" >>"$2"
      say "  edit: appended a new prompt to $2 (step-2 state complete)"
      return 0
    fi
    sleep 0.1; n=$((n + 1))
  done
}
stage() {  # stage NAME MAX_S POLICY -- ARGS...
  local name=$1 max=$2 policy=$3; shift 4
  local t=$(left)
  [ "$t" -lt 60 ] && { say "stage $name: SKIPPED, ${t}s of the budget left"; return 1; }
  [ "$t" -lt "$max" ] && max=$t
  say "stage $name: trainsup run (timeout ${max}s)"
  local s0=$(date +%s)
  (cd "$REPO/.gpu/sd-scripts" && timeout -k 15 "$max" "$TS" run ${policy:+--policy "$policy"} -- "$@") \
    >"$OUT/$name.log" 2>&1
  local rc=$?
  say "stage $name: exit $rc after $(($(date +%s) - s0))s"
  grep -a -E '^trainsup|trainsup:|Error|error:|Cannot copy|NoneType|not enough values|safetensors>=|meta tensor|Loaded (Flux|AE)|steps: +100%|model saved' \
    "$OUT/$name.log" | grep -av 'Traceback' | tail -25 | sed 's/^/    /' >>"$SUMMARY"
  return 0
}
listing() {  # what each run left: files with sizes, the journal's kinds
  local d=$1
  find "$d" -maxdepth 1 | sort | sed "s|$d|    |" >>"$SUMMARY"
  [ -f "$d/.trainsup/events.jsonl" ] && "$PY" - "$d/.trainsup/events.jsonl" >>"$SUMMARY" <<'EOF'
import json, sys
quiet = {"save_hidden", "sample_hidden"}
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("event") not in quiet:
        print("    event:", json.dumps({k: v for k, v in e.items() if k not in ("ts", "argv")})[:400])
EOF
}

for S in $STAGES; do
  case $S in
  B)
    [ -z "$TV041" ] && { say "stage B: no 0.4.1 interpreter"; continue; }
    d=$RUNS/B; rm -rf "$d"; mkdir -p "$d"; cp "$BED/data/prompts.txt" "$d/prompts.txt"
    # no registry on the machine: pip fails at once instead of retrying for minutes
    PIP_NO_INDEX=1 stage B 150 "" -- "$TV041" flux_train_network.py $(base_args "$d" "$d/prompts.txt" "$BED/ae.safetensors") \
      $FP8 --cache_text_encoder_outputs --cache_latents
    listing "$d"
    ;;
  A | D)
    d=$RUNS/$S; rm -rf "$d"; mkdir -p "$d"; cp "$BED/data/prompts.txt" "$d/prompts.txt"
    pol=""
    if [ "$S" = D ]; then pol=$d/policy.yaml; printf 'live:\n  snapshot_prompts: false\n  on_prompt_change: ignore\n' >"$pol"; fi
    edit_after_state "$d" "$d/prompts.txt" &
    ew=$!
    stage "$S" 300 "$pol" -- "$TV" flux_train_network.py $(base_args "$d" "$d/prompts.txt" "$BED/ae.safetensors") \
      $FP8 --cache_text_encoder_outputs --cache_latents
    kill $ew 2>/dev/null; wait $ew 2>/dev/null
    listing "$d"
    ls "$d/sample" 2>/dev/null | sed 's/^/    sample: /' >>"$SUMMARY"
    ;;
  C)
    d=$RUNS/C; rm -rf "$d"; mkdir -p "$d"; cp "$BED/data/prompts.txt" "$d/prompts.txt"
    stage C 200 "" -- "$TV" flux_train_network.py $(base_args "$d" "$d/prompts.txt" "$BED/ae_missing_key.safetensors") \
      --cache_latents
    listing "$d"
    ;;
  esac
done

# everything small the runs wrote (logs, journals, attempt logs, prompt copies), no weights over 1 MB
(cd "$WORK" && find runs -type f -size -1024k -print0 | tar --null -czf "$OUT/runs.tar.gz" -T -) 2>/dev/null
say "done; $(du -sh "$OUT/runs.tar.gz" 2>/dev/null | cut -f1) of run files in runs.tar.gz"
