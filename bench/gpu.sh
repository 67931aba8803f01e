#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md ("One GPU worker"), on a machine with an NVIDIA GPU, the CUDA 13 libraries and
# cuDNN 9 (here: from the NVIDIA Python wheels, e.g. nvidia-cublas, nvidia-cudnn-cu13), and python3 with numpy + onnx.
#
#   bench/gpu.sh DIR [OUT]
#
# DIR holds: clinstream and clinstream-lab (release binaries built with `--features cuda`), ort/ (libonnxruntime.so.1.31.1,
# libonnxruntime_providers_shared.so and libonnxruntime_providers_cuda.so from PyPI onnxruntime-gpu==1.31.1),
# model/ (all-MiniLM-L6-v2 as `make model` writes it: model.onnx, model.fp16.onnx, tokenizer.json, config.json,
# sentence_bert_config.json), noida-db (the test broker; `make tools`), mtsamples.csv, and for E2E_STORE=server a
# Qdrant server binary `qdrant`.
# STEPS (default all) picks: fail check sweep store e2e worker.  Writes JSON lines and logs to OUT (default DIR/out).
# `worker` is one worker in file mode with the chart's GPU settings (gpu.settings in helm/clinstream/values.yaml):
# the model's bound (bench seos --bound-only), the store's write rate (bench store), end to end with the model,
# the share of the run the GPU was busy (nvidia-smi's utilization, sampled every 250 ms), and text stages only;
# WORKER_BINS="name=PATH[@KEY=VALUE,...] ..." adds end-to-end runs beside DIR/clinstream's: another binary (a
# baseline) or other settings (e.g. "shards1=DIR/clinstream@CLINSTREAM__STORE__SHARDS=1").
# E2E_STORE=server starts DIR/qdrant for the store and e2e steps (CLINSTREAM__STORE__SHARDS etc. pass through).
set -euo pipefail
G=$(cd "$1" && pwd)
OUT=${2:-$G/out}
STEPS=${STEPS:-fail check sweep store e2e worker}
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
LAB=$G/clinstream-lab
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
    CLINSTREAM__EMBED__MODEL_FILE=$file "$LAB" bench embed --csv "$CSV" --limit "${CHECK_LIMIT:-300}" --runs 3 \
      --check-cpu "${CHECK_VECTORS:-3000}" | python3 -c 'import json,sys; d=json.load(sys.stdin); d["model_file"]=sys.argv[1]; print(json.dumps(d))' "$file" \
      | tee -a "$OUT/results.jsonl"
  done
  ;;
sweep)
  # Tokens/s across token budgets and batch sizes, both precisions (the worker and the bare loop each time).
  for file in model.onnx model.fp16.onnx; do
    mark "sweep $file"
    CLINSTREAM__EMBED__MODEL_FILE=$file "$LAB" bench embed --csv "$CSV" --limit "${SWEEP_LIMIT:-300}" --runs 2 \
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
  "$LAB" bench store --csv "$CSV" --points placeholder --docs "${STORE_DOCS:-4966}" \
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
worker)
  # The chart's GPU settings (gpu.settings in helm/clinstream/values.yaml), each as its CLINSTREAM__ variable; a key
  # already in the environment wins.
  eval "$(python3 - helm/clinstream/values.yaml <<'PY'
import re, sys
text = open(sys.argv[1]).read()
block = re.search(r"^gpu:\n(?:.*\n)*?  settings:\n((?:    .*\n|\s*\n)+)", text, re.M).group(1)
for key, value in re.findall(r'^    ([a-z_.]+):\s*"?([^"\n]+?)"?\s*$', block, re.M):
    var = "CLINSTREAM__" + key.upper().replace(".", "__")
    print(f'export {var}="${{{var}:-{value}}}"')
PY
)"
  N=${WORKER_NOTES:-4966}
  # WORKER_REPEAT copies of the notes, each copy under its own ids (a longer run; default 1).
  python3 -c 'import sys, json; sys.path.insert(0, "bench"); import kafka_e2e
