#!/usr/bin/env bash
# The function-calling run, start to end, in one device call: the speedrun with --funcall-data
# pretrains a base, chat-SFTs it, SFTs it on the train split of a conversations file with tools and
# evaluates it on the held-out split (codechat.data.benchmarks.conversation_split: a stated hash;
# 238 / 62 of the glaive sample's 300 conversations). The figures are in OUT/report.md
# ("Function calling") and OUT/eval/funcall/results.json.
#
#   bash benchmarks/funcall_gpu.sh DATA.json [PRESET=d20] [MINUTES=8] [OUT=runs/funcall]
#
# On the GPU machine: DATA must travel with the checkout (copy ../shared/data/function_calling_glaive/
# into a git-ignored folder named in `carry`), and jsonschema's wheels too (.whl; the device tool's
# README); CODECHAT_NO_INSTALL=1 runs from the checkout with that Python's packages.
set -euo pipefail
DATA=${1:?usage: bash benchmarks/funcall_gpu.sh DATA.json [PRESET] [MINUTES] [OUT]}
export CODECHAT_NO_INSTALL=${CODECHAT_NO_INSTALL:-1}
bash scripts/speedrun.sh --preset "${2:-d20}" --time-budget-min "${3:-8}" --out "${4:-runs/funcall}" --funcall-data "$DATA"
