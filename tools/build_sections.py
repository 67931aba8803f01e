#!/usr/bin/env python3
"""Builds data/sections/section_titles.tsv, the section-title synonym table compiled into clinstream.

Sources (see data/LICENSES.md):
  * medSpaCy section patterns (MIT)            VOCAB/medspacy/resources/en/section_patterns.json
  * NegBio radiology section titles (public domain, NCBI)  VOCAB/negbio-patterns/patterns/section_titles.txt
  * clinstream's own curated titles (below), written from the headers most frequent in real notes
    (MTSamples transcriptions, Synthea notes, US Core examples).

Each source title is mapped onto clinstream's canonical section names (src/stages/sections.rs
CANONICAL_SECTIONS). Rows: title (normalised: lower-case, single spaces, no trailing colon), canonical name,
kind (`section` starts a new section; `sub` is a body-system sub-heading that stays inside the open section),
and source. Later sources override earlier ones, so the curated list has the last word.

Usage: python3 tools/build_sections.py VOCAB_DIR [OUT_TSV]
"""
import json
import re
import sys
from pathlib import Path

# medSpaCy category -> canonical name.
MEDSPACY_CATEGORY = {
    "addendum": "addendum",
    "allergy": "allergies",
    "allergies": "allergies",
    "chief_complaint": "chief_complaint",
    "comments": "other",
    "patient_education": "patient_instructions",
    "diagnoses": "diagnoses",
    "family_history": "family_history",
    "history_of_present_illness": "history_of_present_illness",
    "hospital_course": "hospital_course",
    "imaging": "imaging",
    "labs_and_studies": "labs_and_studies",
    "medications": "medications",
    "neurological": "physical_exam",
    "observation_and_plan": "assessment_and_plan",
    "other": "other",
    "past_medical_history": "past_medical_history",
    "patient_instructions": "patient_instructions",
    "physical_exam": "physical_exam",
    "problem_list": "problem_list",
    "reason_for_examination": "reason_for_exam",
    "signature": "signature",
    "social_history": "social_history",
}

# NegBio radiology titles, by keyword (first match wins).
NEGBIO_KEYWORDS = [
    ("addendum", "addendum"),
    ("impression", "impression"),
    ("conclusion", "impression"),
    ("recommendation", "plan"),
    ("findings", "findings"),
    ("comparison", "comparison"),
    ("reference exam", "comparison"),
    ("indication", "reason_for_exam"),
    ("reason for", "reason_for_exam"),
    ("medical condition", "reason_for_exam"),
    ("clinical information", "reason_for_exam"),
    ("history", "reason_for_exam"),
    ("technique", "technique"),
    ("contrast", "technique"),
    ("examination", "technique"),
    ("view", "technique"),
    ("radiograph", "technique"),
    ("chest", "technique"),
]

