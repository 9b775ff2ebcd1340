#!/bin/bash
# On the GPU machine, from the repo root:  bash benchmarks/calibration/run_microbench.sh
# Unpacks the vLLM payload (.gpu, for the FA3 section) in the background while the GEMM sweep
# runs, then runs h200_microbench.py; everything lands in $OUT.
set -o pipefail
P=${PAYLOAD:-$PWD/.gpu}; OUT=${OUT:-/tmp/out}; SITE=/tmp/site; mkdir -p $OUT $SITE
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
unx(){ if command -v xz >/dev/null; then ( cd $2 && xz -T0 -dc $1 | tar -xf - )
  else python3 -c "import sys,tarfile;tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $1 $2; fi; }
if [ -f $P/vllm.tar.xz ] && [ ! -f $SITE/.ok ]; then
  ( unx $P/vllm.tar.xz $SITE && unx $P/deps.tar.xz $SITE && touch $SITE/.ok ) > $OUT/unpack.log 2>&1 &
fi
cd benchmarks/calibration && python3 h200_microbench.py --out $OUT --site $SITE --budget ${BUDGET:-300} "$@" 2>&1 | tee $OUT/log.txt
