#!/bin/bash
# `servefleet up` with engine: vllm on one H200 — two replicas sharing the GPU (0.45 of its memory
# each) behind the gateway — then `servefleet bench` through the gateway, `status` and `down` from
# other processes. On the GPU machine, from the repo root:
#   bash benchmarks/real_gpu/run_fleet.sh            (needs the payload in .gpu)
#   SRC=.gpu/head/src: run a clean `git archive HEAD src` instead of the working tree
#   ENGINE=sim bash benchmarks/real_gpu/run_fleet.sh (rehearsal on any machine: sim-server replicas)
# The payload is the trimmed vLLM 0.26 of benchmarks/real_vllm/README.md (vllm.tar.xz,
# deps.tar.xz, tok.tar.xz). Everything lands under $OUT (at most 8 files).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0   # flashinfer is not in the payload
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
ENGINE=${ENGINE:-vllm}; P=${PAYLOAD:-$PWD/.gpu}; OUT=${OUT:-/tmp/fleet-out}
CONC=${CONC:-8,32,96}; DURATION=${DURATION:-40}; BUDGET=${BUDGET:-560}
REPLICAS=${REPLICAS:-2}   # 2: two replicas share GPU 0 (0.45 of its memory each); 1: one at 0.9
W=/tmp/fleetrun; SITE=/tmp/site; rm -rf $W; mkdir -p $W $OUT $SITE
T0=$(date +%s); el(){ echo $(( $(date +%s) - T0 )); }
log(){ echo "[$(el)s] $*" | tee -a $W/driver.log; }
PY=${PY:-python3}
unx(){ if command -v xz >/dev/null; then ( cd $2 && xz -T0 -dc $1 | tar -xf - )
       else $PY -c "import sys,tarfile;tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $1 $2; fi; }
if [ "$ENGINE" = vllm ]; then
  { nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; } > $W/env.txt 2>&1
  [ -f $SITE/.ok ] || { unx $P/vllm.tar.xz $SITE && unx $P/deps.tar.xz $SITE && touch $SITE/.ok; } >> $W/driver.log 2>&1
  mkdir -p /root/tok && unx $P/tok.tar.xz /root/tok
  export PYTHONPATH=${SRC:-$PWD/src}:$SITE
  MODEL_PATH=/root/tok/tok; TOKENIZER="--tokenizer /root/tok/tok"; GPU=H200-SXM
  EXTRA='["--load-format", "dummy"]'
else
  export PYTHONPATH=${SRC:-$PWD/src}; MODEL_PATH=Qwen/Qwen2.5-7B-Instruct; TOKENIZER=""; GPU=H200-SXM; EXTRA='[]'
fi
$PY -c "import servefleet, sys; print('servefleet from', servefleet.__file__, sys.version)" >> $W/env.txt 2>&1
[ "$ENGINE" = vllm ] && $PY -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >> $W/env.txt 2>&1
log "unpacked; $(tail -1 $W/env.txt)"
cat > $W/fleet.yaml <<YAML
version: 1
model: {name: Qwen2.5-7B, path: $MODEL_PATH}
engine: $ENGINE
gpus: {type: $GPU, count: 1}
vllm:
  dtype: auto
  max_model_len: 8192
  max_num_seqs: 1024
  max_num_batched_tokens: 8192
  gpu_memory_utilization: $( [ "$REPLICAS" = 1 ] && echo 0.9 || echo 0.45 )
  enable_prefix_caching: true
  extra_args: $EXTRA
replicas:
  - {name: replica-0, tp: 1, gpu_ids: [0], port: 8001}
YAML
[ "$REPLICAS" = 1 ] || echo "  - {name: replica-1, tp: 1, gpu_ids: [0], port: 8002}" >> $W/fleet.yaml
echo "gateway: {host: 127.0.0.1, port: 8000, policy: least-outstanding}" >> $W/fleet.yaml
cp $W/fleet.yaml $OUT/
S="--state-dir $W/state"
$PY -m servefleet up $W/fleet.yaml $S --ready-timeout 400 > $W/up.log 2>&1 & UP=$!
until curl -sf 127.0.0.1:8000/ready >/dev/null 2>&1; do
  if ! kill -0 $UP 2>/dev/null; then log "servefleet up EXITED"; tail -40 $W/up.log; break; fi
  if [ $(el) -gt 420 ]; then log "fleet not ready by 420 s"; break; fi
  sleep 1
done
log "gateway /ready answered (up pid $UP)"
if curl -sf 127.0.0.1:8000/ready >/dev/null 2>&1; then
  $PY -m servefleet status $S > $W/status.txt 2>&1; cat $W/status.txt
  curl -s 127.0.0.1:8000/fleet > $W/fleet.json; curl -s 127.0.0.1:8000/v1/models > $W/models.json
  LEFT=$(( T0 + BUDGET - $(date +%s) - 60 ))
  log "bench: concurrency $CONC, $DURATION s each, $LEFT s left"
  timeout $LEFT $PY -m servefleet bench --url http://127.0.0.1:8000 --model Qwen2.5-7B \
    --workload chat-3tier --concurrency $CONC --duration $DURATION --drain-timeout 60 \
    $TOKENIZER --no-progress --out $W/bench > $W/bench.log 2>&1
  log "bench rc=$?"; tail -30 $W/bench.log
  if [ -n "${BENCH2_ARGS:-}" ]; then   # a second pass on the same fleet, e.g. --no-continuous-usage
    LEFT=$(( T0 + BUDGET - $(date +%s) - 40 ))
    log "bench 2 ($BENCH2_ARGS): $LEFT s left"
    timeout $LEFT $PY -m servefleet bench --url http://127.0.0.1:8000 --model Qwen2.5-7B \
      --workload chat-3tier --concurrency $CONC --duration $DURATION --drain-timeout 60 \
      $TOKENIZER --no-progress --out $W/bench2 $BENCH2_ARGS > $W/bench2.log 2>&1
    log "bench 2 rc=$?"; tail -12 $W/bench2.log
  fi
  for p in 8001 8002; do curl -s 127.0.0.1:$p/metrics > $W/metrics-$p.txt; done
  curl -s 127.0.0.1:8000/metrics > $W/metrics-gateway.txt
fi
$PY -m servefleet down $S --timeout 60 >> $W/driver.log 2>&1; log "down rc=$?"
wait $UP; log "up exited rc=$?"
[ "$ENGINE" = vllm ] && nvidia-smi --query-gpu=memory.used --format=csv,noheader >> $W/env.txt 2>&1
tar -czf $OUT/bench.tar.gz -C $W bench $( [ -d $W/bench2 ] && echo bench2 ) 2>/dev/null
tar -czf $OUT/logs.tar.gz -C $W state/logs up.log bench.log $( [ -f $W/bench2.log ] && echo bench2.log ) status.txt fleet.json models.json \
  metrics-8001.txt metrics-8002.txt metrics-gateway.txt 2>/dev/null
cp $W/driver.log $W/env.txt $OUT/
log "done"; ls -la $OUT
