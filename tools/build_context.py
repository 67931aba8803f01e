#!/usr/bin/env python3
"""Builds data/context/cues.tsv, the ConText cue list compiled into clinstream's assertion stage.

Sources (licences in data/LICENSES.md):
  * NegEx triggers and genConText history / hypothetical / experiencer triggers (NegEx kit, Apache-2.0)
      EVAL/negex/{negex_triggers.txt, genConText_*_triggers.txt}
  * medSpaCy ConText rules (MIT)            VOCAB/medspacy/resources/en/context_rules.json
  * negspacy termsets, en_clinical (MIT)    VOCAB/negspacy/termsets.json
  * pyConTextNLP lexical KB (Apache-2.0): negation, uncertainty, pseudo and conjunction entries only
      VOCAB/pycontextnlp/KB/lexical_kb_05042016.tsv
  * clinstream's curated cues (below), for the traps users of other tools report.

Rows: phrase (lower case, single spaces), category (negated | possible | differential | hypothetical | historical |
family | pseudo | terminate), direction (forward | backward | both | none), source. A phrase may appear in several
categories (e.g. "history" is historical, "family history" is family). When two sources give the same
(phrase, category), the first wins.

Usage: python3 tools/build_context.py VOCAB_DIR EVAL_DIR [OUT_TSV]
"""
import itertools
import json
import re
import sys
from pathlib import Path

NEGEX_TAGS = {
    "[PREN]": ("negated", "forward"),
    "[POST]": ("negated", "backward"),
    "[PREP]": ("possible", "forward"),
    "[POSP]": ("possible", "backward"),
    "[PSEU]": ("pseudo", "none"),
    "[CONJ]": ("terminate", "none"),
}

MEDSPACY_CATEGORY = {
    "NEGATED_EXISTENCE": "negated",
    "POSSIBLE_EXISTENCE": "possible",
    "HYPOTHETICAL": "hypothetical",
    "HISTORICAL": "historical",
    "FAMILY": "family",
}

# PROBABLE_EXISTENCE ("consistent with", "suggestive of") is affirmative: radiologists hedge diagnoses they make,
# and coders record them as present (measured on Open-i). It is not imported.
PYCONTEXT_CATEGORY = {
    "DEFINITE_NEGATED_EXISTENCE": "negated",
    "PROBABLE_NEGATED_EXISTENCE": "negated",
    "AMBIVALENT_EXISTENCE": "possible",
    "INDICATION": "possible",
    "PSEUDONEG": "pseudo",
    "CONJ": "terminate",
}

