#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md ("GPU"), on a machine with an NVIDIA GPU, the CUDA 13 libraries and
# cuDNN 9 (here: from the NVIDIA Python wheels, e.g. nvidia-cublas, nvidia-cudnn-cu13), and python3 with numpy + onnx.
#
#   bench/gpu.sh DIR [OUT]
#
# DIR holds: clinstream (a release binary built with `--features cuda`), ort/ (libonnxruntime.so.1.31.1,
# libonnxruntime_providers_shared.so and libonnxruntime_providers_cuda.so from PyPI onnxruntime-gpu==1.31.1),
# model/ (all-MiniLM-L6-v2 as `make model` writes it: model.onnx, model.fp16.onnx, tokenizer.json, config.json,
# sentence_bert_config.json), noida-db (the test broker; `make tools`), mtsamples.csv, and for E2E_STORE=server a
# Qdrant server binary `qdrant`.
# STEPS (default all) picks: fail check sweep store e2e.  Writes JSON lines and logs to OUT (default DIR/out).
# E2E_STORE=server starts DIR/qdrant for the store and e2e steps (CLINSTREAM__STORE__SHARDS etc. pass through).
set -euo pipefail
G=$(cd "$1" && pwd)
OUT=${2:-$G/out}
STEPS=${STEPS:-fail check sweep store e2e}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."

# The CUDA libraries of the NVIDIA wheels, if the loader does not already find them.
if [ -z "${CUDA_LIBS+x}" ]; then
  NV=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
  CUDA_LIBS=$( [ -n "$NV" ] && find "$NV" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd: || true)
fi
export LD_LIBRARY_PATH="$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CLINSTREAM__EMBED__ORT_LIBRARY=$G/ort/libonnxruntime.so.1.31.1
export CLINSTREAM__EMBED__MODEL_DIR=$G/model
export CLINSTREAM__EMBED__EXECUTION_PROVIDER=${PROVIDER:-cuda}
export CLINSTREAM__LOG__LEVEL=warn
BIN=$G/clinstream
CSV=$G/mtsamples.csv

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader,nounits -lms 250 >> "$OUT/smi.csv" &
SMI=$!
trap 'kill $SMI 2>/dev/null || true' EXIT
mark() { echo "$(date -u +%Y/%m/%d\ %H:%M:%S.000), mark, $1" >> "$OUT/smi.csv"; echo "== $1 $(date -u +%T)" >&2; }

# A Qdrant server on this host for E2E_STORE=server (DIR/qdrant), once.
QURL=
if [ "${E2E_STORE:-embedded}" = server ]; then
  QD=$(mktemp -d); QPORT=$((16000 + RANDOM % 4000))
  QDRANT__SERVICE__HOST=127.0.0.1 QDRANT__SERVICE__HTTP_PORT=$((QPORT + 1)) QDRANT__SERVICE__GRPC_PORT=$QPORT \
    QDRANT__STORAGE__STORAGE_PATH=$QD/storage QDRANT__STORAGE__SNAPSHOTS_PATH=$QD/snapshots \
    QDRANT__TELEMETRY_DISABLED=true QDRANT__LOG_LEVEL=WARN "$G/qdrant" > "$OUT/qdrant.log" 2>&1 &
  QPID=$!
  trap 'kill $SMI $QPID 2>/dev/null || true' EXIT
  for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$QPORT) 2>/dev/null && break; sleep 0.1; done
  QURL=http://127.0.0.1:$QPORT
fi

for step in $STEPS; do case $step in
fail)
  # CUDA asked for but its libraries cannot load: start-up must stop with a clear error, never fall back to CPU.
  mark fail
  rc=0; env LD_LIBRARY_PATH= "$BIN" run --input examples --out "$OUT/fail-out" > "$OUT/fail.log" 2>&1 || rc=$?
  echo "{\"step\":\"fail_without_cuda_libraries\",\"exit\":$rc,\"processed\":$(ls "$OUT/fail-out" 2>/dev/null | wc -l)}" | tee -a "$OUT/results.jsonl"
  tail -3 "$OUT/fail.log"
  rc=0; CLINSTREAM__EMBED__CUDA_DEVICE=7 "$BIN" run --input examples --out "$OUT/fail-out2" > "$OUT/fail2.log" 2>&1 || rc=$?
  echo "{\"step\":\"fail_missing_device\",\"exit\":$rc}" | tee -a "$OUT/results.jsonl"
  tail -3 "$OUT/fail2.log"
  ;;
