#!/usr/bin/env python3
"""Start-up time of clinstream commands: `explain` on one short sentence (configuration, the built-in lexicon with
its automaton, ConText rules, CLEAR variables, one note through the text stages) and `--version` (the bare process),
median and minimum of RUNS runs each, entries alternating. Usage: startup.py RUNS name=BIN [name=BIN ...]; prints JSON.
"""
import json, statistics, subprocess, sys, time

runs = int(sys.argv[1])
entries = [a.split("=", 1) for a in sys.argv[2:]]
commands = {"explain": ["explain", "--text", "No chest pain. History of HTN on aspirin."], "version": ["--version"]}
times = {(n, c): [] for n, _ in entries for c in commands}
for _ in range(runs):
    for name, binary in entries:
        for c, args in commands.items():
            t = time.perf_counter()
            subprocess.run([binary, *args], stdout=subprocess.DEVNULL, check=True)
            times[(name, c)].append(time.perf_counter() - t)
out = {"runs": runs, "entries": []}
for name, _ in entries:
    e = {"name": name}
    for c in commands:
        e[f"{c}_median_ms"] = statistics.median(times[(name, c)]) * 1e3
        e[f"{c}_min_ms"] = min(times[(name, c)]) * 1e3
    out["entries"].append(e)
print(json.dumps(out, indent=2))
