#!/usr/bin/env python3
"""Retrieval on the qa development set for the SEOS vector modes and the int8 model.

Usage: bench/qa_retrieval.py BIN QA_DIR CACHE_DIR [NAME=SEOS_VECTORS[:MODEL_FILE] ...]

Each entry runs `clinstream-lab eval qa --documents QA_DIR/documents.ndjson --questions QA_DIR/questions.jsonl
--budget 1024 --strategy clear,dense,hybrid --chunks index --json` with `chunking.seos_vectors` set to the entry's
mode (and `embed.model_file` when given): dense and hybrid search over the indexer's own chunks and vectors, CLEAR
as the service answers. The first entry is the reference (default entries: exact = groups, composed, composed with
model.int8.onnx). Prints JSON: per entry and strategy, evidence recall and answer accuracy, and each entry's
difference from the reference in points (100 x the difference of the fractions); a model variant also against the
same mode with the fp32 model. `within_1_point`: evidence recall of every strategy within 1 point of what the entry
is a cheaper option of (a cheaper method must stay within 1 point).
"""

import json
import os
import subprocess
import sys
import time


def main():
    binary, qa, cache = sys.argv[1], sys.argv[2], sys.argv[3]
    specs = sys.argv[4:] or ["exact=groups", "composed=composed", "composed-int8=composed:model.int8.onnx"]
    entries = []
    for spec in specs:
        name, _, rest = spec.partition("=")
        mode, _, model = rest.partition(":")
        env = dict(os.environ, CLINSTREAM__CHUNKING__STRATEGY="seos", CLINSTREAM__CHUNKING__SEOS_VECTORS=mode,
                   CLINSTREAM__LOG__LEVEL="warn")
        if model:
            env["CLINSTREAM__EMBED__MODEL_FILE"] = model
        start = time.perf_counter()
        p = subprocess.run([binary, "eval", "qa", "--documents", os.path.join(qa, "documents.ndjson"),
                            "--questions", os.path.join(qa, "questions.jsonl"), "--budget", "1024",
                            "--strategy", "clear,dense,hybrid", "--chunks", "index", "--json", "--cache-dir", cache],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            sys.exit(f"{name}: exit {p.returncode}: {p.stderr[-2000:]}")
        report = json.loads(p.stdout)
        entries.append({
            "name": name, "seos_vectors": mode, "model_file": model or "model.onnx",
            "seconds": time.perf_counter() - start, "documents": report["documents"],
            "strategies": {s["strategy"]: {"evidence_recall": s["evidence_recall"],
                                           "answer_accuracy": s["answer_accuracy"],
                                           "questions": s["questions"], "with_evidence": s["with_evidence"],
                                           "mean_tokens": s["mean_tokens"], "over_budget": s["over_budget"],
                                           "isolation_violations": s["isolation_violations"]}
                           for s in report["strategies"]},
        })
    print(json.dumps(compare(entries), indent=2))


def points(entry, against):
    return {k: {"evidence_recall": 100 * (v["evidence_recall"] - against["strategies"][k]["evidence_recall"]),
                "answer_accuracy": 100 * (v["answer_accuracy"] - against["strategies"][k]["answer_accuracy"])}
            for k, v in entry["strategies"].items() if k in against["strategies"]}


def compare(entries):
    """Each entry against the reference (the first: the exact method), and a model variant also against the same
    mode with the fp32 model (`against`): the cheaper option it is, beside what it replaces. `within_1_point`
    holds the evidence recall of every strategy to 1 point of `against` (the reference for a mode)."""
    ref = entries[0]
    for e in entries:
        e["vs_reference_points"] = points(e, ref)
        fp32 = next((x for x in entries if x["seos_vectors"] == e["seos_vectors"] and x["model_file"] == "model.onnx"),
                    None) if e["model_file"] != "model.onnx" else None
        against = fp32 or ref
        e["against"] = against["name"]
        e["vs_against_points"] = points(e, against)
        e["within_1_point"] = all(d["evidence_recall"] >= -1.0 for d in e["vs_against_points"].values())
    return {"reference": ref["name"], "budget_tokens": 1024, "entries": entries}


if __name__ == "__main__":
    main()