# Curated titles: canonical -> titles. `sub` entries are listed separately.
CURATED = {
    "chief_complaint": ["chief complaint", "cc", "reason for visit", "reason for consultation", "reason for consult",
                        "reason for referral", "reason for admission", "presenting complaint", "complaint"],
    "history_of_present_illness": ["history of present illness", "history of the present illness", "hpi",
                                   "present illness", "brief history", "interval history", "history", "hx",
                                   "history present illness", "subjective/hpi"],
    "past_medical_history": ["past medical history", "pmh", "pmhx", "medical history", "past history",
                             "past psychiatric history", "psychiatric history", "birth history", "immunizations",
                             "past medical/surgical history", "past medical and surgical history",
                             "coronary risk factors", "identifying data"],
    "past_surgical_history": ["past surgical history", "psh", "surgical history", "previous surgery",
                              "past surgeries", "operations in the past"],
    "medications": ["medications", "current medications", "meds", "medication", "home medications",
                    "medications at home", "discharge medications", "admission medications", "medication history",
                    "prescriptions", "outpatient medications", "current meds", "medications on admission"],
    "allergies": ["allergies", "allergy", "drug allergies", "allergic reactions", "medication allergies",
                  "allergies to medicines", "allergies to medications"],
    "family_history": ["family history", "fh", "fhx", "family medical history", "family social history"],
    "social_history": ["social history", "sh", "shx", "personal history", "habits", "legal history",
                       "shx/fhx", "social and family history", "family and social history", "occupation", "substance use history", "sexual history"],
    "review_of_systems": ["review of systems", "ros", "systems review", "review of system"],
    "physical_exam": ["physical examination", "physical exam", "pe", "exam", "examination", "gen exam",
                      "mental status examination", "mental status exam", "neurological examination",
                      "neurologic examination", "examination findings", "on exam"],
    "subjective": ["subjective", "s"],
    "objective": ["objective", "o"],
    "assessment": ["assessment", "a", "clinical impression", "diagnostic impression"],
    "impression": ["impression", "conclusion", "conclusions", "interpretation", "summary"],
    "assessment_and_plan": ["assessment and plan", "assessment/plan", "a/p", "a&p", "impression and plan",
                            "impression/plan", "assessment & plan", "impression and recommendations",
                            "impression and recommendation", "medical decision making", "assessment and recommendations",
                            "plan and assessment"],
    "plan": ["plan", "plans", "p", "recommendations", "recommendation", "disposition", "followup", "follow-up",
             "follow up", "postoperative plan", "treatment", "treatment plan", "discussion", "plan of care",
             "discharge plan", "discharge condition", "condition on discharge"],
    "diagnoses": ["preoperative diagnosis", "postoperative diagnosis", "preoperative diagnoses",
                  "postoperative diagnoses", "preop diagnosis", "postop diagnosis", "pre-operative diagnosis",
                  "post-operative diagnosis", "discharge diagnoses", "discharge diagnosis", "admitting diagnosis",
                  "admitting diagnoses", "admission diagnosis", "admission diagnoses", "final diagnoses",
                  "final diagnosis", "diagnoses", "diagnosis", "preprocedure diagnosis", "postprocedure diagnosis",
                  "pre-procedure diagnosis", "post-procedure diagnosis", "primary diagnosis", "secondary diagnoses",
                  "principal diagnosis"],
    "procedures": ["procedure", "procedures", "procedure performed", "procedures performed", "operation",
                   "operations", "operation performed", "operations performed", "operative procedure",
                   "operative procedures", "title of operation", "name of operation", "title of procedure",
                   "title of procedures", "description of procedure", "description of the procedure",
                   "procedure in detail", "procedure detail", "procedure details", "details of the procedure",
                   "details of procedure", "operative procedure in detail", "description of operation",
                   "description of the operation", "operation in detail", "operative note", "procedure note",
                   "anesthesia", "complications", "estimated blood loss", "ebl", "blood loss", "specimens",
                   "specimen", "drains", "drain", "tubes and drains", "fluids", "fluids received", "urine output",
                   "tourniquet time", "total tourniquet time", "hemostasis", "counts", "operative technique",
                   "implants", "narrative", "delivery note", "summary of procedure", "name of procedure",
                   "materials used", "injectables"],
    "reason_for_exam": ["indications", "indication", "indications for procedure", "indication for surgery",
                        "indications for surgery", "indications for operation", "indication for operation",
                        "indication for procedure", "indications for the procedure", "indication for the procedure",
                        "reason for exam", "reason for examination", "reason for study", "clinical indication",
                        "clinical history", "question", "exam reason", "indication/clinical question",
                        "clinical question", "reason for study/indication"],
    "findings": ["findings", "operative findings", "intraoperative findings", "gross findings", "major findings",
                 "history and gross findings"],
    "hospital_course": ["hospital course", "course", "emergency department course", "ed course", "clinical course",
                        "course in the emergency department", "brief hospital course"],
    "labs_and_studies": ["laboratory data", "laboratory studies", "laboratory", "labs", "diagnostic studies",
                         "diagnostic data", "studies", "pathology", "ekg", "ecg", "data", "results",
                         "laboratory results", "lab results", "pertinent results", "nerve conduction studies",
                         "needle emg", "hemodynamic data", "initial studies", "significant lab and x-ray",
                         "significant laboratory data"],
    "imaging": ["imaging", "radiology", "radiologic studies", "radiologic data", "radiographic data", "x-rays", "x-ray"],
    "patient_instructions": ["discharge instructions", "instructions", "diet", "activity", "patient education",
                             "informed consent", "consent", "patient instructions"],
    "problem_list": ["problem list", "active problems", "active problem list", "problems"],
    "signature": ["electronic signature", "signed electronically by", "signed by", "dictated by"],
    "comparison": ["comparison", "comparisons", "comparison exam", "comparison study"],
    "technique": ["technique", "procedure technique", "specifications"],
    "addendum": ["addendum"],
    "other": ["service", "facility"],
}

