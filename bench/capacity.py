#!/usr/bin/env python3
"""The worker's capacity around the model: end to end with the synthetic embedder beside its two other bounds.

    python3 bench/capacity.py BIN MTSAMPLES_CSV NOTES          (prints JSON, and a table on stderr)

For each store (embedded; and a Qdrant server when QDRANT_URL names one) and each intake (file mode; Kafka mode
through a local broker, `make tools`' noida-db or NOIDA_DB), side by side in one run on the same NOTES non-empty
MTSamples notes:

* end to end with `embed.execution_provider = "synthetic"` (`embed.allow_synthetic = true`): every stage of the
  worker — decode, sections, sentences, entities, CLEAR, kg, tokenizing, SEOS, BM25, payloads, the store's writes,
  the outputs — with vectors hashed from token ids instead of the model's (docs/configuration.md);
* text stages only: the same run with `embed.enabled = false` (`run --no-embed`);
* the store's write path alone: `clinstream-lab bench store --csv --points worker` on the same notes with the same
  synthetic embedder, i.e. exactly the points the end-to-end run writes (its SEOS chunks and vectors, windows, BM25
  vectors, payloads), made before the clock starts and written through the store writer as the worker writes them,
  `pipeline.in_flight` documents at once;

each in notes/s, and the ratio of the first to the smaller of the other two (1.0: the worker runs at the pace of
its slowest part; the goal is at least 0.8), with the share of the machine's cores busy during the end-to-end run
(`/proc/stat` sampled every 50 ms over the run's own clock: the worker, and the broker and a Qdrant server where they
run on the same machine): near 1, the cores themselves are the bound — the parts' CPU together — rather than a wait
inside the worker. File-mode notes/s are the run's own (`clinstream run`'s summary:
from the first note to the store flushed, start-up excluded); Kafka-mode ones from every worker ready to the input
offsets committed (bench/kafka_e2e.py), with the share of the cores the broker took in each (it runs on the same
cores here) and the worker's own CPU milliseconds per note. Both clocks stop when the points are durable, before most of the segment maintenance their writes
start; for the embedded store each file row also gives the pair with it: the store alone until that maintenance
has finished (`bench store --settled`), and the file run until its process exits after finishing it
(`store.maintenance_wait_ms` raised), start-up excluded. CAPACITY_ROUNDS (default 2) runs every measurement that many times,
entries alternating, and keeps each one's best. CAPACITY_MODES (default "file kafka") and the worker's own
environment (CLINSTREAM__STORE__SHARDS, CLINSTREAM__PIPELINE__IN_FLIGHT, ...) pass through. Standard library
only."""
import json, os, re, shutil, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_e2e  # noqa: E402

SYNTHETIC = {"CLINSTREAM__EMBED__EXECUTION_PROVIDER": "synthetic", "CLINSTREAM__EMBED__ALLOW_SYNTHETIC": "true"}
TEXT_ONLY = {"CLINSTREAM__EMBED__ENABLED": "false"}


def in_flight():
    import tomllib
    with open(os.path.join(os.path.dirname(__file__), "..", "config", "default.toml"), "rb") as f:
        d = tomllib.load(f)
    return int(os.environ.get("CLINSTREAM__PIPELINE__IN_FLIGHT", d["pipeline"]["in_flight"]))


