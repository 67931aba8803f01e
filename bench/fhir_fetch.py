#!/usr/bin/env python3
"""Notes by reference vs inline, on the whole Synthea set (issue: real EHR intake, part 5).

Usage: bench/fhir_fetch.py CLINSTREAM_BIN SHARED_DIR [OUT_JSON]

Every DocumentReference of SHARED/fhir/synthea-bulk-fhir-10pt is re-expressed as a Binary resource (served by a
real FHIR server: fhirsnake from .tools/fhir, `make tools`) and a DocumentReference that references it by `url`
(with `size` and SHA-1 `hash`). `clinstream run` (text stages, no embedding) processes the inline originals and
the references; the script checks that notes, variables and knowledge-graph deltas are identical (the input
location aside) and prints the throughput of both paths side by side, best of RUNS (default 3).
"""

import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f]


def normalised(records):
    out = []
    for r in records:
        r = dict(r)
        r.pop("source", None)
        if isinstance(r.get("attachment"), dict):
            a = dict(r["attachment"])
            a.pop("hash_verified", None)
            r["attachment"] = a
        out.append(r)
    return out


def run(binary, input_path, out_dir, env):
    start = time.perf_counter()
    p = subprocess.run(
        [binary, "run", "--no-progress", "--input", input_path, "--out", out_dir],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    took = time.perf_counter() - start
    if p.returncode not in (0, 3):
        sys.exit(f"clinstream run exited {p.returncode}:\n{p.stderr[-2000:]}")
    return took


def main():
    binary, shared = sys.argv[1], sys.argv[2]
    out_json = sys.argv[3] if len(sys.argv) > 3 else None
    runs = int(os.environ.get("RUNS", "3"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tools = os.path.join(root, ".tools", "fhir")
    src = os.path.join(shared, "fhir", "synthea-bulk-fhir-10pt", "DocumentReference.000.ndjson")
    docs = [json.loads(l) for l in open(src)]
    work = tempfile.mkdtemp(prefix="clinstream-fhir-bench-")
    binaries = os.path.join(work, "resources", "Binary")
    os.makedirs(binaries)
    refs = []
    for d in docs:
        att = d["content"][0]["attachment"]
        raw = base64.b64decode(att["data"])
        bid = "b-" + d["id"]
        with open(os.path.join(binaries, bid + ".json"), "w") as f:
            json.dump({"resourceType": "Binary", "id": bid, "contentType": att["contentType"], "data": att["data"]}, f)
        r = json.loads(json.dumps(d))
        r["content"][0]["attachment"] = {
            "contentType": att["contentType"],
            "url": "Binary/" + bid,
            "size": len(raw),
            "hash": base64.b64encode(hashlib.sha1(raw).digest()).decode(),
        }
        refs.append(r)
    inline_path = os.path.join(work, "inline.ndjson")
    ref_path = os.path.join(work, "ref.ndjson")
    with open(inline_path, "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    with open(ref_path, "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in refs)

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "main:app", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning", "--workers", os.environ.get("FHIR_WORKERS", "1")],
        cwd=work,
        env={**os.environ, "PYTHONPATH": f"{tools}:{os.path.join(tools, 'fhirsnake')}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLINSTREAM__")}
        env.update({
            "CLINSTREAM__EMBED__ENABLED": "false",
            "CLINSTREAM__METRICS__ENABLED": "false",
            "CLINSTREAM__FHIR__BASE_URL": f"http://127.0.0.1:{port}",
        })
        best = {"inline": None, "reference": None}
        for i in range(runs):
            for name, path in (("inline", inline_path), ("reference", ref_path)):
                took = run(binary, path, os.path.join(work, f"out-{name}"), env)
                best[name] = took if best[name] is None else min(best[name], took)
        for f in ("notes.ndjson", "variables.ndjson", "kg.ndjson"):
            a = normalised(lines(os.path.join(work, "out-inline", f)))
            b = normalised(lines(os.path.join(work, "out-reference", f)))
            if not a or a != b:
                sys.exit(f"FAIL: {f} differs between inline and reference ({len(a)} vs {len(b)} records)")
        dead = lines(os.path.join(work, "out-reference", "dead_letters.ndjson"))
        if dead:
            sys.exit(f"FAIL: {len(dead)} dead letters on the reference path")
        n = len(docs)
        result = {
            "notes": n,
            "runs": runs,
            "inline_notes_per_s": round(n / best["inline"], 1),
            "reference_notes_per_s": round(n / best["reference"], 1),
            "reference_over_inline": round(best["inline"] / best["reference"], 3),
            "outputs_identical": True,
            "fhir_server": "fhirsnake 1.1.0 (uvicorn, 1 worker)",
            "command": "python3 bench/fhir_fetch.py $BIN $SHARED",
        }
        print(json.dumps(result))
        if out_json:
            with open(out_json, "w") as f:
                json.dump(result, f, indent=2)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