# Curated cues: (phrase, category, direction).
CURATED = [
    # Negation traps.
    ("negative for", "negated", "forward"),
    ("is negative for", "negated", "forward"),
    ("was negative for", "negated", "forward"),
    ("no evidence of", "negated", "forward"),
    ("no evidence for", "negated", "forward"),
    ("no signs of", "negated", "forward"),
    ("no sign of", "negated", "forward"),
    ("without evidence of", "negated", "forward"),
    ("free of", "negated", "forward"),
    ("clear of", "negated", "forward"),
    ("no", "negated", "forward"),
    ("not", "negated", "forward"),
    ("without", "negated", "forward"),
    ("denies", "negated", "forward"),
    ("denied", "negated", "forward"),
    ("nor", "negated", "forward"),
    ("neither", "negated", "forward"),
    # "X resolved": it was there (historical) and is not now (negated).
    ("resolved", "historical", "backward"),
    ("has resolved", "historical", "backward"),
    ("have resolved", "historical", "backward"),
    ("resolved", "negated", "backward"),
    ("resolved", "historical", "forward"),
    ("resolved", "negated", "forward"),
    ("has resolved", "negated", "backward"),
    ("have resolved", "negated", "backward"),
    # "No history of X" means X never happened: negated, not historical (these hide "history of").
    ("no history of", "negated", "forward"),
    ("no h/o", "negated", "forward"),
    ("no hx of", "negated", "forward"),
    ("no prior history of", "negated", "forward"),
    ("no past history of", "negated", "forward"),
    ("no previous history of", "negated", "forward"),
    ("no known history of", "negated", "forward"),
    ("no significant history of", "negated", "forward"),
    ("no personal history of", "negated", "forward"),
    ("denies history of", "negated", "forward"),
    ("denies any history of", "negated", "forward"),
    ("denied any history of", "negated", "forward"),
    ("denied history of", "negated", "forward"),
    ("denies a history of", "negated", "forward"),
    ("denies ever", "negated", "forward"),
    ("has never", "negated", "forward"),
    ("never used", "negated", "forward"),
    ("never smoked", "negated", "forward"),
    ("-ve for", "negated", "forward"),
    ("is -ve for", "negated", "forward"),
    ("neg for", "negated", "forward"),
    ("resolution of", "historical", "forward"),
    ("is absent", "negated", "backward"),
    ("are absent", "negated", "backward"),
    ("is not seen", "negated", "backward"),
    ("are not seen", "negated", "backward"),
    ("not seen", "negated", "backward"),
    ("not identified", "negated", "backward"),
    ("not present", "negated", "backward"),
    ("were ruled out", "negated", "backward"),
    ("was ruled out", "negated", "backward"),
    ("has been ruled out", "negated", "backward"),
    ("have been excluded", "negated", "backward"),
    ("has been excluded", "negated", "backward"),
    ("no longer", "negated", "forward"),
    ("never", "negated", "forward"),
    ("does not drink", "negated", "forward"),
    ("doesn't drink", "negated", "forward"),
    ("does not smoke", "negated", "forward"),
    ("doesn't smoke", "negated", "forward"),
    ("nonsmoker", "negated", "both"),
    ("non-smoker", "negated", "both"),
    ("denies any", "negated", "forward"),
    ("negative", "negated", "backward"),
    # Uncertainty.
    ("rule out", "possible", "forward"),
    ("to rule out", "possible", "forward"),
    ("r/o", "possible", "forward"),
    ("evaluate for", "possible", "forward"),
    ("evaluation for", "possible", "forward"),
    ("question of", "possible", "forward"),
    ("question", "possible", "forward"),
    ("is possible", "possible", "backward"),
    ("are possible", "possible", "backward"),
    ("also possible", "possible", "backward"),
    ("are also possible", "possible", "backward"),
    ("is also possible", "possible", "backward"),
    ("questionable", "possible", "forward"),
    ("possible", "possible", "forward"),
    ("possibly", "possible", "both"),
    ("not excluded", "possible", "backward"),
    # Concern is not a diagnosis: coders leave "concerning for pneumonia" uncoded (measured on Open-i).
    ("concern for", "possible", "forward"),
    ("concerning for", "possible", "forward"),
    ("raises concern for", "possible", "forward"),
    ("raising concern for", "possible", "forward"),
    ("suspicious for", "possible", "forward"),
    ("worrisome for", "possible", "forward"),
    ("suspected", "possible", "both"),
    ("correlate clinically for", "possible", "forward"),
    ("clinical correlation for", "possible", "forward"),
    ("differential diagnosis", "possible", "forward"),
    ("differential", "possible", "forward"),
    ("includes", "possible", "forward"),
    ("raising the possibility of", "possible", "forward"),
    ("other etiologies", "possible", "forward"),
    # A differential: uncertain; a variable may count it present (`differential_is_present`).
    ("versus", "differential", "both"),
    ("vs", "differential", "both"),
    # Hypothetical.
    ("if", "hypothetical", "forward"),
    ("return if", "hypothetical", "forward"),
    ("should he develop", "hypothetical", "forward"),
    ("should she develop", "hypothetical", "forward"),
    ("in case of", "hypothetical", "forward"),
    ("watch for", "hypothetical", "forward"),
    ("monitor for", "hypothetical", "forward"),
    ("risk of", "hypothetical", "forward"),
    ("at risk for", "hypothetical", "forward"),
    ("prophylaxis", "hypothetical", "backward"),
    # Historical.
    ("history of", "historical", "forward"),
    ("h/o", "historical", "forward"),
    ("hx of", "historical", "forward"),
    ("past history of", "historical", "forward"),
    ("status post", "historical", "forward"),
    ("s/p", "historical", "forward"),
    ("previous", "historical", "forward"),
    ("previously", "historical", "both"),
    ("prior", "historical", "forward"),
    ("former", "historical", "forward"),
    ("formerly", "historical", "both"),
    ("quit", "historical", "both"),
    ("quit smoking", "historical", "both"),
    ("quit", "negated", "both"),
    ("quit smoking", "negated", "both"),
    ("stopped", "historical", "both"),
    ("ex-smoker", "historical", "both"),
    ("in the past", "historical", "backward"),
    ("years ago", "historical", "backward"),
    ("remote", "historical", "forward"),
    ("resolving", "historical", "both"),
    ("healed", "historical", "forward"),
    # Family and other experiencers.
    ("family history", "family", "forward"),
    ("family history of", "family", "forward"),
    ("fh of", "family", "forward"),
    ("mother", "family", "both"),
    ("father", "family", "both"),
    ("brother", "family", "both"),
    ("sister", "family", "both"),
    ("son", "family", "both"),
    ("daughter", "family", "both"),
    ("grandmother", "family", "both"),
    ("grandfather", "family", "both"),
    ("aunt", "family", "both"),
    ("uncle", "family", "both"),
    ("cousin", "family", "both"),
    ("maternal", "family", "forward"),
    ("paternal", "family", "forward"),
    ("siblings", "family", "both"),
    # Pseudo-triggers: phrases that contain a cue but are not one.
    ("no increase", "pseudo", "none"),
    ("no change", "pseudo", "none"),
    ("not only", "pseudo", "none"),
    ("not necessarily", "pseudo", "none"),
    ("gram negative", "pseudo", "none"),
    ("without difficulty", "pseudo", "none"),
    ("no significant change", "pseudo", "none"),
    ("history of present illness", "pseudo", "none"),
    ("history and physical", "pseudo", "none"),
    ("past medical history", "pseudo", "none"),
    ("social history", "pseudo", "none"),
    ("family history of present illness", "pseudo", "none"),
    ("if needed", "pseudo", "none"),
    ("not been able", "pseudo", "none"),
    ("whether or not", "pseudo", "none"),
    ("not clear", "pseudo", "none"),
    ("not changed", "pseudo", "none"),
    ("has not changed", "pseudo", "none"),
    ("have not changed", "pseudo", "none"),
    ("not been changed", "pseudo", "none"),
    # Terminations.
    ("but", "terminate", "none"),
    ("positive for", "terminate", "none"),
    ("however", "terminate", "none"),
    ("although", "terminate", "none"),
    ("though", "terminate", "none"),
    ("except", "terminate", "none"),
    ("which", "terminate", "none"),
    ("aside from", "terminate", "none"),
    ("apart from", "terminate", "none"),
    ("secondary to", "terminate", "none"),
    ("due to", "terminate", "none"),
    ("presents with", "terminate", "none"),
    ("presented with", "terminate", "none"),
    ("complains of", "terminate", "none"),
    ("admitted for", "terminate", "none"),
    ("there is", "terminate", "none"),
    ("there are", "terminate", "none"),
    ("there has been", "terminate", "none"),
]