def file_run(bin_, events, work, env):
    out = os.path.join(work, "out")
    shutil.rmtree(out, ignore_errors=True)
    e = dict(os.environ, CLINSTREAM__STORE__PATH=os.path.join(out, "qdrant"), CLINSTREAM__LOG__LEVEL="warn",
             CLINSTREAM__STORE__COLLECTION=f"capacity_{os.getpid()}_{len(os.listdir(work))}")
    e.update(env)
    # The run exits once the maintenance its writes started has finished (a file run otherwise gives it
    # store.maintenance_wait_ms), so the process's time after start-up is the run with that maintenance.
    e.setdefault("CLINSTREAM__STORE__MAINTENANCE_WAIT_MS", "900000")
    began = time.time()
    with Busy() as busy:
        p = subprocess.run([bin_, "run", "--no-progress", "--input", events, "--out", out], env=e,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.time() - began
    if p.returncode not in (0, 3):
        sys.exit(f"clinstream run: exit {p.returncode}: {p.stderr[-2000:]}")
    m = re.search(r"\(([\d.]+) notes/s", p.stdout)
    startup = re.search(r"start-up\s+([\d.]+) s", p.stdout)
    took = re.search(r"time\s+([\d.]+) s", p.stdout)
    if not m or not startup or not took:
        sys.exit(f"clinstream run printed no rate: {p.stdout[-1000:]}")
    docs = int(re.search(r"documents written\s+(\d+)", p.stdout).group(1))
    kind = env.get("CLINSTREAM__STORE__KIND", "none")
    FILE_SETTLED[kind] = max(FILE_SETTLED.get(kind, 0.0), docs / max(wall - float(startup.group(1)), 1e-9))
    rate = float(m.group(1))
    if rate > FILE_BUSY.get(kind, (0.0, 0.0))[0]:
        first = began + float(startup.group(1))
        FILE_BUSY[kind] = (rate, busy.between(first, first + float(took.group(1))))
    return rate


class Busy:
    """The machine's busy and total CPU ticks, sampled every 50 ms on a thread of its own while the `with` block
    runs, so that its busy share can be taken afterwards over any stretch of it (a run's own clock)."""

    def __enter__(self):
        self.samples, self.done = [], threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()
        return self

    def sample(self):
        while True:
            self.samples.append((time.time(), *kafka_e2e.machine_jiffies()))
            if self.done.wait(0.05):
                return

    def __exit__(self, *_):
        self.done.set()
        self.thread.join()

    def between(self, start, end):
        """The share of the machine's cores busy between two times, from the samples nearest them."""
        a = min(self.samples, key=lambda x: abs(x[0] - start))
        b = min(self.samples, key=lambda x: abs(x[0] - end))
        return round((b[1] - a[1]) / max(b[2] - a[2], 1), 2)


# File mode, by store: the machine's busy share over the best run's own clock (its rate, the share).
FILE_BUSY = {}


# File mode, by store: notes/s from the end of start-up to the process's exit, the maintenance included.
FILE_SETTLED = {}


# The broker's share of the machine's cores in each run's best Kafka-mode measurement, by what was run: the broker
# shares the cores with the worker here, and what it spends grows with the run's length (noida-db writes its whole
# state to disk every few seconds while topics change; docs/benchmarks.md).
BROKER_SHARE = {}
WORKER_CPU_MS = {}
KAFKA_BUSY = {}


def kafka_run(bin_, events, n, work, env, key):
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        with Busy() as busy:
            r = kafka_e2e.run(bin_, events, n, 1, work)
        if r["notes_per_s"] > BROKER_SHARE.get(key, (0.0, 0.0))[0]:
            share = r["cpu_seconds"]["broker"] / (r["cores"] * r["seconds_to_committed"])
            BROKER_SHARE[key] = (r["notes_per_s"], round(share, 2))
            # The machine's busy share from every worker ready to the commit: the worker, the broker and, with
            # a Qdrant server on the same machine, the server.
            KAFKA_BUSY[key] = busy.between(*r["clock"])
            # The worker's own CPU per note up to the commit (its consumer, stages, store writes and producer).
            WORKER_CPU_MS[key] = round(1000 * r["cpu_seconds"]["workers"] / n, 2)
        return r["notes_per_s"]
    finally:
        os.environ.clear()
        os.environ.update(saved)


def store_run(bin_, csv_path, n, url):
    e = dict(os.environ, CLINSTREAM__LOG__LEVEL="warn", **SYNTHETIC)
    # The lab binary beside the worker (`clinstream-lab`, the same build).
    lab = os.path.join(os.path.dirname(os.path.abspath(bin_)), "clinstream-lab")
    cmd = [lab, "bench", "store", "--csv", csv_path, "--points", "worker", "--docs", str(n),
           "--concurrency", str(in_flight()),
           "--groups", e.get("CLINSTREAM__STORE__GROUP_POINTS", "2048"), "--runs", "1", "--settled"]
    if url:
        cmd += ["--url", url]
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"bench store: exit {p.returncode}: {p.stderr[-2000:]}")
    rows = json.loads(p.stdout)
    # The embedded store also says when the maintenance its writes started had finished (its clock, like the
    # end-to-end run's, stops when the points are durable).
    for r in rows:
        if r.get("settled_docs_per_s"):
            SETTLED[r["store"]] = max(SETTLED.get(r["store"], 0.0), r["settled_docs_per_s"])
    return {r["store"]: r["docs_per_s"] for r in rows}


# The store-alone rate counting the maintenance its writes started, by store (best of the rounds).
SETTLED = {}


