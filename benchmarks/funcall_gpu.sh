#!/usr/bin/env bash
# The function-calling run, start to end, in one device call: a base pretrained and chat-SFT'd by
# the speedrun, function-calling SFT on the train split of a conversations file with tools, and the
# evaluation on its held-out split (codechat.data.benchmarks.conversation_split: a stated hash;
# 238 / 62 of the glaive sample's 300 conversations). Prints the function-calling figures last.
#
#   bash benchmarks/funcall_gpu.sh DATA.json [PRESET=d20] [SPEEDRUN_MINUTES=5] [OUT=runs/funcall] [EPOCHS=3]
#
# On the GPU machine: DATA must travel with the checkout (copy ../shared/data/function_calling_glaive/
# into a git-ignored folder named in `carry`), and jsonschema's wheels too (.whl; README of the
# device tool); CODECHAT_NO_INSTALL=1 runs from the checkout with that Python's packages.
set -euo pipefail
DATA=${1:?usage: bash benchmarks/funcall_gpu.sh DATA.json [PRESET] [MINUTES] [OUT] [EPOCHS]}
PRESET=${2:-d20}
MINUTES=${3:-5}
OUT=${4:-runs/funcall}
EPOCHS=${5:-3}
PY=${PYTHON:-python3}
export CODECHAT_NO_INSTALL=${CODECHAT_NO_INSTALL:-1} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
bash scripts/speedrun.sh --preset "$PRESET" --time-budget-min "$MINUTES" --out "$OUT"
"$PY" -m codechat sft --init "$OUT/sft" --data "$DATA@train" --epochs "$EPOCHS" --out "$OUT/funcall"
"$PY" -m codechat eval run --model "$OUT/funcall" --suite "funcall:$DATA" --split heldout --out "$OUT/eval/funcall"
