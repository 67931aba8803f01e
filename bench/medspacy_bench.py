#!/usr/bin/env python3
"""medSpaCy on the same notes as `clinstream-lab bench text`, single-threaded, for a side-by-side comparison.

Configured with spaCy's blank English pipeline (no downloaded model), medSpaCy's sectionizer, a TargetMatcher
holding the same target terms the worker uses for its CLEAR variables (exported by `clinstream-lab bench text
--targets-out`), and ConText. Run twice: sentences by PyRuSH (medSpaCy's default clinical splitter) and by spaCy's
plain sentencizer. PyRuSH's DEBUG logging (loguru) is switched off so medSpaCy is measured at its best.

Usage: medspacy_bench.py CSV TARGETS_JSON [LIMIT]  → JSON on stdout
"""
import csv
import json
import os
import sys
import time

from loguru import logger

logger.remove()  # PyRuSH logs at DEBUG through loguru by default
logger.add(sys.stderr, level="WARNING")

import medspacy  # noqa: E402
from medspacy.target_matcher import TargetRule  # noqa: E402

csv.field_size_limit(10**9)
path, targets_path = sys.argv[1], sys.argv[2]
limit = int(sys.argv[3]) if len(sys.argv) > 3 else None
notes = [r["transcription"] for r in csv.DictReader(open(path)) if r["transcription"].strip()][:limit]
targets = json.load(open(targets_path))


def build(sentences):
    if sentences == "pyrush":
        nlp = medspacy.load(medspacy_enable=["medspacy_pyrush", "medspacy_target_matcher", "medspacy_context"])
    else:
        nlp = medspacy.load(medspacy_enable=["medspacy_target_matcher", "medspacy_context"])
        nlp.add_pipe("sentencizer", first=True)
    nlp.add_pipe("medspacy_sectionizer")
    matcher = nlp.get_pipe("medspacy_target_matcher")
    seen = set()
    rules = []
    for t in targets:
        key = (t["literal"].lower(), t["category"])
        if key in seen:
            continue
        seen.add(key)
        rules.append(TargetRule(t["literal"], t["category"].upper()))
    matcher.add(rules)
    return nlp


out = {"notes": len(notes), "bytes": sum(len(n.encode()) for n in notes), "target_rules": len(targets), "runs": {}}
# MEDSPACY_RUNS=sentencizer runs one configuration only (a quick side-by-side outside `make bench`).
for sentences in os.environ.get("MEDSPACY_RUNS", "pyrush,sentencizer").split(","):
    nlp = build(sentences)
    nlp("Warm up: no pneumonia.")
    ents = negated = 0
    start = time.perf_counter()
    for doc in nlp.pipe(notes, n_process=1, batch_size=32):
        ents += len(doc.ents)
        negated += sum(1 for e in doc.ents if e._.is_negated)
    seconds = time.perf_counter() - start
    out["runs"][sentences] = {"seconds": seconds, "notes_per_s": len(notes) / seconds, "mentions": ents, "negated": negated}
print(json.dumps(out, indent=2))
