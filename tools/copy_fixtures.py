#!/usr/bin/env python3
"""Copies the example events and test fixtures clinstream ships from a checkout of the shared data.

Usage: python3 tools/copy_fixtures.py SHARED_DIR
Writes examples/ (Synthea + HL7 US Core events) and tests/fixtures/ (the same sources plus MTSamples notes).
The product never reads SHARED_DIR; this script is run by hand when the fixtures are refreshed.
"""
import base64
import csv
import gzip
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# MTSamples notes for section snapshots: (note_id, short specialty name). Chosen for variety of layouts.
MTSAMPLES = None  # picked below: the first notes of 2,000-6,000 characters of each specialty in SPECIALTIES
SPECIALTIES = [
    "Allergy / Immunology", "Bariatrics", "Cardiovascular / Pulmonary", "Consult - History and Phy.",
    "Dermatology", "Discharge Summary", "Emergency Room Reports", "ENT - Otolaryngology", "Gastroenterology",
    "General Medicine", "Hematology - Oncology", "Nephrology", "Neurology", "Obstetrics / Gynecology",
    "Ophthalmology", "Orthopedic", "Pain Management", "Pediatrics - Neonatal", "Psychiatry / Psychology",
    "Radiology", "SOAP / Chart / Progress Notes", "Surgery", "Urology", "Sleep Medicine",
]


def slug(s: str) -> str:
    return "".join(c.lower() if c.isalnum() else "-" for c in s).strip("-").replace("--", "-")


def main() -> None:
    shared = Path(sys.argv[1])
    synthea = shared / "fhir/synthea-bulk-fhir-10pt"
    uscore = shared / "fhir/fhir-us-core-examples"

    # examples/: a few dozen Synthea notes, the US Core examples, and an XHTML report converted from the US Core
    # DiagnosticReport's presentedForm into a DocumentReference.
    ex = ROOT / "examples"
    (ex / "synthea").mkdir(parents=True, exist_ok=True)
    lines = (synthea / "DocumentReference.000.ndjson").read_text().splitlines()
    (ex / "synthea/DocumentReference.ndjson").write_text("\n".join(lines[:36]) + "\n")
    shutil.copy(synthea / "LICENSE", ex / "synthea/LICENSE")
    (ex / "us-core").mkdir(exist_ok=True)
    for name in ["DocumentReference-soap-note.json", "DocumentReference-episode-summary.json"]:
        shutil.copy(uscore / name, ex / "us-core" / name)
    report = json.loads((uscore / "DiagnosticReport-chest-xray-report.json").read_text())
    form = report["presentedForm"][0]
    docref = {
        "resourceType": "DocumentReference",
        "id": "chest-xray-report-xhtml",
        "status": "current",
        "type": report.get("code"),
        "category": report.get("category", [])[:1],
        "subject": report.get("subject"),
        "date": report.get("effectiveDateTime") or report.get("issued"),
        "content": [{"attachment": form}],
    }
    (ex / "us-core/DocumentReference-chest-xray-xhtml.json").write_text(json.dumps(docref, indent=2) + "\n")

    # tests/fixtures/
    fx = ROOT / "tests/fixtures"
    (fx / "synthea").mkdir(parents=True, exist_ok=True)
    (fx / "synthea/DocumentReference.sample.ndjson").write_text("\n".join(lines[:200]) + "\n")
    shutil.copy(synthea / "LICENSE", fx / "synthea/LICENSE")
    (fx / "us-core").mkdir(exist_ok=True)
    for f in uscore.glob("*.json"):
        shutil.copy(f, fx / "us-core" / f.name)
    shutil.copy(ex / "us-core/DocumentReference-chest-xray-xhtml.json", fx / "us-core/")

    mt = fx / "mtsamples"
    mt.mkdir(exist_ok=True)
    rows = list(csv.DictReader(gzip.open(shared / "corpora/mtsamples/mtsamples.csv.gz", "rt")))
    for spec in SPECIALTIES:
        row = next(r for r in rows if r["medical_specialty"].strip() == spec and 2000 <= len(r["transcription"]) <= 6000)
        (mt / f"{row['note_id']}-{slug(spec)}.txt").write_text(row["transcription"])
    print("copied examples and fixtures")


if __name__ == "__main__":
    main()
