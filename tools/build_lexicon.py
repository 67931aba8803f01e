#!/usr/bin/env python3
"""Builds clinstream's entity lexicon: data/lexicon/{concepts.tsv, terms.tsv, VERSION}.

Six entity kinds: medication, symptom, disease, procedure, lab, anatomy. Sources (licences in
data/lexicon/LICENSES.md; nothing GPL, non-commercial or share-alike):
  * Human Disease Ontology labels + ICD-10-CM / MeSH xrefs (CC0)      VOCAB/disease-ontology
  * Symptom Ontology names + synonyms (CC0)                             VOCAB/symptom-ontology/symp.obo
  * MeSH 2024 entry terms, tree numbers, pharmacological actions (NLM)  VOCAB/mesh-2024
      C (diseases; C23.888 signs and symptoms → symptom), F03 (mental disorders) → disease;
      D descriptors with a pharmacological action → medication;
      E01/E02/E04 → procedure, E01.370.225 (clinical laboratory techniques) → lab;
      A01–A10, A14, A15, A17 → anatomy.
  * ICD-10-PCS body parts (CMS, public domain) → anatomy                VOCAB/icd10-pcs-procedures
  * Vanderbilt and Stetson clinical abbreviation inventories (CC BY 4.0) VOCAB/clinical-abbreviations-metainventory-sources
      an abbreviation becomes a case-sensitive term of a concept when its dominant sense (≥ 70 % of uses)
      names a lexicon concept; only the case variants seen in notes are added (HTN, htn — not Htn); two-letter
      forms only in upper case, and never the ambiguous ones (PE, MS, PT, CA, ...).
  * curated lab tests and stop list (clinstream, below).

Variants: comma-inverted MeSH terms are un-inverted ("Effusion, Pleural" → "pleural effusion"); plural forms of the
last word are added for diseases, symptoms, procedures and anatomy. Terms of fewer than 3 characters (other than
case-sensitive abbreviations), numbers and the stop list are dropped.

Usage: python3 tools/build_lexicon.py VOCAB_DIR [OUT_DIR]
"""
import csv
import gzip
import hashlib
import re
import sys
from collections import defaultdict
from pathlib import Path

KINDS = ["medication", "symptom", "disease", "procedure", "lab", "anatomy"]