# Hedges built from their parts rather than listed one by one, so that no combination is missing: a modal before a
# verb of representation ("could include", "might reflect") and a finding that cannot be, or is hard to, exclude,
# whatever adverb of degree sits inside ("difficult to entirely exclude", "cannot be completely excluded").
MODALS = ["may", "might", "could"]
REPRESENTING = ["be", "represent", "reflect", "indicate", "include", "be due to", "be related to", "be secondary to"]
DEGREE = ["", "entirely", "completely", "totally", "fully", "definitely", "definitively", "confidently", "reliably"]
CANNOT = ["cannot", "can not", "can't", "could not", "couldn't", "may not", "might not"]
HARD_TO = ["difficult to", "hard to", "unable to", "not possible to", "impossible to"]
for _m, _v in itertools.product(MODALS, REPRESENTING):
    CURATED.append((f"{_m} {_v}", "possible", "forward"))
# A hedge before a phrase that links a finding to its reading ("possibly consistent with", "may be compatible
# with") hedges the reading: the longer cue hides the link, which alone ends a scope.
HEDGES = ["possibly", "may be", "might be", "could be"]
LINKS = ["consistent with", "compatible with"]
for _h, _link in itertools.product(HEDGES, LINKS):
    CURATED.append((f"{_h} {_link}", "possible", "forward"))