check)
  # Vectors of CUDA fp32 and CUDA fp16 against fp32 on the CPU provider; worker against the bare loop.
  for file in ${CHECK_FILES:-model.onnx model.fp16.onnx}; do
    mark "check $file"
    CLINSTREAM__EMBED__MODEL_FILE=$file "$BIN" bench embed --csv "$CSV" --limit "${CHECK_LIMIT:-300}" --runs 3 \
      --check-cpu "${CHECK_VECTORS:-3000}" | python3 -c 'import json,sys; d=json.load(sys.stdin); d["model_file"]=sys.argv[1]; print(json.dumps(d))' "$file" \
      | tee -a "$OUT/results.jsonl"
  done
  ;;
sweep)
  # Tokens/s across token budgets and batch sizes, both precisions (the worker and the bare loop each time).
  for file in model.onnx model.fp16.onnx; do
    mark "sweep $file"
    CLINSTREAM__EMBED__MODEL_FILE=$file "$BIN" bench embed --csv "$CSV" --limit "${SWEEP_LIMIT:-300}" --runs 2 \
      --batch-tokens "${SWEEP_TOKENS:-4096,16384,65536}" --max-batch "${SWEEP_BATCH:-64,256,1024}" \
      | python3 -c 'import json,sys
for l in sys.stdin: d=json.loads(l); d["model_file"]=sys.argv[1]; print(json.dumps(d), flush=True)' "$file" \
      | tee -a "$OUT/results.jsonl"
  done
  ;;
store)
  # The store's write bound without the model: MTSamples notes' points as the worker writes them (fixed chunks,
  # placeholder vectors) through the store writer, ungrouped and grouped (store.group_points), as many at once as
  # the worker's in-flight budget; embedded, and the server when started.
  mark store
  "$BIN" bench store --csv "$CSV" --docs "${STORE_DOCS:-4966}" \
    --concurrency "${CLINSTREAM__PIPELINE__IN_FLIGHT:-512}" --groups "${STORE_GROUPS:-0,2048}" --runs 1 ${QURL:+--url $QURL} \
    | python3 -c 'import json,sys,os
for r in json.load(sys.stdin): r["step"]="store"; r["shards"]=os.environ.get("CLINSTREAM__STORE__SHARDS","1"); print(json.dumps(r))' \
    | tee -a "$OUT/results.jsonl"
  ;;
e2e)
  # One worker through the broker, every MTSamples note; the store embedded (default) or a Qdrant server started
  # here (E2E_STORE=server, DIR/qdrant); then the same without embedding (the text-only bound).
  # E2E_CHUNKING: seos (default) or fixed.
  if [ -n "$QURL" ]; then
    export CLINSTREAM__STORE__KIND=qdrant CLINSTREAM__STORE__URL=$QURL
  fi
  for mode in ${E2E_MODES:-model.fp16.onnx text-only}; do
    mark "e2e $mode"
    if [ "$mode" = text-only ]; then extra=(CLINSTREAM__EMBED__ENABLED=false); else extra=(CLINSTREAM__EMBED__MODEL_FILE=$mode); fi
    env "${extra[@]}" CLINSTREAM__CHUNKING__STRATEGY="${E2E_CHUNKING:-seos}" CLINSTREAM__STORE__COLLECTION="e2e_$RANDOM" \
      NOIDA_DB="$G/noida-db" E2E_TIMEOUT="${E2E_TIMEOUT:-240}" \
      python3 bench/kafka_e2e.py "$BIN" "$CSV" "${E2E_NOTES:-4966}" 1 \
      | python3 -c 'import json,sys,os; d=json.load(sys.stdin); d["mode"]=sys.argv[1]; d["store"]=os.environ.get("E2E_STORE","embedded"); d["chunking"]=os.environ.get("E2E_CHUNKING","seos"); d["in_flight"]=os.environ.get("CLINSTREAM__PIPELINE__IN_FLIGHT","64"); d["group_points"]=os.environ.get("CLINSTREAM__STORE__GROUP_POINTS","2048"); d["shards"]=os.environ.get("CLINSTREAM__STORE__SHARDS","1"); print(json.dumps(d))' "$mode" \
      | tee -a "$OUT/results.jsonl"
  done
  ;;
esac; done
mark end
# Peak GPU memory seen while each step ran (MiB).
python3 - "$OUT/smi.csv" <<'PY' | tee -a "$OUT/results.jsonl"
import json, sys
peak, step = {}, "start"
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    if len(f) >= 3 and f[1] == "mark":
        step = f[2]; continue
    try:
        peak[step] = max(peak.get(step, 0), int(f[1]))
    except (ValueError, IndexError):
        pass
print(json.dumps({"step": "gpu_memory_peak_mib", "by_step": peak}))
PY