# Common lab tests (analytes and panels), curated for clinstream: (preferred, [synonyms]).
LABS = [
    ("hemoglobin", ["hemoglobin", "haemoglobin", "hgb", "hb"]),
    ("hematocrit", ["hematocrit", "hct"]),
    ("white blood cell count", ["white blood cell count", "white count", "wbc", "white blood cells", "leukocyte count"]),
    ("platelet count", ["platelet count", "platelets", "plt"]),
    ("complete blood count", ["complete blood count", "cbc"]),
    ("basic metabolic panel", ["basic metabolic panel", "bmp"]),
    ("comprehensive metabolic panel", ["comprehensive metabolic panel", "cmp"]),
    ("sodium", ["serum sodium", "sodium level"]),
    ("potassium", ["serum potassium", "potassium level"]),
    ("chloride", ["serum chloride"]),
    ("bicarbonate", ["serum bicarbonate", "bicarb", "co2 level"]),
    ("blood urea nitrogen", ["blood urea nitrogen", "bun"]),
    ("creatinine", ["creatinine", "serum creatinine", "cr level"]),
    ("glucose", ["blood glucose", "blood sugar", "serum glucose", "fingerstick glucose", "glucose level"]),
    ("hemoglobin a1c", ["hemoglobin a1c", "hba1c", "a1c", "glycated hemoglobin"]),
    ("troponin", ["troponin", "troponin i", "troponin t", "trop"]),
    ("brain natriuretic peptide", ["brain natriuretic peptide", "bnp", "nt-probnp", "probnp"]),
    ("international normalized ratio", ["international normalized ratio", "inr"]),
    ("prothrombin time", ["prothrombin time", "pt/inr"]),
    ("partial thromboplastin time", ["partial thromboplastin time", "ptt", "aptt"]),
    ("alanine aminotransferase", ["alanine aminotransferase", "alt", "sgpt"]),
    ("aspartate aminotransferase", ["aspartate aminotransferase", "ast", "sgot"]),
    ("alkaline phosphatase", ["alkaline phosphatase", "alk phos"]),
    ("bilirubin", ["bilirubin", "total bilirubin", "direct bilirubin", "t bili"]),
    ("albumin", ["serum albumin", "albumin level"]),
    ("lactate", ["lactate", "lactic acid", "serum lactate"]),
    ("thyroid stimulating hormone", ["thyroid stimulating hormone", "tsh"]),
    ("free t4", ["free t4", "free thyroxine"]),
    ("lipase", ["lipase", "serum lipase"]),
    ("amylase", ["amylase", "serum amylase"]),
    ("lipid panel", ["lipid panel", "lipid profile", "cholesterol panel"]),
    ("ldl cholesterol", ["ldl cholesterol", "ldl"]),
    ("hdl cholesterol", ["hdl cholesterol", "hdl"]),
    ("total cholesterol", ["total cholesterol", "cholesterol level"]),
    ("triglycerides", ["triglycerides", "triglyceride level"]),
    ("urinalysis", ["urinalysis", "ua", "urine analysis", "urine dipstick"]),
    ("urine culture", ["urine culture"]),
    ("blood culture", ["blood culture", "blood cultures"]),
    ("sputum culture", ["sputum culture"]),
    ("erythrocyte sedimentation rate", ["erythrocyte sedimentation rate", "esr", "sed rate"]),
    ("c-reactive protein", ["c-reactive protein", "crp"]),
    ("d-dimer", ["d-dimer", "d dimer"]),
    ("arterial blood gas", ["arterial blood gas", "abg", "blood gas"]),
    ("ferritin", ["ferritin", "serum ferritin"]),
    ("vitamin b12 level", ["vitamin b12 level", "b12 level"]),
    ("folate level", ["folate level"]),
    ("magnesium", ["serum magnesium", "magnesium level"]),
    ("calcium", ["serum calcium", "calcium level", "ionized calcium"]),
    ("phosphorus", ["serum phosphorus", "phosphate level"]),
    ("uric acid", ["uric acid", "serum uric acid"]),
    ("prostate specific antigen", ["prostate specific antigen", "psa"]),
    ("creatine kinase", ["creatine kinase", "cpk", "ck-mb"]),
    ("ammonia", ["ammonia level", "serum ammonia"]),
    ("anion gap", ["anion gap"]),
    ("mean corpuscular volume", ["mean corpuscular volume", "mcv"]),
    ("reticulocyte count", ["reticulocyte count"]),
    ("procalcitonin", ["procalcitonin"]),
    ("blood alcohol level", ["blood alcohol level", "blood alcohol", "serum alcohol"]),
    ("urine drug screen", ["urine drug screen", "urine toxicology", "drug screen", "tox screen", "uds"]),
    ("hiv test", ["hiv test", "hiv antibody"]),
    ("hepatitis panel", ["hepatitis panel"]),
    ("pregnancy test", ["pregnancy test", "urine hcg", "beta hcg", "serum hcg"]),
    ("liver function tests", ["liver function tests", "lfts", "lft"]),
    ("coagulation panel", ["coagulation panel", "coags"]),
    ("electrolytes", ["electrolytes", "lytes"]),
]

# Everyday short forms that the vocabularies only hold in their long form: (alias, concept id).
ALIASES = [
    ("diabetes", "DOID:9351"), ("type 2 diabetes", "DOID:9352"), ("type ii diabetes", "DOID:9352"),
    ("type 1 diabetes", "DOID:9744"), ("type i diabetes", "DOID:9744"), ("heart attack", "DOID:5844"),
    ("high blood pressure", "DOID:10763"), ("high cholesterol", "MESH:D006937"), ("kidney stones", "DOID:585"),
    ("kidney stone", "DOID:585"), ("heart failure", "DOID:6000"), ("chf", "DOID:6000"), ("copd", "DOID:3083"),
    ("afib", "DOID:0060224"), ("a-fib", "DOID:0060224"), ("gerd", "DOID:8534"), ("ckd", "DOID:784"),
    ("uti", "DOID:0080784"), ("cva", "MESH:D020521"),
]

