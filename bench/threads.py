#!/usr/bin/env python3
"""Where one worker's threads spend a file run: CPU and run-queue wait per thread role, and the cores' busy share.

    python3 bench/threads.py BIN MTSAMPLES_CSV NOTES [NAME=VALUE ...]      (prints JSON, and a table on stderr)

Runs `BIN run` in file mode on NOTES non-empty MTSamples notes with the synthetic embedder (vectors hashed from token
ids, no model; docs/configuration.md) and the embedded store, NAME=VALUE pairs added to its environment (for
example CLINSTREAM__STORE__MAINTAIN_EVERY=0 to leave segment maintenance out, CLINSTREAM__PIPELINE__WORKERS=1).
While it runs, every thread's CPU time and the time it was runnable but waiting for a core (the kernel's
schedstat: `/proc/PID/task/TID/schedstat`) are read every 50 ms and kept per thread role (the name the worker gives
its threads: `clinstream` for the async runtime and the blocking pool, `clinstream-cpu-N` for the documents' CPU
pool, `clinstream-store-N` for an embedded shard's writer, `clinstream-embed` for the model thread,
`clinstream-maint` for a maintenance and `hnsw-build-N` for the graph builders it starts), beside the share of the
machine's cores that were busy (`/proc/stat`) over the same time. The notes/s are the run's own (`clinstream run`'s
summary). Linux only; standard library only."""
import json, os, re, shutil, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_e2e  # noqa: E402


def role(comm):
    # The kernel keeps 15 characters of a thread's name.
    for prefix, name in (("clinstream-stor", "store writers and their threads"), ("clinstream-embe", "model thread"),
                         ("clinstream-main", "maintenance"), ("hnsw-build-", "maintenance"),
                         ("clinstream-cpu-", "CPU pool")):
        if comm.startswith(prefix):
            return name
    return "runtime and blocking pool" if comm == "clinstream" else "other"


def threads(pid):
    """Each thread's role, CPU seconds and seconds runnable but waiting, by thread id (the names from
    kafka_e2e.thread_ticks, the times from the kernel's schedstat)."""
    seen = {}
    for tid, (name, _) in kafka_e2e.thread_ticks(pid).items():
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                cpu_ns, wait_ns = (int(x) for x in f.read().split()[:2])
        except OSError:
            continue
        seen[tid] = (role(name), cpu_ns / 1e9, wait_ns / 1e9)
    return seen


def main():
    bin_, csv_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    extra = dict(a.split("=", 1) for a in sys.argv[4:])
    work = tempfile.mkdtemp(prefix="clinstream-threads-")
    try:
        events = kafka_e2e.write_events(csv_path, n, os.path.join(work, "events.ndjson"))
        out = os.path.join(work, "out")
        env = dict(os.environ, CLINSTREAM__STORE__KIND="embedded", CLINSTREAM__STORE__PATH=os.path.join(out, "qdrant"),
                   CLINSTREAM__LOG__LEVEL="warn", CLINSTREAM__EMBED__EXECUTION_PROVIDER="synthetic",
                   CLINSTREAM__EMBED__ALLOW_SYNTHETIC="true")
        env.update(extra)
        p = subprocess.Popen([bin_, "run", "--no-progress", "--input", events, "--out", out], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen, first = {}, kafka_e2e.machine_jiffies()
        while p.poll() is None:
            seen.update(threads(p.pid))
            time.sleep(0.05)
        last = kafka_e2e.machine_jiffies()
        stdout, stderr = p.communicate()
        if p.returncode not in (0, 3):
            sys.exit(f"clinstream run: exit {p.returncode}: {stderr[-2000:]}")
        m = re.search(r"\(([\d.]+) notes/s", stdout)
        busy, total = last[0] - first[0], last[1] - first[1]
        roles = {}
        for name, cpu, wait in seen.values():
            r = roles.setdefault(name, {"threads": 0, "cpu_s": 0.0, "runqueue_wait_s": 0.0})
            r["threads"] += 1
            r["cpu_s"] = round(r["cpu_s"] + cpu, 2)
            r["runqueue_wait_s"] = round(r["runqueue_wait_s"] + wait, 2)
        result = {"notes": n, "notes_per_s": float(m.group(1)) if m else None,
                  "cores_busy": round(busy / max(total, 1), 3), "cores": os.cpu_count(), "env": extra,
                  "roles": roles}
        print(f"{result['notes_per_s']} notes/s, cores busy {result['cores_busy']:.2f} of {os.cpu_count()}",
              file=sys.stderr)
        for name, r in sorted(roles.items(), key=lambda x: -x[1]["cpu_s"]):
            print(f"  {name:32s} {r['threads']:3d} threads  cpu {r['cpu_s']:6.2f} s  runnable, waiting "
                  f"{r['runqueue_wait_s']:6.2f} s", file=sys.stderr)
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
