#!/bin/bash
# Host-work grid on one H200 (device side): what vLLM 0.26's API server and engine core cost per
# stream, per step and per streamed token, by endpoint and stream options.
#
#   PART=unpack  bash benchmarks/real_vllm/run_host_grid.sh   unpack vLLM (.gpu); GEMM=1: time fp8 GEMMs (torch)
#   PART=output  bash benchmarks/real_vllm/run_host_grid.sh   output-heavy mix (128 in / 128 out)
#   PART=prefill bash benchmarks/real_vllm/run_host_grid.sh   prefill-heavy mix (512 in / 32 out),
#                then (FP8=1, the default) the fp8 lone-prompt prefill probe and fp8 GEMM timings
#   PART=openloop RATE=r SERIES=chat:off bash benchmarks/real_vllm/run_host_grid.sh
#                one open-loop run of WORKLOAD (default chat-3tier) at RATE req/s for DUR seconds
#                after WARM seconds of warm-up, per series: a held-out check, never fitted
#
# Each part runs, on ONE server (Llama-3.1-8B dimensions, bf16, random weights by
# --load-format dummy, TP=1, CUDA graphs, vLLM's defaults otherwise), `servefleet bench` closed
# loop at CONCS for every endpoint (chat, completions) x stream options (per-chunk usage stats on,
# off): 4 series of 5 points (SERIES picks some, e.g. "chat:on completions:off"). vLLM logs
# every engine iteration (--enable-logging-iteration-details; each line stamped with its Unix
# time via VLLM_LOGGING_PREFIX). The server is started with setsid
# so that a second call on the same warm machine finds it up and skips the start.
# ENGINE=sim rehearses the whole driver on the servefleet sim-server (no GPU).
# Payload in $PAYLOAD (default .gpu: vllm.tar.xz, tok.tar.xz) and $DEPS (default .dev/deps.tar.xz),
# carried in two calls on one warm machine when both exceed what one call carries (README.md).
# Results: at most 8 files under $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0
export COLUMNS=200 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_LOGGING_PREFIX='%(created).4f '
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
PART=${PART:-output}; ENGINE=${ENGINE:-vllm}; P=${PAYLOAD:-$ROOT/.gpu}; DEPS=${DEPS:-$ROOT/.dev/deps.tar.xz}; OUT=${OUT:-/tmp/hg-out}
BUDGET=${BUDGET:-560}; CONCS=${CONCS:-16,64,128,256,512}; DUR=${DUR:-12}; WARM=${WARM:-3}; COOL=${COOL:-3}
FP8=${FP8:-1}; PORT=8000; NAME=llama8b
case $PART in output) IN=128; OUTLEN=128;; prefill) IN=512; OUTLEN=32;; *) IN=${IN:-128}; OUTLEN=${OUTLEN:-128};; esac
LOAD="--input-len $IN --output-len $OUTLEN --concurrency $CONCS"
[ "$PART" = openloop ] && LOAD="--workload ${WORKLOAD:-chat-3tier} --rate ${RATE:?openloop needs RATE}"
W=/tmp/hg-$PART; SITE=/tmp/site; BASE=${BASE:-/root}; TOKROOT=$BASE/tok; DIR=$BASE/llama8b; SLOG=$BASE/server-bf16.log
rm -rf $W; mkdir -p $W/bench $W/metrics $OUT $SITE $TOKROOT
T0=$(date +%s); el(){ echo $(( $(date +%s) - T0 )); }; left(){ echo $(( T0 + BUDGET - $(date +%s) )); }
log(){ echo "[$(el)s] $*" | tee -a $W/driver.log; }
unx(){ if command -v xz >/dev/null; then ( cd $2 && xz -T0 -dc $1 | tar -xf - )
       else python3 -c "import sys,tarfile;tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $1 $2; fi; }
export PYTHONPATH=$ROOT/src
if [ "$ENGINE" = vllm ]; then
  { nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,power.limit --format=csv; nproc; } > $W/env.txt 2>&1
  # vLLM and its dependencies may come in two calls (each call carries at most 64 MiB): each
  # archive is unpacked once per machine
  [ -f $SITE/.vllm_ok ] || [ ! -f $P/vllm.tar.xz ] || { unx $P/vllm.tar.xz $SITE && touch $SITE/.vllm_ok; } >> $W/driver.log 2>&1
  [ -f $SITE/.deps_ok ] || [ ! -f $DEPS ] || { unx $DEPS $SITE && touch $SITE/.deps_ok; } >> $W/driver.log 2>&1
  export PYTHONPATH=$ROOT/src:$SITE
  python3 -c "import vllm,torch;print('vllm',vllm.__version__,'torch',torch.__version__)" >> $W/env.txt 2>&1
fi
[ -d $TOKROOT/tok ] || unx $P/tok.tar.xz $TOKROOT
[ -f $DIR/config.json ] || python3 $HERE/make_shape.py $ROOT/src/servefleet/data/models/Llama-3.1-8B.json $TOKROOT/tok $DIR >> $W/driver.log 2>&1
log "ready: $(tail -1 $W/env.txt); unpacked: $(ls -A $SITE | grep -c ok) of 2"
if [ "$PART" = unpack ]; then
  [ "${GEMM:-0}" = 1 ] && { timeout 120 python3 $HERE/fp8_gemm_timing.py --out $W/fp8_gemm_torch.json >> $W/driver.log 2>&1; log "fp8 gemm (torch only) rc=$?"; }
  cp $W/fp8_gemm_torch.json $W/env.txt $W/driver.log $OUT/ 2>/dev/null; exit 0
fi
[ "$ENGINE" = sim ] || [ -f $SITE/.deps_ok ] || { log "vLLM's dependencies are not unpacked: carry $DEPS"; cp $W/driver.log $OUT/; exit 1; }
STAMP='import sys,time
for l in sys.stdin: sys.stdout.write(f"{time.time():.3f} {l}")'  # each bench line with its Unix time (point starts and ends)
up(){ curl -sf localhost:$PORT/health >/dev/null 2>&1; }
serve(){ # log-file extra-flags... ; starts a server in its own session and waits for /health
  local slog=$1; shift
  if [ "$ENGINE" = vllm ]; then
    local cmd="python3 -m vllm.entrypoints.cli.main serve $DIR --port $PORT --served-model-name $NAME --max-model-len 4096 --load-format dummy --enable-logging-iteration-details --disable-uvicorn-access-log $*"
  else
    local cmd="python3 -m servefleet sim-server --model $DIR/config.json --gpu H200-SXM --port $PORT --served-model-name $NAME --max-model-len 4096 --startup-time 1"
  fi
  echo "CMD: $cmd" >> $slog
  setsid $cmd >> $slog 2>&1 < /dev/null & SPID=$!
  echo $SPID > $BASE/server.pid
  local ts=$(date +%s)
  until up; do
    sleep 1
    if ! kill -0 $SPID 2>/dev/null; then log "server DIED after $(( $(date +%s) - ts ))s"; tail -25 $slog >> $W/driver.log; return 1; fi
    if [ $(left) -lt 60 ]; then log "server not healthy in time"; return 1; fi
  done
  log "HEALTHY after $(( $(date +%s) - ts ))s: $*"
}
stop(){ [ -f $BASE/server.pid ] || return; local pid=$(cat $BASE/server.pid); kill -- -$pid 2>/dev/null || kill $pid 2>/dev/null
  for i in $(seq 30); do up || kill -0 $pid 2>/dev/null || break; sleep 1; done; kill -9 -- -$pid 2>/dev/null; rm -f $BASE/server.pid; sleep 2; log "server stopped"; }
scrape(){ curl -s localhost:$PORT/metrics | gzip > $W/metrics/$1.txt.gz; }

if up; then log "server already up (earlier call on this machine)"; else serve $SLOG || true; fi
if up; then
  python3 $HERE/gauge_sampler.py http://127.0.0.1:$PORT $W/gauges.jsonl 0.5 & GPID=$!
  for series in ${SERIES:-chat:on completions:on chat:off completions:off}; do
    ep=${series%%:*}; us=${series##*:}; tag=$PART-$ep-usage$us
    [ $(left) -lt 90 ] && { log "skip $tag: $(left) s left"; continue; }
    flag=--continuous-usage; [ $us = off ] && flag=--no-continuous-usage
    echo "{\"series\": \"$tag\", \"start\": $(date +%s.%N), \"log_line\": $(wc -l < $SLOG)}" >> $W/series.jsonl
    scrape $tag-before
    timeout $(( $(left) - 25 )) python3 -m servefleet bench --url http://127.0.0.1:$PORT --model $NAME --endpoint $ep $flag \
      $LOAD --duration $DUR --warmup $WARM --cooldown $COOL \
      --drain-timeout ${DRAIN:-40} --gpu-metrics none --no-progress --out $W/bench/$tag 2>&1 | python3 -u -c "$STAMP" > $W/bench-$tag.log
    log "bench $tag rc=${PIPESTATUS[0]}"; grep -E "point .* done" $W/bench-$tag.log | tee -a $W/driver.log
    scrape $tag-after
    echo "{\"series\": \"$tag\", \"end\": $(date +%s.%N), \"log_line\": $(wc -l < $SLOG)}" >> $W/series.jsonl
    python3 $HERE/compact_records.py $W/bench/$tag >> $W/driver.log 2>&1
  done
  kill $GPID 2>/dev/null
fi
if [ "$PART" = prefill ] && [ "$FP8" = 1 ] && [ "$ENGINE" = vllm ]; then
  # bf16 lone 1,000-token prompts on the server still up, then the fp8 GEMM timings, then an fp8 server
  up && python3 $HERE/lone_prefill.py --base http://127.0.0.1:$PORT --model $NAME --tokens 1000 --reps 12 \
    --label bf16 --out $W/lone-bf16.json >> $W/driver.log 2>&1
  stop
  [ $(left) -gt 170 ] && timeout 60 python3 $HERE/fp8_gemm_timing.py --out $W/fp8_gemm.json >> $W/driver.log 2>&1; log "fp8 gemm rc=$?"
  if [ $(left) -gt 140 ] && serve $BASE/server-fp8.log --quantization fp8; then
    python3 $HERE/lone_prefill.py --base http://127.0.0.1:$PORT --model $NAME --tokens 1000 --reps 12 \
      --label fp8 --out $W/lone-fp8.json >> $W/driver.log 2>&1; log "fp8 lone rc=$?"
  fi
  stop
fi
[ "$PART" = prefill ] && stop
cp $SLOG $W/server-bf16.log 2>/dev/null; cp $BASE/server-fp8.log $W/ 2>/dev/null
tar -cJf $OUT/bench-$PART.tar.xz -C $W bench series.jsonl $(cd $W && ls bench-*.log gauges.jsonl lone-*.json fp8_gemm.json 2>/dev/null)
tar -czf $OUT/metrics-$PART.tar.gz -C $W metrics
gzip -c $W/server-bf16.log > $OUT/server-bf16-$PART.log.gz 2>/dev/null
[ -f $W/server-fp8.log ] && gzip -c $W/server-fp8.log > $OUT/server-fp8.log.gz
cp $W/env.txt $OUT/env-$PART.txt; log "done"; cp $W/driver.log $OUT/driver-$PART.log; ls -la $OUT
