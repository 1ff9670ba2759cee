#!/usr/bin/env bash
# The checks of a session lent a GPU, in one command: tests/test_cuda.py, then the GPU
# benchmarks (bench/landscape.py on the GPU, its peer on the GPU, bench/weight.py at three real
# shapes), each under its own time limit so that one slow step cannot eat the lease (at most
# 590 s in all: a lease is 15 minutes, the machine's start included). Each
# step's log and the updated bench/RESULTS.md land in $OUT (else ./gpu-out); copy the GPU
# sections from there into bench/RESULTS.md.
#
#     bash bench/gpu.sh            # with the project's environment on PYTHONPATH or installed
#
# PYTHON names the interpreter (default python3); the repository root goes on PYTHONPATH so a
# machine with torch and transformers but no install of rotviz runs it as it stands.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
nvidia-smi -L
"$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name(0))"

step() {
  local name=$1 limit=$2 start rc
  shift 2
  echo "== $name (at most $limit s)"
  start=$(date +%s)
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  echo "== $name: exit $rc after $(($(date +%s) - start)) s"
  tail -n 25 "$out/$name.log"
}

step cuda-tests "${CUDA_TESTS_S:-90}" "$py" -m pytest -q -p no:cacheprovider -n 0 \
  tests/test_cuda.py
step landscape "${LANDSCAPE_S:-70}" "$py" bench/landscape.py --device cuda --threads 16 \
  --roberta no
step peer "${PEER_S:-70}" "$py" bench/landscape.py --only peer --device cuda --threads 16
step weight "${WEIGHT_S:-240}" "$py" bench/weight.py --device cuda \
  --sizes pythia-160m,qwen2-0.5b --caps '' --budget 90
step weight-llama "${WEIGHT_LLAMA_S:-120}" "$py" bench/weight.py --device cuda \
  --sizes llama-1b --layers llama-1b=4 --caps '' --budget 90
cp bench/RESULTS.md "$out/RESULTS.md"