def main():
    bin_, csv_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rounds = max(1, int(os.environ.get("CAPACITY_ROUNDS", "2")))
    modes = os.environ.get("CAPACITY_MODES", "file kafka").split()
    url = os.environ.get("QDRANT_URL", "")
    # The worker's default chunking (bench/kafka_e2e.py alone defaults to fixed chunks).
    os.environ.setdefault("CLINSTREAM__CHUNKING__STRATEGY", "seos")
    stores = [("embedded", {"CLINSTREAM__STORE__KIND": "embedded"})]
    if url:
        stores.append(("qdrant", {"CLINSTREAM__STORE__KIND": "qdrant", "CLINSTREAM__STORE__URL": url}))
    work = tempfile.mkdtemp(prefix="clinstream-capacity-")
    try:
        events = kafka_e2e.write_events(csv_path, n, os.path.join(work, "events.ndjson"))
        best = {}

        def keep(key, value):
            best[key] = max(best.get(key, 0.0), value)

        for _ in range(rounds):
            for mode in modes:
                run = (lambda env, key: file_run(bin_, events, work, env)) if mode == "file" else \
                    (lambda env, key: kafka_run(bin_, events, n, work, env, key))
                keep((mode, "text"), run(TEXT_ONLY, "text"))
                for store, senv in stores:
                    keep((mode, store, "e2e"), run(dict(senv, **SYNTHETIC), store))
            for store, rate in store_run(bin_, csv_path, n, url).items():
                keep(("store", store), rate)
        rows = []
        for mode in modes:
            for store, _ in stores:
                e2e, text, st = best[(mode, store, "e2e")], best[(mode, "text")], best[("store", store)]
                rows.append({"intake": mode, "store": store, "e2e_synthetic_notes_per_s": round(e2e, 1),
                             "text_only_notes_per_s": round(text, 1), "store_alone_notes_per_s": round(st, 1),
                             "ratio_to_bound": round(e2e / min(text, st), 3),
                             "bound": "text stages" if text < st else "store writes",
                             # How full the machine was in the end-to-end run: near 1, the cores are the bound
                             # (the parts' CPU together), not a wait inside the worker.
                             "e2e_cores_busy": FILE_BUSY[store][1] if mode == "file" else KAFKA_BUSY[store]})
                if mode == "file" and store in SETTLED and store in FILE_SETTLED:
                    # Both sides with the maintenance their writes started (an embedded store only).
                    rows[-1]["store_alone_settled_notes_per_s"] = round(SETTLED[store], 1)
                    rows[-1]["e2e_settled_notes_per_s"] = round(FILE_SETTLED[store], 1)
                    rows[-1]["settled_ratio"] = round(FILE_SETTLED[store] / SETTLED[store], 3)
                if mode == "kafka":
                    # The share of the cores the broker took in the end-to-end run and in the text-only one.
                    rows[-1]["broker_core_share"] = {"e2e": BROKER_SHARE[store][1], "text_only": BROKER_SHARE["text"][1]}
                    rows[-1]["worker_cpu_ms_per_note"] = {"e2e": WORKER_CPU_MS[store], "text_only": WORKER_CPU_MS["text"]}
        result = {"notes": n, "rounds": rounds, "cores": os.cpu_count(), "in_flight": in_flight(),
                  "shards": int(os.environ.get("CLINSTREAM__STORE__SHARDS", "1")),
                  "command": f"python3 bench/capacity.py BIN mtsamples.csv {n}", "rows": rows}
        print(json.dumps(result, indent=2))
        print(f"capacity around the model ({n} notes, best of {rounds}; notes/s):", file=sys.stderr)
        for r in rows:
            print(f"  {r['intake']:<6}{r['store']:<9} e2e (synthetic) {r['e2e_synthetic_notes_per_s']:8.0f}   "
                  f"text only {r['text_only_notes_per_s']:8.0f}   store alone {r['store_alone_notes_per_s']:8.0f}   "
                  f"e2e / min = {r['ratio_to_bound']:.2f}   cores busy in e2e {r['e2e_cores_busy']:.2f}"
                  + (f"\n{'':15}with the maintenance their writes start: e2e {r['e2e_settled_notes_per_s']:8.0f}"
                     f"   store alone {r['store_alone_settled_notes_per_s']:8.0f}   e2e / store = {r['settled_ratio']:.2f}"
                     if "settled_ratio" in r else "")
                  + (f"   broker's share of the cores: e2e {r['broker_core_share']['e2e']:.2f}, "
                     f"text only {r['broker_core_share']['text_only']:.2f}; worker CPU ms/note: e2e "
                     f"{r['worker_cpu_ms_per_note']['e2e']:.2f}, text only {r['worker_cpu_ms_per_note']['text_only']:.2f}"
                     if "broker_core_share" in r else ""),
                  file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