# Common words that also are vocabulary terms; they never become entities on their own.
STOP = set("""
a an the and or of in on at to for with by as is are was were be been being it its this that these those
all any can cold lead may might must will shall should could would pt ms mr mrs dr no not yes left right
back face hand arm head neck side well good fine normal stable same new old other age aged set aid iron
tic tics fit fits fall falls lie lay sore sign signs test tests study studies exam examination range care
plan plans order orders control controls mass masses rest support follow patient patients man men woman
women child children baby male female person people family history medical clinic office room day days week
weeks month months year years time times date today tomorrow line lines tube tubes drain drains ice heat
light dark color colour red white blue black green yellow brown pink gray grey small large big high low
level levels rate rates ratio type types form forms use used using case cases report reports note notes
chart vital vitals data result results value values change changes process unit units area areas part
parts region regions site sites point points field fields grade grades stage stages degree degrees
dose doses drug drugs medicine medication medications pill pills tablet tablets agent agents therapy
therapies treatment treatments procedure procedures surgery operation operations method methods
technique techniques disease diseases disorder disorders syndrome syndromes condition conditions
symptom symptoms finding findings problem problems injury injuries infection infections pain pains
lab labs body system systems organ organs tissue tissues cell cells fluid fluids blood water air
weight height temperature pressure pulse rate respiration respirations breath breathing
discharge admission visit visits consult call calls feeling feelings said says stated states
bed beds chair wall walls cap caps band bands ring rings plate plates bridge crown crowns
base bases root roots stem stems trunk arch arches floor floors roof horn horns tail tails
fat fats hair
""".split())

# Abbreviations with several common senses in notes: never entities on their own.
AMBIGUOUS_ABBREVIATIONS = {"AD", "OP", "SB", "VL", "LE", "UE", "VS", "HD", "PE", "PT", "MS", "CP", "RV", "LV", "OA",
                           "ED", "ER", "OR", "IV", "IM", "SC", "PR", "BS", "CT", "MR", "PA", "PD", "RA", "SA", "CA", "FT", "OT", "TM"}

# Concepts whose names are too generic to be useful entities on their own (by preferred name, lower case).
GENERIC = {"disease", "syndrome", "signs and symptoms", "pathologic processes", "therapeutics", "diagnosis",
           "surgical procedures, operative", "anatomy", "body regions", "pharmacologic actions", "drug therapy",
           "chemically-induced disorders", "pathological conditions, signs and symptoms"}


def norm(s: str) -> str:
    return re.sub(r"\s+", " ", s.strip().lower())


def uninvert(term: str):
    parts = term.split(", ")
    if len(parts) == 2 and not re.search(r"[(),;\[\]]", parts[0] + parts[1]) and len(parts[1].split()) <= 3:
        return f"{parts[1]} {parts[0]}"
    return None


# A Roman numeral ("viii", "xii"): no plural or singular of it is a word.
ROMAN = re.compile(r"[ivxlc]+")


def plural(term: str, min_len: int = 4):
    words = term.split(" ")
    last = words[-1]
    if not last.isalpha() or len(last) < min_len or ROMAN.fullmatch(last):
        return None
    if last.endswith(("s", "x", "z", "ch", "sh")):
        if last.endswith(("itis", "osis", "sis", "us", "ss", "x", "z", "ch", "sh")):
            return None
        return None
    if last.endswith("y") and last[-2] not in "aeiou":
        p = last[:-1] + "ies"
    elif last.endswith(("ia", "emia", "algia")):
        return None
    else:
        p = last + "s"
    return " ".join(words[:-1] + [p])