for _d in DEGREE:
    for _verb in ["exclude", "rule out"]:
        for _n in CANNOT[:5]:
            CURATED.append((f"{_n} {_d} {_verb}", "possible", "forward"))
        # "edema difficult to exclude" and "(it is) difficult to exclude edema": the longer phrase hides "is not".
        for _is, _n in itertools.product(["", "is", "it is"], HARD_TO):
            CURATED.append((f"{_is} {_n} {_d} {_verb}", "possible", "both"))
    for _done in ["excluded", "ruled out"]:
        for _n in CANNOT:
            CURATED.append((f"{_n} be {_d} {_done}", "possible", "backward"))
            CURATED.append((f"{_n} {_d} be {_done}", "possible", "backward"))
        CURATED.append((f"not {_d} {_done}", "possible", "backward"))

# Curated cues that a source gives but that misfire in notes: (phrase, category) to drop.
DROP = {
    ("history", "historical"),  # "history" alone: headers and "medical history" are not temporal cues
    ("deny", "negated"),
    ("patient", "family"),
    ("pt", "family"),
    ("clear", "negated"),  # pyConTextNLP's "clear" negates "clear emesis" and "clear fluid"
    ("no further", "pseudo"),  # "no further episodes of X" negates X
    ("borderline", "possible"),  # a severity ("borderline cardiomegaly" is cardiomegaly), not an uncertainty
}
# Probable-existence phrases: affirmative, whatever a source says.
PROBABLE = ["suggestive of", "compatible with", "consistent with", "probable", "probably", "likely", "most likely",
            "suggesting", "suggests", "suggest", "most consistent with", "compatible", "consistent", "presumed",
            "presumably", "favor", "favored", "appears to be", "felt to be", "thought to be", "represents", "indicative of",
            "is likely", "most suggestive of", "suggestive", "probable existence", "may represent early"]
for _p in PROBABLE:
    DROP.add((_p, "possible"))


def norm(s: str) -> str:
    return re.sub(r"\s+", " ", s.strip().lower())


def expand_tokens(pattern):
    """Expands a simple spaCy token pattern (LOWER / LOWER IN / OP ?) into literal phrases; None if not simple."""
    choices = []
    for tok in pattern:
        low = tok.get("LOWER")
        if isinstance(low, str):
            opts = [low]
        elif isinstance(low, dict) and "IN" in low:
            opts = list(low["IN"])
        else:
            return None
        if tok.get("OP") == "?":
            opts = opts + [""]
        elif "OP" in tok:
            return None
        if set(tok) - {"LOWER", "OP"}:
            return None
        choices.append(opts)
    combos = list(itertools.islice(itertools.product(*choices), 200))
    return [norm(" ".join(w for w in c if w)) for c in combos]


