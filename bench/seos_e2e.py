#!/usr/bin/env python3
"""SEOS end to end in file mode, today's release beside this tree, same notes,, same run.

Usage: bench/seos_e2e.py MTSAMPLES_CSV NOTES ROUNDS NAME=BIN[:SEOS_VECTORS] [NAME=BIN[:SEOS_VECTORS] ...]

Each entry is a `clinstream` binary and, for binaries that have the setting, a `chunking.seos_vectors` mode
(groups | sentences | composed), or `fixed` for fixed-size chunks instead of SEOS; a binary without `:MODE` runs
with its defaults. Every entry runs
`clinstream run --no-progress --input notes.ndjson --out DIR` over the first NOTES non-empty MTSamples notes with
SEOS indexing into a fresh embedded store (CLINSTREAM__STORE__PATH=DIR/qdrant), ROUNDS times, entries alternating
within a round so that drift hits all of them. Prints JSON: best and mean notes/s per entry, points written, and
each entry's best against the first entry's (the baseline).
"""

import base64
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def notes(path, n):
    csv.field_size_limit(1 << 30)
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            t = row.get("transcription", "")
            if t.strip():
                out.append(t)
            if len(out) == n:
                break
    return out


def main():
    csv_path, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    entries = []
    for arg in sys.argv[4:]:
        name, spec = arg.split("=", 1)
        binary, _, mode = spec.partition(":")
        entries.append((name, binary, mode))
    work = tempfile.mkdtemp(prefix="seos-e2e-")
    try:
        path = os.path.join(work, "notes.ndjson")
        with open(path, "w") as f:
            for i, t in enumerate(notes(csv_path, n)):
                f.write(json.dumps({
                    "resourceType": "DocumentReference", "id": f"seos-{i}", "status": "current",
                    "subject": {"reference": f"Patient/p{i % 50}"},
                    "content": [{"attachment": {"contentType": "text/plain; charset=utf-8",
                                                "data": base64.b64encode(t.encode()).decode()}}],
                }) + "\n")
        times = {name: [] for name, _, _ in entries}
        points = {}
        for _ in range(rounds):
            for name, binary, mode in entries:
                out = os.path.join(work, "out")
                shutil.rmtree(out, ignore_errors=True)
                env = dict(os.environ, CLINSTREAM__STORE__PATH=os.path.join(out, "qdrant"),
                           CLINSTREAM__CHUNKING__STRATEGY="seos", CLINSTREAM__LOG__LEVEL="warn")
                if mode == "fixed":
                    env["CLINSTREAM__CHUNKING__STRATEGY"] = "fixed"
                elif mode:
                    env["CLINSTREAM__CHUNKING__SEOS_VECTORS"] = mode
                start = time.perf_counter()
                p = subprocess.run([binary, "run", "--no-progress", "--input", path, "--out", out], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                took = time.perf_counter() - start
                if p.returncode != 0:
                    sys.exit(f"{name}: exit {p.returncode}: {p.stderr[-2000:]}")
                times[name].append(took)
                with open(os.path.join(out, "notes.ndjson")) as f:
                    points[name] = sum(1 for _ in f)
        base = entries[0][0]
        result = {"notes": n, "rounds": rounds, "entries": []}
        for name, binary, mode in entries:
            best = min(times[name])
            result["entries"].append({
                "name": name, "mode": mode or "default", "seconds": times[name],
                "best_notes_per_s": n / best, "mean_notes_per_s": n / (sum(times[name]) / len(times[name])),
                "notes_written": points[name], "best_vs_baseline": min(times[base]) / best,
            })
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
