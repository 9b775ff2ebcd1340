#!/bin/bash
# Real vLLM 0.26 grid on one H200.  From the repo root on the GPU machine:
#   bash benchmarks/real_vllm/run_grid.sh
# Needs the trimmed payload (vllm.tar.xz, deps.tar.xz, tok.tar.xz, make_weights.py) in $PAYLOAD (.gpu),
# built as benchmarks/real_vllm/README.md says ("Reproduce").
# Starts ONE server (CUDA-graph mode, default flags except --max-model-len 8192; dummy weights),
# keeps its whole log, waits on /health, runs bench_grid.py (all points in one process), stops the
# server, and packs everything into at most 6 files under $OUT.
# GRID_ARGS passes options to bench_grid.py, e.g. the follow-up run:
#   BUDGET=400 GRID_ARGS="--points extra,overload --overload-in 6144 --overload-out 1024 --overload-demand 1.2
#     --overload-cap-s 220 --seed-offset 100" bash benchmarks/real_vllm/run_grid.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0   # flashinfer is not in the payload; else the sampler imports it and dies
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
HERE=$(cd "$(dirname "$0")" && pwd)
P=${PAYLOAD:-$PWD/.gpu}; OUT=${OUT:-/tmp/out}; BUDGET=${BUDGET:-540}; PORT=8000; NAME=rand7b
W=/tmp/grid; RAW=$W/raw; SITE=/tmp/site; mkdir -p $RAW $OUT $SITE
T0=$(date +%s); el(){ echo $(( $(date +%s) - T0 )); }
log(){ echo "[$(el)s] $*" | tee -a $W/driver.log; }
SERVE_FLAGS="--port $PORT --served-model-name $NAME --max-model-len 8192"
log "start budget=${BUDGET}s payload=$P"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,power.limit --format=csv; uname -r; nproc; free -g | head -2; } > $W/env.txt 2>&1
unx(){ # archive dest  (xz may be missing on the image: fall back to python's tarfile)
  if command -v xz >/dev/null; then ( cd $2 && xz -T0 -dc $1 | tar -xf - )
  else python3 -c "import sys,tarfile;tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $1 $2; fi; }
# 1. unpack vLLM + deps (skip if an earlier call on this warm machine did) and the tokenizer/config
if [ ! -f $SITE/.ok ]; then
  { unx $P/vllm.tar.xz $SITE && unx $P/deps.tar.xz $SITE && touch $SITE/.ok; } >> $W/driver.log 2>&1 || log "UNPACK FAILED"
fi
export PYTHONPATH=$SITE
mkdir -p /root/tok && unx $P/tok.tar.xz /root/tok; TOK=/root/tok/tok
python3 -c "import vllm,torch;print('vllm',vllm.__version__,'torch',torch.__version__,'cuda',torch.version.cuda)" >> $W/env.txt 2>&1
log "unpacked: $(tail -1 $W/env.txt)"
serve(){ # $1 model dir, rest: extra flags
  local m=$1; shift
  echo "CMD: python3 -m vllm.entrypoints.cli.main serve $m $SERVE_FLAGS $*" >> $W/server.log
  python3 -m vllm.entrypoints.cli.main serve $m $SERVE_FLAGS "$@" >> $W/server.log 2>&1 & SPID=$!
  local ts=$(date +%s)
  until curl -sf localhost:$PORT/health >/dev/null 2>&1; do
    sleep 1
    if ! kill -0 $SPID 2>/dev/null; then log "server DIED after $(( $(date +%s) - ts ))s"; tail -30 $W/server.log >> $W/driver.log; return 1; fi
    if [ $(el) -gt 330 ]; then log "server not healthy by 330s"; return 1; fi
  done
  log "HEALTHY after $(( $(date +%s) - ts ))s: $m $*"; return 0
}
MODEL=$TOK
if ! serve $TOK --load-format dummy; then
  kill -9 $SPID 2>/dev/null; sleep 2
  log "dummy load failed -> fallback: random weights with make_weights.py"
  python3 $P/make_weights.py $TOK /root/rand7b >> $W/driver.log 2>&1 && MODEL=/root/rand7b && serve /root/rand7b || { log "fallback failed"; }
fi
if curl -sf localhost:$PORT/health >/dev/null 2>&1; then
  curl -s localhost:$PORT/v1/models > $W/models.json
  curl -s localhost:$PORT/version > $W/version.json
  NOW=$(date +%s)
  python3 $HERE/bench_grid.py --base http://127.0.0.1:$PORT --model $NAME --tokenizer $MODEL --raw $RAW --out $W \
    --server-log $W/server.log --deadline $(( T0 + BUDGET - 200 )) --hard-end $(( T0 + BUDGET - 25 )) ${GRID_ARGS:-} 2>&1 | tee -a $W/driver.log
  log "grid rc=${PIPESTATUS[0]}"
  curl -s localhost:$PORT/metrics > $RAW/metrics_final.txt
  kill $SPID; for i in $(seq 20); do kill -0 $SPID 2>/dev/null || break; sleep 1; done; kill -9 $SPID 2>/dev/null
  log "server stopped"
fi
nvidia-smi --query-gpu=memory.used --format=csv,noheader >> $W/env.txt 2>&1
tar -czf $OUT/grid_raw.tar.gz -C $W raw models.json version.json 2>/dev/null
cp $W/server.log $W/driver.log $W/env.txt $OUT/ 2>/dev/null
[ -f $W/grid_summary.json ] && cp $W/grid_summary.json $OUT/
ls -la $OUT | tee -a $W/driver.log
log "done"
