#!/usr/bin/env bash
# Issue 17, item 5: the GPU path measured in one prepared run, on a machine whose image has
# torch with CUDA but reaches no package index (the device machines lent to some sessions).
#
# Here, first: `make corpus gpu-bundle` (the corpus in data/bible_es_en, the other wheels in
# .gpu/whl). Then on the GPU machine, from the repository root, carrying .gpu and
# data/bible_es_en (about 20 MB with the working tree):
#     bash scripts/gpu_check.sh            # results in $OUT (or runs/gpu_check)
# It takes at most 8.5 minutes: the stages have their own time limits (below), so one that
# hangs cannot eat the others' time, and each writes its log and JSON as it ends.
#   1. ours and JoeyNMT 2.3.0 at the benchmark's configuration (GRU 256, bidirectional
#      encoder, 8k+8k SentencePiece, 3,000 target tokens per batch): training target tok/s
#      after a warm-up, greedy and beam-5 sentences/s; ours with train.precision=auto (bf16
#      autocast where its probe finds it faster), JoeyNMT in fp32 (its only mixed precision
#      is fp16); cuDNN's RNNs wherever a whole sequence runs in one call.
#   2. the paper profile (configs/profile/paper.yaml: 620/1000, deep output with maxout,
#      8,000 target tokens per batch), our none and bahdanau arms: training tok/s per arm.
# Dry run on a CPU (no GPU, no wheels): DEVICE=cpu QUICK=1 PY=.venv/bin/python bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if [ -d .gpu/whl ] && [ "${PY}" = python3 ]; then
  # --no-deps: the image's own numpy, pyarrow, torch, ... stay; only what it lacks is added
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpu/whl/*.whl || { echo "installing .gpu/whl failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
  export SEQ2SEQ_JOEY_PYTHON=$(command -v "$PY")  # JoeyNMT from /tmp/site, not .venv-joey
else
  export PYTHONPATH=$PWD
fi
[ -d data/bible_es_en ] || { echo "data/bible_es_en is missing: run make corpus and carry it"; exit 1; }

{ command -v nvidia-smi >/dev/null && nvidia-smi -L; lscpu | grep -E "Model name|^CPU\(s\)"
  "$PY" - <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
for name in ("numpy", "pyarrow", "datasets", "hydra", "omegaconf", "sentencepiece", "sacrebleu",
             "joeynmt", "subword_nmt"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as err:  # report every missing piece at once, then go on
        print(name, "FAILED:", err)
EOF
} 2>&1 | tee "$OUT/environment.txt"

if [ "${QUICK:-0}" = 1 ]; then
  SIZES=(--warmup 2 --repeats 2 --per-repeat 2 --decode-sentences 8 --matmul-size 512)
  PAPER=(--warmup 1 --repeats 1 --per-repeat 1 --decode-sentences 4 --matmul-size 512)
else
  SIZES=(--warmup 50 --repeats 3 --per-repeat 20 --decode-sentences 300 --matmul-size 8192)
  PAPER=(--warmup 20 --repeats 3 --per-repeat 10 --decode-sentences 100 --matmul-size 8192)
fi

stage() {  # stage NAME SECONDS ARGS...: one benchmark run, its log and JSON in $OUT
  local name=$1 limit=$2; shift 2
  echo "== $name (at most ${limit} s)"
  timeout "$limit" "$PY" scripts/benchmark.py --device "$DEVICE" --work "/tmp/gpu_check_$name" \
    --json "$OUT/$name.json" "$@" 2>&1 | tee "$OUT/$name.log"
  echo "== $name: exit ${PIPESTATUS[0]}"
}

stage bench 300 --arms none,bahdanau,luong --joey-arms bahdanau,luong --precision auto "${SIZES[@]}"
for arm in none bahdanau; do  # one run per arm, so a time-out keeps the arm before it
  stage "paper_$arm" 100 --no-joey --arms "$arm" --model-profile paper --precision auto "${PAPER[@]}"
done
ls -l "$OUT"
