#!/usr/bin/env bash
# The Dockerfile's build stage, checked without a registry or a Rust base image: the paths its COPY lines name (read
# from the Dockerfile, so the two cannot drift) are copied into an empty directory laid out as the stage's WORKDIR,
# and the crate is compiled there offline (`cargo check --locked`, the cached dependencies) for each variant — the CPU
# build and `--features cuda`. A build input the stage forgets to copy fails here.
#
#   tools/dockerfile_check.sh [DOCKERFILE]        (default: ./Dockerfile; CARGO_TARGET_DIR shared with the build)
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKERFILE=${1:-Dockerfile}
TOOLCHAIN=${RUST_TOOLCHAIN-$(tools/toolchain.sh)}
# The build's own target directory (as the Makefile sets it): the dependencies compiled there are reused.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/clinstream/target}
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
python3 - "$DOCKERFILE" "$stage" <<'PY'
import os, re, shutil, sys
dockerfile, stage = sys.argv[1], sys.argv[2]
lines = open(dockerfile).read().splitlines()
start = next((i for i, l in enumerate(lines) if re.match(r"FROM \S+ AS build$", l)), None)
if start is None:
    sys.exit(f"{dockerfile}: no `FROM ... AS build` stage")
workdir, copies = None, []
for line in lines[start + 1:]:
    if line.startswith("FROM "):
        break
    if m := re.match(r"WORKDIR (\S+)$", line):
        workdir = m.group(1)
    elif line.startswith("COPY "):
        if "--from=" in line:
            sys.exit(f"{dockerfile}: the build stage copies from another stage: {line!r}")
        *sources, dest = line.split()[1:]
        copies.append((sources, dest))
if workdir is None or not copies:
    sys.exit(f"{dockerfile}: the build stage has no WORKDIR or no COPY")
for sources, dest in copies:
    target = os.path.join(stage, os.path.relpath(os.path.join(workdir, dest), workdir))
    for src in sources:
        if not os.path.exists(src):
            sys.exit(f"{dockerfile}: COPY names {src}, which does not exist")
        to = os.path.join(target, os.path.basename(src)) if dest.endswith("/") else target
        os.makedirs(os.path.dirname(to) or ".", exist_ok=True)
        (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, to)
print("dockerfile-check: the build stage copies " + ", ".join(s for ss, _ in copies for s in ss))
PY
for features in "" "--features cuda"; do
  echo "dockerfile-check: cargo check --locked --offline --bin clinstream ${features:-(cpu)}"
  (cd "$stage" && cargo $TOOLCHAIN check --locked --offline --quiet --bin clinstream $features)
done
echo "dockerfile-check: ok"
