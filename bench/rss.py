"""Memory over a sustained run: the worker processes MTSamples notes (wrapped as DocumentReferences, fed in a loop on
stdin) with indexing on, and its RSS is sampled every few seconds for DURATION seconds.

    python3 bench/rss.py BIN MTSAMPLES_CSV [DURATION_S] [STRATEGY] [DISTINCT]     (prints JSON)

STRATEGY: seos (default) or fixed — chunks embedded and indexed into the embedded store — or none (`run --no-embed`,
every text stage, nothing indexed). With indexing on, the embedded store keeps the points it is given, so RSS grows
with the data; the report gives the points stored and the growth per thousand points to tell data from a leak.
DISTINCT (default 0 = every event a new document): event ids cycle over that many documents, so re-processed notes
overwrite their own points and the store stops growing once every id has been seen — a steady state in which RSS
must stay flat.

Reports the first sample after warm-up (the first minute), the last, the peak, and the least-squares slope of RSS
over the samples after warm-up (MB per minute): flat means the slope is near zero. Standard library only."""
import base64, csv, json, os, shutil, socket, subprocess, sys, tempfile, threading, time, urllib.request

# Work directories to remove at exit.
WORK = []

csv.field_size_limit(1 << 30)


def status_mb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def rss_mb(pid):
    return status_mb(pid, "VmRSS")


def main():
    bin_, path = sys.argv[1], sys.argv[2]
    duration = float(sys.argv[3]) if len(sys.argv) > 3 else 300.0
    strategy = sys.argv[4] if len(sys.argv) > 4 else "seos"
    distinct = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    with open(path, newline="", encoding="utf-8") as f:
        texts = [r["transcription"] for r in csv.DictReader(f) if r.get("transcription", "").strip()]
    work = tempfile.mkdtemp(prefix="clinstream-rss-")
    WORK.append(work)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = dict(os.environ, CLINSTREAM__STORE__PATH=os.path.join(work, "qdrant"), CLINSTREAM__LOG__LEVEL="warn",
               CLINSTREAM__METRICS__ADDR=f"127.0.0.1:{port}",
               CLINSTREAM__CHUNKING__STRATEGY="fixed" if strategy == "none" else strategy)
    extra = ["--no-embed"] if strategy == "none" else []
    # The outputs go to /dev/null: a 300-s text-only run writes ~20 GB, which once filled the disk and killed the
    # worker mid-run (bench/results/2026-11-26-2.json). The file sink opens these paths with File::create, which
    # follows the links; what it costs to serialize and write every line stays in the measurement.
    out = os.path.join(work, "out")
    os.makedirs(out)
    for name in ("notes.ndjson", "variables.ndjson", "kg.ndjson", "dead_letters.ndjson"):
        os.symlink(os.devnull, os.path.join(out, name))
    stderr = open(os.path.join(work, "stderr.log"), "wb")
    proc = subprocess.Popen([bin_, "run", "--no-progress", *extra, "--input", "-", "--out", out],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    stop = threading.Event()

    def feed():
        i = 0
        try:
            while not stop.is_set():
                text = texts[i % (distinct or len(texts))]
                doc_id = f"rss-{i % distinct}" if distinct else f"rss-{i}"
                doc = {"resourceType": "DocumentReference", "id": doc_id, "status": "current",
                       "subject": {"reference": f"Patient/{i % 97}"},
                       "content": [{"attachment": {"contentType": "text/plain",
                                                   "data": base64.b64encode(text.encode()).decode()}}]}
                proc.stdin.write((json.dumps(doc) + "\n").encode())
                i += 1
        except (BrokenPipeError, ValueError):
            pass

    threading.Thread(target=feed, daemon=True).start()
    def progress():
        """(documents finished, points upserted) from the worker's /metrics."""
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        except Exception:
            return 0, 0
        total = lambda prefix: int(sum(float(l.rsplit(" ", 1)[1]) for l in body.splitlines() if l.startswith(prefix)))
        return total("clinstream_documents_finished_total"), total('clinstream_qdrant_points_total{operation="upserted"}')

    samples, counts, split = [], [], []
    start = time.time()
    while time.time() - start < duration:
        if proc.poll() is not None:
            # A sample of a dead process reads 0 MB: never report that as memory. Fail with the worker's last words.
            stderr.close()
            tail = open(os.path.join(work, "stderr.log"), "rb").read()[-2000:].decode(errors="replace")
            error = f"the worker exited with {proc.returncode} after {time.time() - start:.0f} s"
            print(f"rss.py: {error}; stderr tail:\n{tail}", file=sys.stderr)
            json.dump({"error": error, "strategy": strategy, "duration_s": duration}, sys.stdout)
            print()
            sys.exit(1)
        samples.append((time.time() - start, rss_mb(proc.pid)))
        # Anonymous memory (heap: the worker's own allocations) apart from file-backed pages (the store's
        # memory-mapped WAL and segments, which the kernel can drop and re-read).
        split.append((status_mb(proc.pid, "RssAnon"), status_mb(proc.pid, "RssFile")))
        counts.append(progress())
        time.sleep(5)
    documents, points = counts[-1]
    stop.set()
    proc.kill()
    proc.wait()
    steady = [(t, r) for t, r in samples if t >= 60] or samples
    n = len(steady)
    mt = sum(t for t, _ in steady) / n
    mr = sum(r for _, r in steady) / n
    var = sum((t - mt) ** 2 for t, _ in steady) or 1.0
    slope = sum((t - mt) * (r - mr) for t, r in steady) / var * 60
    growth = steady[-1][1] - steady[0][1]
    warm = len(samples) - n
    points_after_warmup = points - counts[warm][1]
    json.dump({"duration_s": duration, "strategy": strategy, "distinct_documents": distinct, "samples": len(samples),
               "documents": int(documents), "points": int(points),
               "rss_mb_after_warmup": round(steady[0][1], 1), "rss_mb_last": round(samples[-1][1], 1),
               "rss_mb_peak": round(max(r for _, r in samples), 1), "slope_mb_per_min": round(slope, 2),
               "growth_after_warmup_mb": round(growth, 1), "points_after_warmup": points_after_warmup,
               "growth_mb_per_1k_points": round(growth / points_after_warmup * 1000, 2) if points_after_warmup else None,
               "anon_mb_after_warmup": round(split[warm][0], 1), "anon_mb_last": round(split[-1][0], 1),
               "file_mb_after_warmup": round(split[warm][1], 1), "file_mb_last": round(split[-1][1], 1),
               "series": [[round(t), round(r, 1), round(a, 1), round(f, 1)] for (t, r), (a, f) in zip(samples, split)]},
              sys.stdout)
    print()


if __name__ == "__main__":
    try:
        main()
    finally:
        # The worker's outputs of a 300-s text-only run reach ~20 GB: never leave them behind.
        for d in WORK:
            shutil.rmtree(d, ignore_errors=True)