def singular(term: str):
    """The singular of a body part named in the plural ("joints" -> "joint", "extremities" -> "extremity",
    "paranasal sinuses" -> "paranasal sinus"); None for a word that is no regular plural ("pelvis", "bronchus",
    "pons", "cortices")."""
    words = term.split(" ")
    last = words[-1]
    if not last.isalpha() or not last.endswith("s") or ROMAN.fullmatch(last):
        return None
    if last.endswith(("ss", "us", "is", "as", "os", "ys", "ices", "oses")):
        return None
    if last.endswith("ies"):
        one = last[:-3] + "y"
    elif last.endswith(("sses", "ches", "shes", "xes", "uses")):
        one = last[:-2]
    else:
        one = last[:-1]
    return " ".join(words[:-1] + [one]) if len(one) >= 4 else None


def mesh_kind(trees: list[str]):
    kinds = set()
    for t in trees:
        if t.startswith("C23.888"):
            kinds.add("symptom")
        elif t.startswith("C") and not t.startswith("C22"):
            kinds.add("disease")
        elif t.startswith("F03"):
            kinds.add("disease")
        elif t.startswith("E01.370.225"):
            kinds.add("lab")
        elif t.startswith(("E01", "E02", "E04")):
            kinds.add("procedure")
        elif t.startswith(("A01", "A02", "A03", "A04", "A05", "A06", "A07", "A08", "A09", "A10", "A14", "A15", "A17")):
            kinds.add("anatomy")
    for k in ["symptom", "lab", "disease", "procedure", "anatomy"]:
        if k in kinds:
            return k
    return None