# Body-system and organ sub-headings: they stay inside the open section (physical exam, ROS, radiology
# findings); only when no section is open do they open a physical_exam section.
SUBS = ["general", "general appearance", "appearance", "heent", "head", "eyes", "ears", "nose", "throat",
        "mouth", "oropharynx", "neck", "chest", "lungs", "heart", "cardiac", "cardiovascular", "cv", "cvs",
        "respiratory", "pulmonary", "abdomen", "gi", "gastrointestinal", "gu", "genitourinary", "genitalia",
        "back", "spine", "extremities", "skin", "dermatologic", "integumentary", "neurologic", "neurological",
        "neuro", "cns", "cn", "cranial nerves", "psychiatric", "psych", "musculoskeletal", "motor", "sensory",
        "reflexes", "gait", "coord", "coordination", "lymphatic", "lymphatics", "lymph nodes", "rectal",
        "pelvic", "breasts", "breast", "vital signs", "vitals", "constitutional", "endocrine", "hematologic",
        "hematologic/lymphatic", "heme/lymph", "allergic/immunologic", "mental status", "head and neck", "ent",
        "urological", "bp", "respirations", "hemodynamics", "axis i", "axis ii", "axis iii", "axis iv",
        "axis v", "face", "gu exam", "rectal exam", "lines and tubes", "lungs and pleura", "heart, mediastinum and hila", "bones and soft tissues",
        "upper abdomen", "pleura", "mediastinum", "bones", "soft tissues", "osseous structures",
        "cardiomediastinal silhouette", "right coronary artery", "left main coronary artery",
        "left anterior descending artery", "circumflex artery", "doppler", "2-d m-mode", "m-mode", "ms"]


def normalise(title: str) -> str:
    t = title.strip().rstrip(":").strip().lower()
    t = re.sub(r"\s+", " ", t)
    t = re.sub(r"\s*\((e?s)\)$", "", t)
    return t


def main() -> None:
    vocab = Path(sys.argv[1])
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parent.parent / "data/sections/section_titles.tsv"
    rows: dict[str, tuple[str, str, str]] = {}

    med = json.loads((vocab / "medspacy/resources/en/section_patterns.json").read_text())
    for rule in med["section_rules"]:
        lit = rule.get("literal")
        if not lit:
            continue
        canon = MEDSPACY_CATEGORY[rule["category"]]
        title = normalise(lit)
        if title in {"consult", "primary", "secondary"}:
            continue  # too generic to be a header on their own
        rows[title] = (canon, "section", "medspacy")

    for line in (vocab / "negbio-patterns/patterns/section_titles.txt").read_text().splitlines():
        if not line.strip():
            continue
        title = normalise(line)
        canon = next((c for k, c in NEGBIO_KEYWORDS if k in title), "other")
        rows[title] = (canon, "section", "negbio")

    for canon, titles in CURATED.items():
        for t in titles:
            rows[normalise(t)] = (canon, "section", "clinstream")
    for t in SUBS:
        rows[normalise(t)] = ("physical_exam", "sub", "clinstream")

    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        f.write("# clinstream section-title synonyms. Generated by tools/build_sections.py; do not edit by hand.\n")
        f.write("# Sources and licences: data/LICENSES.md. Columns: title, canonical, kind, source.\n")
        for title in sorted(rows):
            canon, kind, source = rows[title]
            f.write(f"{title}\t{canon}\t{kind}\t{source}\n")
    print(f"wrote {len(rows)} titles to {out}")


if __name__ == "__main__":
    main()
