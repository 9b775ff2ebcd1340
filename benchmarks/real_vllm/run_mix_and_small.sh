#!/bin/bash
# Two validation runs on one H200 (vLLM 0.26, random weights via --load-format dummy).
#   MODE=mix   bash benchmarks/real_vllm/run_mix_and_small.sh   Qwen1.5-14B shape: session probes, then
#              `servefleet bench --workload enterprise-mix` at RATES (open loop, no warm-up cut)
#   MODE=small bash benchmarks/real_vllm/run_mix_and_small.sh   Qwen2.5-1.5B shape, bf16 then fp8
#              (--quantization fp8 --kv-cache-dtype fp8): closed-loop points of bench_grid.py
#   ENGINE=sim ... rehearses either without a GPU (servefleet sim-server instead of vLLM).
# Payload (.gpu: vllm.tar.xz, deps.tar.xz, tok.tar.xz) as benchmarks/real_vllm/README.md says;
# SRC = the servefleet sources to run (default ./src; SRC_TAR: a .tar.xz of src/ instead). Results: at most 8 files under $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0
export COLUMNS=200 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
HERE=$(cd "$(dirname "$0")" && pwd)
MODE=${MODE:-mix}; ENGINE=${ENGINE:-vllm}; P=${PAYLOAD:-$PWD/.gpu}; OUT=${OUT:-/tmp/mix-small-out}
BUDGET=${BUDGET:-540}; RATES=${RATES:-3,6}; DURATIONS=${DURATIONS:-80,90}; PORT=8000
SRC=${SRC:-$PWD/src}
if [ -n "${SRC_TAR:-}" ]; then  # the sources packed small (to ship them with the payload)
  rm -rf /tmp/mix-small-src && mkdir -p /tmp/mix-small-src
  python3 -c "import sys,tarfile;tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $SRC_TAR /tmp/mix-small-src
  SRC=/tmp/mix-small-src/src