def main() -> None:
    vocab = Path(sys.argv[1])
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parent.parent / "data/lexicon"
    concepts: dict[str, dict] = {}
    terms: dict[tuple[str, bool], tuple[str, str]] = {}  # (term, case_sensitive) -> (concept id, source)

    def concept(cid, kind, preferred, codes=()):
        c = concepts.setdefault(cid, {"kind": kind, "preferred": preferred, "codes": []})
        for code in codes:
            if code not in c["codes"]:
                c["codes"].append(code)
        return c

    def term(text, cid, source, case_sensitive=False, variants=True):
        t = text.strip() if case_sensitive else norm(text)
        if not t or (t in STOP and not case_sensitive) or t.isdigit():
            return
        if not case_sensitive and (len(t) < 3 or re.fullmatch(r"[\d\W]+", t)):
            return
        key = (t, case_sensitive)
        if key not in terms:
            terms[key] = (cid, source)
        if variants and not case_sensitive and concepts[cid]["kind"] in ("disease", "symptom", "procedure", "anatomy"):
            # A body part's name of one short word has its plural too ("leg", "legs"; "arm", "arms").
            short = concepts[cid]["kind"] == "anatomy" and " " not in t
            p = plural(t, 3 if short else 4)
            if p and (p, False) not in terms:
                terms[(p, False)] = (cid, source + "+plural")

    # MeSH descriptors: kind, entry terms.
    pharm = set()
    with gzip.open(vocab / "mesh-2024/mesh2024_pharmacological_actions.tsv.gz", "rt") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            pharm.add(row["DescriptorUI"])
    mesh_rows = defaultdict(list)
    mesh_meta = {}
    mesh_trees = {}
    with gzip.open(vocab / "mesh-2024/mesh2024_entry_terms.tsv.gz", "rt") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            ui = row["descriptor_ui"]
            trees = row["tree_numbers"].split(";") if row["tree_numbers"] else []
            kind = mesh_kind(trees)
            if kind is None and ui in pharm and any(t.startswith("D") for t in trees):
                kind = "medication"
            if kind is None:
                continue
            mesh_meta[ui] = (kind, row["descriptor_name"])
            mesh_trees[ui] = trees
            if row["lexical_tag"] in ("LAB", "TRD") and row["preferred"] != "Y":
                continue  # lab numbers and trade-name codes
            mesh_rows[ui].append(row["term"])

    # Disease Ontology: labels and xrefs; a DOID with a MeSH xref absorbs that descriptor.
    def read_do(name):
        rows = []
        with open(vocab / "disease-ontology" / name) as f:
            for row in csv.DictReader(f, delimiter="\t"):
                rows.append({k: v.strip('"') for k, v in row.items()})
        return rows

    icd = defaultdict(list)
    for r in read_do("ICD10inDO.tsv"):
        icd[r["id"]].append(r["xrefs"])
    mesh_of_do = defaultdict(list)
    do_of_mesh = {}
    for r in read_do("MESHinDO.tsv"):
        ui = r["xrefs"].removeprefix("MESH:")
        mesh_of_do[r["id"]].append(ui)
        do_of_mesh.setdefault(ui, r["id"])
    do_rows = read_do("HumanDO.tsv")
    do_by_label = {norm(r["label"]): r["id"] for r in do_rows}
    parents = defaultdict(set)
    for r in do_rows:
        parent = do_by_label.get(norm(r.get("subClassOf", "")))
        if parent and parent != r["id"]:
            parents[r["id"]].add(parent)
    for r in do_rows:
        did, label = r["id"], r["label"]
        if not did.startswith("DOID:") or norm(label) in GENERIC:
            continue
        codes = [did] + icd[did] + [f"MESH:{u}" for u in mesh_of_do[did]]
        concept(did, "disease", label, codes)
        term(label, did, "doid")

    for ui, entry_terms in mesh_rows.items():
        kind, name = mesh_meta[ui]
        if norm(name) in GENERIC:
            continue
        cid = do_of_mesh.get(ui) if kind == "disease" else None
        if cid is None or cid not in concepts:
            cid = f"MESH:{ui}"
            concept(cid, kind, name, [cid])
        for t in entry_terms:
            term(t, cid, "mesh")
            u = uninvert(t)
            if u:
                term(u, cid, "mesh+uninverted")

    # MeSH parents: the descriptor of each tree number's parent, mapped to the concept that absorbed it.
    tree_owner = {t: ui for ui, trees in mesh_trees.items() for t in trees}
    def mesh_concept(ui):
        did = do_of_mesh.get(ui)
        return did if did in concepts else (f"MESH:{ui}" if f"MESH:{ui}" in concepts else None)
    for ui, trees in mesh_trees.items():
        child = mesh_concept(ui)
        for t in trees:
            if "." in t:
                parent_ui = tree_owner.get(t.rsplit(".", 1)[0])
                parent = mesh_concept(parent_ui) if parent_ui else None
                if child and parent and parent != child:
                    parents[child].add(parent)

    # Symptom Ontology.
    cur = None
    for line in (vocab / "symptom-ontology/symp.obo").read_text().splitlines():
        if line == "[Term]":
            cur = {}
        elif cur is not None and line.startswith("id: "):
            cur["id"] = line[4:]
        elif cur is not None and line.startswith("name: "):
            cur["name"] = line[6:]
            concept(cur["id"], "symptom", cur["name"], [cur["id"]])
            term(cur["name"], cur["id"], "symp")
        elif cur is not None and line.startswith("synonym: ") and "name" in cur:
            m = re.match(r'synonym: "(.*)" (EXACT|RELATED|NARROW|BROAD)', line)
            if m and m.group(2) in ("EXACT", "RELATED"):
                term(m.group(1), cur["id"], "symp")
        elif line.startswith("is_obsolete: true") and cur is not None and "id" in cur:
            concepts.pop(cur["id"], None)

    # ICD-10-PCS body parts → anatomy.
    with open(vocab / "icd10-pcs-procedures/icd10pcs_body_parts.tsv") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            name = row["def_bp"].strip()
            if not name or "," in name or len(name.split()) > 4:
                continue
            cid = "PCS-BP:" + norm(name).replace(" ", "_")
            concept(cid, "anatomy", name.lower(), [])
            term(name, cid, "icd10pcs")

    for alias, cid in ALIASES:
        if cid and cid in concepts and (alias, False) not in terms:
            terms[(alias, False)] = (cid, "clinstream")

    # Curated labs (override: lab names that also are drugs, e.g. potassium, stay labs in lab phrasing).
    for preferred, syns in LABS:
        cid = "CS:lab:" + preferred.replace(" ", "_")
        concept(cid, "lab", preferred, [])
        for s in syns:
            if len(s) <= 4 and s.isalpha():
                terms[(s.upper(), True)] = (cid, "clinstream")
            else:
                key = (norm(s), False)
                terms[key] = (cid, "clinstream")

    # Abbreviations (Vanderbilt): dominant sense that names a concept → case-sensitive variants.
    by_term = {t: cid for (t, cs), (cid, _) in terms.items() if not cs}
    abbr_dir = vocab / "clinical-abbreviations-metainventory-sources"
    for name in ["vanderbilt_clinic_notes.txt", "vanderbilt_discharge_sums.txt"]:
        senses = defaultdict(list)
        with open(abbr_dir / name, encoding="utf-8", errors="replace") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                try:
                    senses[row["abbreviation"]].append((float(row["frequency"] or 0), row["sense"], row["variation"]))
                except (KeyError, ValueError):
                    continue
        for abbr, rows in senses.items():
            freq, sense, variation = max(rows)
            cid = by_term.get(norm(sense))
            if cid is None or freq < 0.7 or len(abbr) < 2:
                continue
            for v in variation.split("|"):
                form = v.rsplit("_", 1)[0].strip().strip(".,;:")
                if len(form) >= 2 and form.isascii() and (form, True) not in terms and form.lower() not in STOP and form.upper() not in AMBIGUOUS_ABBREVIATIONS and (len(form) > 2 or form.isupper()):
                    terms[(form, True)] = (cid, "vanderbilt")

    # Stetson sign-out inventory (no case variants recorded): single-sense abbreviations naming a concept, in
    # upper and lower case.
    with open(abbr_dir / "sense_distribution_448.txt", encoding="utf-8", errors="replace") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    stetson = defaultdict(list)
    for row in rows[1:] if rows and not rows[0][-1].replace(".", "").isdigit() else rows:
        if len(row) >= 3:
            try:
                stetson[row[0]].append((float(row[2]), row[1]))
            except ValueError:
                continue
    for abbr, senses in stetson.items():
        freq, sense = max(senses)
        cid = by_term.get(norm(sense))
        if cid is None or freq < 0.7 or len(abbr) < 2 or not abbr.isascii() or abbr.lower() in STOP:
            continue
        forms = {abbr.upper()} if len(abbr) < 3 else {abbr.upper(), abbr.lower()}
        for form in forms:
            if form in AMBIGUOUS_ABBREVIATIONS:
                continue
            if (form, True) not in terms:
                terms[(form, True)] = (cid, "stetson")

    terms = {k: v for k, v in terms.items() if v[0] in concepts}
    # Body parts named in the plural ("Joints", "Extremities") are named in the singular too, where no source
    # already gives that singular a meaning: "joint effusion" is the joint's. Last, so that no abbreviation takes a
    # sense from them.
    for (t, cs), (cid, source) in list(terms.items()):
        if cs or concepts[cid]["kind"] != "anatomy":
            continue
        one = singular(t)
        if one and (one, False) not in terms and one not in STOP:
            terms[(one, False)] = (cid, source + "+singular")

    used = {cid for cid, _ in terms.values()}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "concepts.tsv", "w") as f:
        f.write("# id\tkind\tpreferred\tcodes\tparents\n")
        for cid in sorted(used):
            c = concepts[cid]
            ps = "|".join(sorted(p for p in parents.get(cid, ()) if p in used))
            f.write(f"{cid}\t{c['kind']}\t{c['preferred']}\t{'|'.join(c['codes'])}\t{ps}\n")
    with open(out / "terms.tsv", "w") as f:
        f.write("# term\tconcept\tcase_sensitive\tsource\n")
        for (t, cs), (cid, source) in sorted(terms.items()):
            if "\t" in t or "\n" in t:
                continue
            f.write(f"{t}\t{cid}\t{1 if cs else 0}\t{source}\n")
    digest = hashlib.sha256((out / "concepts.tsv").read_bytes() + (out / "terms.tsv").read_bytes()).hexdigest()[:12]
    (out / "VERSION").write_text(f"clinstream-lexicon-1+{digest}\n")
    counts = defaultdict(int)
    for cid in used:
        counts[concepts[cid]["kind"]] += 1
    print(f"{len(used)} concepts {dict(counts)}, {len(terms)} terms, version {digest}")


if __name__ == "__main__":
    main()