def main() -> None:
    vocab, evald = Path(sys.argv[1]), Path(sys.argv[2])
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(__file__).resolve().parent.parent / "data/context/cues.tsv"
    rows: dict[tuple[str, str], tuple[str, str]] = {}

    def add(phrase, category, direction, source):
        phrase = norm(phrase)
        if not phrase or (phrase, category) in DROP or len(phrase) > 60:
            return
        # Regex fragments (pyConTextNLP) are not phrases; `: no` is handled in code (it would hide a forward `no`).
        if any(c in phrase for c in "()|[]\\") or phrase.startswith(":"):
            return
        key = (phrase, category)
        if key in rows and rows[key][0] != direction and "none" not in (rows[key][0], direction):
            rows[key] = ("both", rows[key][1])  # forward in one source or row, backward in another
        else:
            rows.setdefault(key, (direction, source))

    for phrase, cat, direction in CURATED:
        add(phrase, cat, direction, "clinstream")
    # A phrase the curated list defines keeps only the curated meanings (sources disagree, e.g. on "r/o").
    curated = {norm(p) for p, _, _ in CURATED}
    add_source = add

    def add(phrase, category, direction, source):  # noqa: F811 — narrows the adder for the other sources
        if norm(phrase) not in curated:
            add_source(phrase, category, direction, source)

    for line in (evald / "negex/negex_triggers.txt").read_text().splitlines():
        parts = [p for p in line.split("\t") if p]
        if len(parts) == 2 and parts[1] in NEGEX_TAGS:
            add(parts[0], *NEGEX_TAGS[parts[1]], "negex")
    for name, cat in [("history", "historical"), ("hypothetical", "hypothetical"), ("experiencer", "family")]:
        for line in (evald / f"negex/genConText_{name}_triggers.txt").read_text().splitlines():
            parts = [p for p in line.split("\t") if p]
            if len(parts) != 2 or parts[1] not in NEGEX_TAGS:
                continue
            base_cat, direction = NEGEX_TAGS[parts[1]]
            if base_cat in ("pseudo", "terminate"):
                add(parts[0], base_cat, "none", "gencontext")
            else:
                add(parts[0], cat, direction, "gencontext")

    for rule in json.loads((vocab / "medspacy/resources/en/context_rules.json").read_text())["context_rules"]:
        cat = MEDSPACY_CATEGORY[rule["category"]]
        direction = {"FORWARD": "forward", "BACKWARD": "backward", "BIDIRECTIONAL": "both", "TERMINATE": "none"}[rule["direction"]]
        if direction == "none":
            cat = "terminate"
        phrases = expand_tokens(rule["pattern"]) if rule.get("pattern") else [rule["literal"]]
        for p in phrases or [rule["literal"]]:
            add(p, cat, direction, "medspacy")

    terms = json.loads((vocab / "negspacy/termsets.json").read_text())["en_clinical"]
    for key, cat, direction in [("pseudo_negations", "pseudo", "none"), ("preceding_negations", "negated", "forward"),
                                ("following_negations", "negated", "backward"), ("termination", "terminate", "none")]:
        for p in terms[key]:
            add(p, cat, direction, "negspacy")

    for i, line in enumerate((vocab / "pycontextnlp/KB/lexical_kb_05042016.tsv").read_text().splitlines()):
        if i == 0:
            continue
        cols = line.split("\t")
        if len(cols) < 4 or cols[1] not in PYCONTEXT_CATEGORY:
            continue
        cat = PYCONTEXT_CATEGORY[cols[1]]
        direction = {"forward": "forward", "backward": "backward", "bidirectional": "both"}.get(cols[3].strip().lower(), "both")
        if cat in ("pseudo", "terminate"):
            direction = "none"
        add(cols[0], cat, direction, "pycontextnlp")

    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        f.write("# clinstream ConText cues. Generated by tools/build_context.py; do not edit by hand.\n")
        f.write("# Sources and licences: data/LICENSES.md. Columns: phrase, category, direction, source.\n")
        for (phrase, cat), (direction, source) in sorted(rows.items()):
            f.write(f"{phrase}\t{cat}\t{direction}\t{source}\n")
    print(f"wrote {len(rows)} cues to {out}")


if __name__ == "__main__":
    main()
