#!/usr/bin/env bash
# Prints the cargo toolchain argument the build needs: nothing when the default rustc is new enough (>= 1.96,
# which qdrant-edge needs), else `+nightly` when a nightly toolchain is installed (e.g. stable
# 1.95 beside a 1.97 nightly). Override with `make RUST_TOOLCHAIN=+1.96.0 ...`.
set -euo pipefail
need_minor=96
ver=$(rustc --version 2>/dev/null | awk '{print $2}')
minor=$(echo "${ver:-0.0.0}" | cut -d. -f2)
if [ "${minor:-0}" -ge "$need_minor" ]; then exit 0; fi
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then echo "+nightly"; exit 0; fi
echo "error: rustc >= 1.$need_minor is needed (found ${ver:-none}); install one (rustup toolchain install stable) or set RUST_TOOLCHAIN" >&2
exit 1