with open(sys.argv[3], "w") as f:
    for r in range(int(sys.argv[4])):
        for line in kafka_e2e.notes(sys.argv[1], int(sys.argv[2])):
            d = json.loads(line); d["id"] += "-" + str(r); f.write(json.dumps(d) + "\n")' "$CSV" "$N" "$OUT/notes.ndjson" "${WORKER_REPEAT:-1}"
  mark "worker bound"
  "$LAB" bench seos --csv "$CSV" --limit "$N" --modes composed --bound-only > "$OUT/bound.json"
  mark "worker store"
  # The points the worker writes (its chunking; vectors from the synthetic embedder, so no model runs here).
  CLINSTREAM__EMBED__EXECUTION_PROVIDER=synthetic CLINSTREAM__EMBED__ALLOW_SYNTHETIC=true \
  "$LAB" bench store --csv "$CSV" --points worker --docs "$N" --concurrency "$CLINSTREAM__PIPELINE__IN_FLIGHT" --groups 2048 --runs 1 \
    ${QURL:+--url $QURL} > "$OUT/store-alone.json"
  for entry in "clinstream=$BIN" ${WORKER_BINS:-}; do
    name=${entry%%=*}; bin=${entry#*=}; settings=
    case $bin in *@*) settings=${bin#*@}; bin=${bin%%@*};; esac
    for mode in model text-only; do
      if [ "$mode" = text-only ]; then extra=(CLINSTREAM__EMBED__ENABLED=false); else extra=(); fi
      [ -n "$settings" ] && extra+=(${settings//,/ })
      [ "$mode" = text-only ] && [ "$name" != clinstream ] && continue
      rm -rf "$OUT/worker-out"
      mark "worker e2e $name $mode"
      env "${extra[@]}" CLINSTREAM__STORE__PATH="$OUT/worker-out/qdrant" ${QURL:+CLINSTREAM__STORE__KIND=qdrant CLINSTREAM__STORE__URL=$QURL CLINSTREAM__STORE__COLLECTION=w_$RANDOM} \
        "$bin" run --no-progress --input "$OUT/notes.ndjson" --out "$OUT/worker-out" > "$OUT/worker-$name-$mode.txt" 2> "$OUT/worker-$name-$mode.log" || true
      mark "worker e2e end"
    done
  done
  rm -rf "$OUT/worker-out"
  # Everything from the same machine in one line: the end-to-end rate, the GPU's busy share during that run (mean
  # utilization.gpu of the samples between its marks), beside the model's bound and the store's write rate.
  python3 - "$OUT" "$N" "$CLINSTREAM__STORE__SHARDS" <<'PY' | tee -a "$OUT/results.jsonl"
import json, re, sys, glob, os
out, shards = sys.argv[1], int(sys.argv[3])
n = sum(1 for _ in open(f"{out}/notes.ndjson"))
bound = json.load(open(f"{out}/bound.json"))[0]
store = json.load(open(f"{out}/store-alone.json"))
from datetime import datetime
# Samples (time, utilization) per step; a run's window starts after its start-up (the step's mark, then the
# summary's `start-up`) and lasts its `time` (first note to store flushed), so neither the model's load nor the
# index housekeeping the process finishes after its summary is counted.
samples, starts, step = {}, {}, None
for line in open(f"{out}/smi.csv"):
    f = [x.strip() for x in line.split(",")]
    try: t = datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except (ValueError, IndexError): continue
    if len(f) >= 3 and f[1] == "mark":
        step = f[2]; starts.setdefault(step, t); continue
    if step and step.startswith("worker e2e ") and step != "worker e2e end":
        try: samples.setdefault(step, []).append((t, float(f[2])))
        except (ValueError, IndexError): pass
rows = {}
for path in sorted(glob.glob(f"{out}/worker-*.txt")):
    name = os.path.basename(path)[len("worker-"):-len(".txt")]
    text = open(path).read()
    m = re.search(r"\(([\d.]+) notes/s", text)
    secs = re.search(r"time\s+([\d.]+) s", text)
    startup = re.search(r"start-up\s+([\d.]+) s", text)
    key = "worker e2e " + name.replace("-model", " model").replace("-text-only", " text-only")
    begin = starts.get(key, 0) + (float(startup.group(1)) if startup else 0)
    run = [u for t, u in samples.get(key, []) if secs and begin <= t <= begin + float(secs.group(1))]
    rows[name] = {"notes_per_s": float(m.group(1)) if m else None, "seconds": float(secs.group(1)) if secs else None,
                  "gpu_busy_share": round(sum(run) / len(run) / 100, 3) if run else None, "samples": len(run)}
e2e = rows.get("clinstream-model", {}).get("notes_per_s")
print(json.dumps({"step": "worker", "notes": n, "shards": shards, "model_bound_notes_per_s": round(bound["bound_notes_per_s"], 1),
                  "store_alone_docs_per_s": {r["store"]: round(r["docs_per_s"], 1) for r in store},
                  "runs": rows, "e2e_over_model_bound": round(e2e / bound["bound_notes_per_s"], 3) if e2e else None}))
PY
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