fi
PRESETS=$SRC/servefleet/data/models
W=/tmp/mix-small-run; SITE=/tmp/site; TOKROOT=${TOKROOT:-/root/tok}
rm -rf $W; mkdir -p $W/metrics $W/bench $OUT $SITE $TOKROOT
T0=$(date +%s); el(){ echo $(( $(date +%s) - T0 )); }; left(){ echo $(( T0 + BUDGET - $(date +%s) )); }
log(){ echo "[$(el)s] $*" | tee -a $W/driver.log; }
unx(){ if command -v xz >/dev/null; then ( cd $2 && xz -T0 -dc $1 | tar -xf - )
       else python3 -c "import sys,tarfile;tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $1 $2; fi; }
if [ "$ENGINE" = vllm ]; then
  { nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv; nproc; } > $W/env.txt 2>&1
  [ -f $SITE/.ok ] || { unx $P/vllm.tar.xz $SITE && unx $P/deps.tar.xz $SITE && touch $SITE/.ok; } >> $W/driver.log 2>&1
  export PYTHONPATH=$SRC:$SITE
  python3 -c "import vllm,torch;print('vllm',vllm.__version__,'torch',torch.__version__)" >> $W/env.txt 2>&1
else
  export PYTHONPATH=$SRC; echo "rehearsal: sim-server" > $W/env.txt
fi
[ -d $TOKROOT/tok ] || unx $P/tok.tar.xz $TOKROOT
log "unpacked ($(tail -1 $W/env.txt))"
PY=python3
SPID=
serve(){ # name shape-dir extra-flags... ; waits for /health
  local name=$1 dir=$2; shift 2
  if [ "$ENGINE" = vllm ]; then
    local cmd="$PY -m vllm.entrypoints.cli.main serve $dir --port $PORT --served-model-name $name --max-model-len 8192 --load-format dummy --enable-prompt-tokens-details $*"
  else
    local cmd="$PY -m servefleet sim-server --model $dir/config.json --gpu H200-SXM --port $PORT --served-model-name $name --max-model-len 8192 --enable-prompt-tokens-details --startup-time 1"
  fi
  echo "CMD: $cmd" >> $W/server-$name.log
  $cmd >> $W/server-$name.log 2>&1 & SPID=$!
  local ts=$(date +%s)
  until curl -sf localhost:$PORT/health >/dev/null 2>&1; do
    sleep 1
    if ! kill -0 $SPID 2>/dev/null; then log "server $name DIED after $(( $(date +%s) - ts ))s"; tail -25 $W/server-$name.log >> $W/driver.log; return 1; fi
    if [ $(left) -lt 60 ]; then log "server $name not healthy in time"; return 1; fi
  done
  log "HEALTHY $name after $(( $(date +%s) - ts ))s: $*"
}
stop(){ [ -n "$SPID" ] || return; kill $SPID 2>/dev/null; for i in $(seq 25); do kill -0 $SPID 2>/dev/null || break; sleep 1; done; kill -9 $SPID 2>/dev/null; SPID=; log "server stopped"; }
scrape(){ curl -s localhost:$PORT/metrics > $W/metrics/$1.txt; }

if [ "$MODE" = mix ]; then
  NAME=Qwen1.5-14B; DIR=$W/q14
  $PY $HERE/make_shape.py $PRESETS/Qwen1.5-14B.json $TOKROOT/tok $DIR >> $W/driver.log 2>&1
  if serve $NAME $DIR; then
    $PY $HERE/gauge_sampler.py http://127.0.0.1:$PORT $W/gauges.jsonl 0.5 & GPID=$!
    for mode in chat ids; do
      scrape probe-$mode-before
      timeout 60 $PY $HERE/session_probe.py --base http://127.0.0.1:$PORT --model $NAME --mode $mode --salt probe-$mode \
        --sessions 16 --turns 4 --out $W/probe-$mode.json >> $W/driver.log 2>&1; log "probe $mode rc=$?"
      scrape probe-$mode-after
    done
    IFS=, read -ra RS <<< "$RATES"; IFS=, read -ra DS <<< "$DURATIONS"
    for i in "${!RS[@]}"; do
      r=${RS[$i]}; d=${DS[$i]:-${DS[0]}}; L=$(( $(left) - 30 ))
      if [ $L -lt $(( d + 20 )) ]; then log "skip rate $r: $L s left"; continue; fi
      scrape rate$r-before; echo "{\"rate\": $r, \"start\": $(date +%s.%N)}" >> $W/points.jsonl
      timeout $L $PY -m servefleet bench --url http://127.0.0.1:$PORT --model $NAME --workload enterprise-mix \
        --rate $r --duration $d --warmup 0 --drain-timeout $(( L - d - 10 > 90 ? 90 : L - d - 10 )) \
        --tokenizer $DIR --no-progress --out $W/bench/rate$r > $W/bench-rate$r.log 2>&1
      log "bench rate $r rc=$?"; tail -8 $W/bench-rate$r.log | tee -a $W/driver.log
      echo "{\"rate\": $r, \"end\": $(date +%s.%N)}" >> $W/points.jsonl; scrape rate$r-after
    done
    kill $GPID 2>/dev/null
  fi
  stop
  tar -czf $OUT/bench.tar.gz -C $W bench points.jsonl $(cd $W && ls bench-rate*.log 2>/dev/null)
  tar -czf $OUT/vllm_metrics_points.tar.gz -C $W metrics
  tar -czf $OUT/probes.tar.gz -C $W $(cd $W && ls probe-*.json gauges.jsonl 2>/dev/null) q14/config.json
  gzip -c $W/server-$NAME.log > $OUT/server.log.gz
else
  NAME=Qwen2.5-1.5B; DIR=$W/q1.5
  $PY $HERE/make_shape.py $PRESETS/Qwen2.5-1.5B.json $TOKROOT/tok $DIR >> $W/driver.log 2>&1
  for variant in ${VARIANTS:-bf16 fp8}; do
    case $variant in
      bf16) FLAGS="";; fp8) FLAGS="--quantization fp8 --kv-cache-dtype fp8";; fp8w) FLAGS="--quantization fp8";;
    esac
    if [ $(left) -lt 150 ]; then log "skip $variant: $(left) s left"; continue; fi
    if serve $NAME $DIR $FLAGS; then
      mkdir -p $W/grid-$variant/raw
      if [ "$ENGINE" = vllm ]; then
        $PY $HERE/bench_grid.py --base http://127.0.0.1:$PORT --model $NAME --tokenizer $DIR --raw $W/grid-$variant/raw \
          --out $W/grid-$variant --server-log $W/server-$NAME.log --points small \
          --deadline $(( $(date +%s) + $(left) - 90 )) --hard-end $(( $(date +%s) + $(left) - 40 )) 2>&1 | tee -a $W/driver.log
      fi
      curl -s localhost:$PORT/metrics > $W/grid-$variant/metrics_final.txt
      echo "$FLAGS" > $W/grid-$variant/flags.txt
    fi
    stop
    mv $W/server-$NAME.log $W/grid-$variant/server.log 2>/dev/null
    tar -czf $OUT/grid-$variant.tar.gz -C $W grid-$variant q1.5/config.json
  done
fi
cp $W/driver.log $W/env.txt $OUT/
log "done"; ls -la $OUT
