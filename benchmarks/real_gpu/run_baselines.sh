#!/bin/bash
# Engine baselines on one H200, in one run: `servefleet up` of a one-replica
# vLLM 0.26 fleet (its GPU telemetry on :9400), `servefleet bench` through the gateway with points
# that preempt (a KV cache cut to BLOCKS blocks), then `transformers serve` of the very same
# random-weight model (Qwen2.5-0.5B's shape) benched with the same workload, its GPUs served by
# `python -m servefleet.telemetry`. On the GPU machine, from the checkout's root:
#   bash benchmarks/real_gpu/run_baselines.sh     (the payload in .gpu; SRC=dir of servefleet's
#   package, or SRC_TAR=src.tar.xz of it, when it is not the checkout's src/)
#   ENGINE=sim bash benchmarks/real_gpu/run_baselines.sh   (rehearsal on any machine: sim-servers)
# Everything lands under $OUT (at most 8 files).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0   # flashinfer is not in the payload
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
ENGINE=${ENGINE:-vllm}; P=${PAYLOAD:-$PWD/.gpu}; OUT=${OUT:-/tmp/base-out}
HERE=$(cd "$(dirname "$0")" && pwd)
BUDGET=${BUDGET:-400}; DUR=${DUR:-15}; IN=${IN:-512}; OUTLEN=${OUTLEN:-128}; BLOCKS=${BLOCKS:-1024}
VLLM_CONC=${VLLM_CONC:-1,8,32,64}; TF_CONC=${TF_CONC-1,8}   # empty: skip transformers serve
GW=${GW:-8000}; REP=${REP:-8001}; TFP=${TFP:-8100}; TEL=${TEL:-9401}   # ports (up's telemetry: 9400)
W=/tmp/baserun; SITE=/tmp/site; rm -rf $W; mkdir -p $W $OUT $SITE
T0=$(date +%s); el(){ echo $(( $(date +%s) - T0 )); }; left(){ echo $(( T0 + BUDGET - $(date +%s) )); }
tmo(){ local t=$(( $(left) - $1 )); [ $t -lt 20 ] && t=20; echo $t; }   # seconds for a stage
log(){ echo "[$(el)s] $*" | tee -a $W/driver.log; }
PY=${PY:-python3}
unx(){ if command -v xz >/dev/null; then ( cd $2 && xz -T0 -dc $1 | tar -xf - )
       else $PY -c "import sys,tarfile;tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $1 $2; fi; }
wait_http(){  # URL PID DEADLINE_S: until URL answers, the process dies, or the deadline
  until curl -sf "$1" >/dev/null 2>&1; do
    kill -0 $2 2>/dev/null || { log "pid $2 exited before $1 answered"; return 1; }
    [ $(el) -gt $3 ] && { log "$1 not ready by $3 s"; return 1; }
    sleep 1
  done; return 0; }
if [ -n "${SRC_TAR:-}" ]; then   # servefleet's src/ packed small, shipped with the payload
  mkdir -p /tmp/sfsrc && unx $SRC_TAR /tmp/sfsrc && SRC=/tmp/sfsrc
fi
mkdir -p /root/tok && unx $P/tok.tar.xz /root/tok
M=$W/model
if [ "$ENGINE" = vllm ]; then
  { nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv; nproc; } > $W/env.txt 2>&1
  [ -f $SITE/.ok ] || { unx $P/vllm.tar.xz $SITE && unx $P/deps.tar.xz $SITE && touch $SITE/.ok; } >> $W/driver.log 2>&1
  export PYTHONPATH=${SRC:-$PWD/src}:$SITE
  $PY $HERE/make_small_model.py /root/tok/tok $M >> $W/driver.log 2>&1
else
  export PYTHONPATH=${SRC:-$PWD/src}
  $PY $HERE/make_small_model.py /root/tok/tok $M --config-only >> $W/driver.log 2>&1
fi
$PY -c "import servefleet, sys; print('servefleet from', servefleet.__file__, sys.version)" >> $W/env.txt 2>&1
[ "$ENGINE" = vllm ] && $PY -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" >> $W/env.txt 2>&1
log "unpacked, model in $M; $(tail -1 $W/env.txt)"
cat > $W/fleet.yaml <<YAML
version: 1
model: {name: $M, path: $M}
engine: $ENGINE
gpus: {type: H200-SXM, count: 1}
vllm:
  dtype: auto
  max_model_len: 4096
  max_num_seqs: 256
  max_num_batched_tokens: 4096
  gpu_memory_utilization: 0.9
  enable_prefix_caching: true
  enforce_eager: true
  extra_args: ["--num-gpu-blocks-override", "$BLOCKS"]
replicas:
  - {name: replica-0, tp: 1, gpu_ids: [0], port: $REP}
gateway: {host: 127.0.0.1, port: $GW, policy: least-outstanding}
YAML
cp $W/fleet.yaml $OUT/
BENCH="$PY -m servefleet bench --model $M --input-len $IN --output-len $OUTLEN --duration $DUR --warmup 2 --drain-timeout 30 --tokenizer $M/tokenizer.json --no-progress"
# -- 1. vLLM through `servefleet up` -----------------------------------------------------------
S="--state-dir $W/state"
$PY -m servefleet up $W/fleet.yaml $S --ready-timeout 300 $( [ "$ENGINE" = sim ] && echo --startup-time 1 ) > $W/up.log 2>&1 & UP=$!
if wait_http 127.0.0.1:$GW/ready $UP 240; then
  log "fleet ready"; curl -s 127.0.0.1:$REP/metrics > $W/vllm-metrics-before.txt
  curl -s 127.0.0.1:9400/metrics > $W/gpu-metrics-sample.txt
  timeout $(tmo 150) $BENCH --url http://127.0.0.1:$GW --concurrency $VLLM_CONC \
    --out $W/bench-vllm > $W/bench-vllm.log 2>&1
  log "bench vllm rc=$?"; tail -25 $W/bench-vllm.log
  curl -s 127.0.0.1:$REP/metrics > $W/vllm-metrics-after.txt
fi
$PY -m servefleet down $S --timeout 30 >> $W/driver.log 2>&1; log "down rc=$?"
wait $UP; log "up exited rc=$?"
# -- 2. transformers serve, the same model and workload ------------------------------------------
if [ -n "$TF_CONC" ] && [ $(left) -gt 100 ]; then
  if [ "$ENGINE" = vllm ]; then
    $PY -c 'import sys; from transformers.cli.transformers import app; sys.argv[0] = "transformers"; app()' \
      serve $M --host 127.0.0.1 --port $TFP > $W/transformers.log 2>&1 & TF=$!
    $PY -m servefleet.telemetry --port $TEL > $W/telemetry.log 2>&1 & TELPID=$!
  else
    $PY -m servefleet.sim.server --model $M --served-model-name $M --gpu H200-SXM --port $TFP \
      --startup-time 0 > $W/transformers.log 2>&1 & TF=$!
    TELPID=""
  fi
  if wait_http 127.0.0.1:$TFP/health $TF $(( BUDGET - 90 )); then
    log "transformers serve ready"
    timeout $(tmo 20) $BENCH --url http://127.0.0.1:$TFP --concurrency $TF_CONC \
      --no-ignore-eos --no-continuous-usage --gpu-metrics http://127.0.0.1:$TEL/metrics \
      --out $W/bench-transformers > $W/bench-transformers.log 2>&1
    log "bench transformers rc=$?"; tail -20 $W/bench-transformers.log
  fi
  kill $TF $TELPID 2>/dev/null; wait $TF 2>/dev/null
else
  log "skipped transformers serve: $(left) s left"
fi
[ "$ENGINE" = vllm ] && nvidia-smi --query-gpu=memory.used --format=csv,noheader >> $W/env.txt 2>&1
tar -czf $OUT/bench.tar.gz -C $W $(cd $W && ls -d bench-vllm bench-transformers 2>/dev/null)
tar -czf $OUT/logs.tar.gz -C $W $(cd $W && ls -d state/logs up.log bench-*.log transformers.log telemetry.log \
  vllm-metrics-*.txt gpu-metrics-sample.txt model/config.json 2>/dev/null)
cp $W/driver.log $W/env.txt $OUT/
log "done"; ls -la $OUT
