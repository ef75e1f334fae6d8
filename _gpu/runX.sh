#!/usr/bin/env bash
# Triton backward launch: tiles of 8192 elements, 2 programs an SM at every register-path width; against HEAD and pre-simplify; then the Triton GPU suite.
set -u
cd "$(dirname "$0")"; ROOT=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=$ROOT/triton/src:$ROOT/curt/src:$ROOT/oldt/src
cd triton
B="python3 benchmarks/bench_rms_norm.py --cuda-graphs --runs 1 --also curt_ops,oldt_ops --impls my_torch_ops,curt_ops,oldt_ops"
t0=$SECONDS; timeout 200 $B --op rms_norm --json $OUT/rms.json > $OUT/rms.txt 2>/dev/null; echo "rms rc=$? $((SECONDS-t0)) s"
t0=$SECONDS; timeout 120 $B --op rms_norm --dtype fp16 --shapes 8192x2048,32768x2048,8192x4096,32768x4096 > $OUT/fp16.txt 2>/dev/null; echo "fp16 rc=$? $((SECONDS-t0)) s"
export PYTHONPATH=$ROOT/triton/src
t0=$SECONDS; timeout 330 python3 -m pytest -q -n 12 -p no:cacheprovider tests > $OUT/suite.log 2>&1; echo "suite rc=$? $((SECONDS-t0)) s"; tail -3 $OUT/suite.log
cut -c1-140 $OUT/rms.txt $OUT/fp16.txt
