//! Question–entity alignment: which concepts a question is about, with a score and how each was found.
//!
//! Two routes, combined:
//! * **Lexicon**: the lexicon's phrase matcher on the question (with the CLEAR variables' synonyms). A match is
//!   certain (score 1) — "Does the patient have cardiomegaly?" names its concept.
//! * **Embedding**: the question and its content phrases (runs between question and function words) are embedded
//!   and compared with the embeddings of *labels*: every lexicon concept's preferred term, and every CLEAR
//!   variable's name, synonyms and its concepts' terms. A label's cosine is its target's score — "Is the lung
//!   collapsed?" reaches the pneumothorax variable through its term "collapsed lung" without a synonym for the
//!   question's wording.
//!
//! A target is a CLEAR variable (then its targets, decision rules and section filters apply) or a lexicon concept
//! (then the concept and its descendants). Kept: scores ≥ `min_score` and within `margin` of the best, at most
//! `max_targets`. The label vectors are the caller's (embedded once per model and lexicon version).

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};
use std::collections::HashMap;

use serde::Serialize;

use crate::lexicon::Lexicon;
use crate::stages::clear::Variable;

/// What a question can be aligned to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// A configured CLEAR variable (index into the pipeline's variables).
    Variable(usize),
    /// A lexicon concept (index into the lexicon's concepts).
    Concept(u32),
}

/// How a target was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Found {
    Lexicon,
    Embedding,
}

/// One aligned target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Aligned {
    #[serde(skip)]
    pub target: Target,
    /// `variable:<name>` or the concept id (`DOID:1673`).
    pub id: String,
    /// The variable's name or the concept's preferred term.
    pub label: String,
    pub score: f32,
    pub found: Found,
    /// An answer target (its mentions vote); otherwise context only.
    pub answer: bool,
}

/// The alignment of one question.
#[derive(Debug, Clone, Default)]
pub struct Alignment {
    /// Best first.
    pub aligned: Vec<Aligned>,
    /// Concept index → the score of the best target that reaches it (answer and context targets).
    pub concepts: HashMap<u32, f32>,
    /// The concepts of the answer targets: only their mentions vote.
    pub answer_concepts: std::collections::HashSet<u32>,
    /// The best-scored variable among the targets: its decision rules and section filters decide the answer.
    pub variable: Option<usize>,
}

impl Alignment {
    pub fn is_empty(&self) -> bool {
        self.concepts.is_empty()
    }
}

/// Alignment thresholds.
#[derive(Debug, Clone, Copy)]
pub struct AlignParams {
    pub min_score: f32,
    pub margin: f32,
    pub max_targets: usize,
    pub context_min_score: f32,
    pub max_context: usize,
    /// Score factor of a site (anatomy) context target.
    pub site_weight: f32,
}

impl Default for AlignParams {
    fn default() -> Self {
        AlignParams {
            min_score: 0.6,
            margin: 0.08,
            max_targets: 3,
            context_min_score: 0.45,
            max_context: 12,
            site_weight: 0.5,
        }
    }
}

/// Remembered sites: (target, threshold bits) → the nearest anatomy and its cosine.
type Sites = std::sync::Arc<std::sync::Mutex<HashMap<(Target, u32), Option<(Target, f32)>>>>;

/// The label texts and their unit-length embeddings.
#[derive(Debug, Clone, Default)]
pub struct LabelIndex {
    targets: Vec<Target>,
    texts: Vec<String>,
    dim: usize,
    /// `targets.len() × dim`, each row unit length.
    vectors: Vec<f32>,
    /// `nearest_to` answers per (target, threshold): a target's site never changes for one index.
    sites: Sites,
}

impl LabelIndex {
    /// The labels to embed, in order: each variable's name, synonyms and its root concepts' terms; each concept's
    /// preferred term. Deduplicated per target.
    pub fn labels(lexicon: &Lexicon, variables: &[Variable]) -> Vec<(Target, String)> {
        let mut out: Vec<(Target, String)> = Vec::new();
        let mut terms_of: HashMap<u32, Vec<&str>> = HashMap::new();
        for (term, concept) in lexicon.terms() {
            terms_of.entry(concept).or_default().push(term);
        }
        for (i, v) in variables.iter().enumerate() {
            let mut labels = vec![v.name().replace('_', " ")];
            labels.extend(v.def.synonyms.iter().cloned());
            for id in &v.def.concepts {
                if let Some(c) = lexicon.concept_index(id) {
                    labels.push(lexicon.concept(c).preferred.clone());
                    labels.extend(terms_of.get(&c).into_iter().flatten().map(|t| t.to_string()));
                }
            }
            let mut seen = std::collections::HashSet::new();
            for l in labels {
                let key = l.to_lowercase();
                if key.len() > 2 && seen.insert(key.clone()) {
                    out.push((Target::Variable(i), key));
                }
            }
        }
        for (c, concept) in lexicon.concepts().enumerate() {
            if !concept.id.starts_with("CS:variable:") {
                out.push((Target::Concept(c as u32), concept.preferred.to_lowercase()));
            }
        }
        out
    }

    /// An index over `labels` and their embeddings (same order); vectors are normalised here.
    pub fn new(labels: Vec<(Target, String)>, vectors: Vec<Vec<f32>>) -> LabelIndex {
        let dim = vectors.first().map_or(0, Vec::len);
        let mut flat = Vec::with_capacity(labels.len() * dim);
        for v in &vectors {
            flat.extend(unit(v));
        }
        let (targets, texts) = labels.into_iter().unzip();
        LabelIndex { targets, texts, dim, vectors: flat, sites: Default::default() }
    }

    pub fn len(&self) -> usize {
        self.targets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// `a` (rows × dim) times every label vector: rows × labels cosines (rows and labels unit length). A few rows
    /// (a question's phrases) stream the 22k label vectors once through a SIMD dot kernel (about 3 ms); many rows
    /// (a variable's labels) go through ndarray's blocked product (matrixmultiply), where packing the labels pays off.
    fn products(&self, a: &[f32], rows: usize) -> Vec<f32> {
        let n = self.targets.len();
        let mut out = vec![0.0f32; rows * n];
        if rows == 0 || n == 0 || self.dim == 0 {
            return out;
        }
        if rows <= 8 {
            dots(&self.vectors, self.dim, a, rows, &mut out);
            return out;
        }
        // rows × dim times (n × dim)ᵀ into rows × n: ndarray's safe general product, on matrixmultiply's kernels.
        let a = ArrayView2::from_shape((rows, self.dim), a).expect("rows × dim query vectors");
        let labels = ArrayView2::from_shape((n, self.dim), &self.vectors[..n * self.dim]).expect("n × dim labels");
        let mut c = ArrayViewMut2::from_shape((rows, n), &mut out).expect("rows × n products");
        general_mat_mul(1.0, &a, &labels.t(), 0.0, &mut c);
        out
    }

    /// Best cosine per target over all labels, for each of the phrase vectors (vectors of another length are
    /// ignored); only targets scoring at least `min` (`align` drops the rest anyway).
    fn scores(&self, phrase_vectors: &[Vec<f32>], min: f32) -> HashMap<Target, f32> {
        let mut into: HashMap<Target, f32> = HashMap::new();
        let q: Vec<f32> =
            phrase_vectors.iter().filter(|v| v.len() == self.dim && self.dim > 0).flat_map(|v| unit(v)).collect();
        let rows = q.len().checked_div(self.dim).unwrap_or(0);
        if rows == 0 {
            return into;
        }
        let s = self.products(&q, rows);
        let n = self.targets.len();
        for (i, t) in self.targets.iter().enumerate() {
            let best = (0..rows).map(|r| s[r * n + i]).fold(f32::MIN, f32::max);
            if best >= min {
                let e = into.entry(*t).or_insert(f32::MIN);
                *e = e.max(best);
            }
        }
        into
    }

    /// For each label of `target`, the nearest label of another target that `keep` admits; the best of those with
    /// its cosine (≥ `min`). Used to find an answer target's site (the anatomy nearest to its labels). Remembered
    /// per target and threshold (`keep` must be the same predicate for one index, as `align` uses it).
    fn nearest_to(&self, target: Target, keep: &dyn Fn(Target) -> bool, min: f32) -> Option<(Target, f32)> {
        if self.dim == 0 {
            return None;
        }
        let key = (target, min.to_bits());
        if let Some(found) = self.sites.lock().ok().and_then(|m| m.get(&key).copied()) {
            return found;
        }
        let own: Vec<usize> = (0..self.targets.len()).filter(|&i| self.targets[i] == target).collect();
        let a: Vec<f32> =
            own.iter().flat_map(|&i| self.vectors[i * self.dim..(i + 1) * self.dim].iter().copied()).collect();
        let s = self.products(&a, own.len());
        let n = self.targets.len();
        let mut best: Option<(Target, f32)> = None;
        for (j, &t) in self.targets.iter().enumerate() {
            if t == target || !keep(t) {
                continue;
            }
            for r in 0..own.len() {
                let x = s[r * n + j];
                if x >= min && best.is_none_or(|b| x > b.1) {
                    best = Some((t, x));
                }
            }
        }
        if let Ok(mut m) = self.sites.lock() {
            m.insert(key, best);
        }
        best
    }

    /// Finds (and remembers) the site of every variable now, so no request pays for it (`serve` calls this before
    /// it says it is ready).
    pub fn prepare_sites(&self, lexicon: &Lexicon, variables: &[Variable], params: AlignParams) {
        for i in 0..variables.len() {
            self.nearest_to(Target::Variable(i), &|t| is_anatomy(lexicon, t), params.context_min_score);
        }
    }

    /// The variables' embedding expansion (the ontology augmentation of CLEAR): for each variable, the lexicon
    /// concepts of its entity kind whose preferred term is nearest to any of the variable's labels (name, synonyms,
    /// its concepts' terms), with that cosine, best first — those ≥ `min`, at most `max` per variable, none already a
    /// target. `clinstream-lab vocab expand` writes them to data/variables/expansion.tsv; `clear.expansion_min_score`
    /// decides which the text stages use.
    pub fn expansions(
        &self,
        lexicon: &Lexicon,
        variables: &[Variable],
        min: f32,
        max: usize,
    ) -> Vec<(usize, u32, f32)> {
        if self.dim == 0 {
            return Vec::new();
        }
        let rows: Vec<&[f32]> = self.vectors.chunks_exact(self.dim).collect();
        let mut out = Vec::new();
        for (vi, v) in variables.iter().enumerate() {
            let kind = crate::lexicon::EntityKind::parse(&v.def.kind);
            let own: Vec<usize> =
                (0..self.targets.len()).filter(|&i| self.targets[i] == Target::Variable(vi)).collect();
            let mut found: Vec<(u32, f32)> = Vec::new();
            for (j, row) in rows.iter().enumerate() {
                let Target::Concept(c) = self.targets[j] else { continue };
                if v.targets().contains(&c) || Some(lexicon.concept(c).kind) != kind {
                    continue;
                }
                let best = own
                    .iter()
                    .map(|&i| rows[i].iter().zip(row.iter()).map(|(a, b)| a * b).sum::<f32>())
                    .fold(f32::MIN, f32::max);
                if best >= min {
                    found.push((c, best));
                }
            }
            found.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            found.dedup_by_key(|f| f.0);
            out.extend(found.into_iter().take(max).map(|(c, s)| (vi, c, s)));
        }
        out
    }

    /// The label text that gave a target its best score (for explanations).
    pub fn text(&self, i: usize) -> &str {
        &self.texts[i]
    }

    /// A key for the label vectors of one model and one label list: SHA-1 over `model` (the model's digest:
    /// `ModelInfo::digest`, so fp32, fp16 and int8 files of one model never share vectors) and every label with its
    /// target (the lexicon's concepts and the variables' labels). Stable across builds and Rust releases; a cache file
    /// made under another key is not used.
    pub fn cache_key(model: &str, labels: &[(Target, String)]) -> String {
        use sha1::Digest as _;
        let mut h = sha1::Sha1::new();
        h.update(model.as_bytes());
        h.update([0u8]);
        for (t, text) in labels {
            let (kind, n) = match t {
                Target::Variable(v) => (b'v', *v as u64),
                Target::Concept(c) => (b'c', u64::from(*c)),
            };
            h.update([kind]);
            h.update(n.to_le_bytes());
            h.update((text.len() as u64).to_le_bytes());
            h.update(text.as_bytes());
        }
        h.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads vectors written by `save` for exactly these labels; `None` when the file is missing or was made for
    /// other labels or another model.
    pub fn load(path: &std::path::Path, key: &str, labels: Vec<(Target, String)>) -> Option<LabelIndex> {
        let bytes = std::fs::read(path).ok()?;
        let (head, body) = bytes.split_at(bytes.iter().position(|b| *b == b'\n')? + 1);
        let head = std::str::from_utf8(head).ok()?.trim();
        let mut parts = head.split(' ');
        let (k, n, dim) = (parts.next()?, parts.next()?.parse::<usize>().ok()?, parts.next()?.parse::<usize>().ok()?);
        if k != key || n != labels.len() || body.len() != n * dim * 4 {
            return None;
        }
        let vectors = body.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let (targets, texts) = labels.into_iter().unzip();
        Some(LabelIndex { targets, texts, dim, vectors, sites: Default::default() })
    }

    /// Writes the (normalised) vectors under `key`, atomically (temporary file, then rename).
    pub fn save(&self, path: &std::path::Path, key: &str) -> std::io::Result<()> {
        let mut out = format!("{key} {} {}\n", self.targets.len(), self.dim).into_bytes();
        for x in &self.vectors {
            out.extend_from_slice(&x.to_le_bytes());
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, out)?;
        std::fs::rename(tmp, path)
    }
}

fn is_anatomy(lexicon: &Lexicon, t: Target) -> bool {
    match t {
        Target::Concept(c) => lexicon.concept(c).kind == crate::lexicon::EntityKind::Anatomy,
        Target::Variable(_) => false,
    }
}

/// `out[r * n + i]` = dot(row i of `labels`, row r of `queries`), rows of `dim`; with AVX2 and FMA when the CPU has
/// them (checked once at run time), plain code otherwise.
fn dots(labels: &[f32], dim: usize, queries: &[f32], rows: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the features the function is compiled for (checked just above).
            unsafe { dots_avx2(labels, dim, queries, rows, out) };
            return;
        }
    }
    dots_portable(labels, dim, queries, rows, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2(labels: &[f32], dim: usize, queries: &[f32], rows: usize, out: &mut [f32]) {
    dots_portable(labels, dim, queries, rows, out);
}

/// Written so the compiler vectorises it (16 independent lanes), in whatever instruction set the caller enables.
#[inline(always)]
fn dots_portable(labels: &[f32], dim: usize, queries: &[f32], rows: usize, out: &mut [f32]) {
    let n = labels.len() / dim;
    for (i, row) in labels.chunks_exact(dim).enumerate() {
        for r in 0..rows {
            let q = &queries[r * dim..(r + 1) * dim];
            let mut acc = [0.0f32; 16];
            let (rc, qc) = (row.chunks_exact(16), q.chunks_exact(16));
            let tail: f32 = rc.remainder().iter().zip(qc.remainder()).map(|(a, b)| a * b).sum();
            for (a, b) in rc.zip(qc) {
                for k in 0..16 {
                    acc[k] += a[k] * b[k];
                }
            }
            out[r * n + i] = acc.iter().sum::<f32>() + tail;
        }
    }
}

fn unit(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter().map(|x| x / n).collect()
}

/// Question and function words that never carry the entity.
const FUNCTION_WORDS: &[&str] = &[
    "a",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "been",
    "by",
    "can",
    "could",
    "did",
    "do",
    "does",
    "for",
    "from",
    "had",
    "has",
    "have",
    "he",
    "her",
    "his",
    "how",
    "in",
    "is",
    "it",
    "its",
    "of",
    "on",
    "or",
    "patient",
    "patients",
    "pt",
    "record",
    "show",
    "shows",
    "she",
    "signs",
    "sign",
    "the",
    "their",
    "there",
    "they",
    "this",
    "to",
    "was",
    "were",
    "what",
    "when",
    "which",
    "who",
    "with",
    "any",
    "evidence",
    "documented",
    "history",
    "currently",
    "current",
    "suffer",
    "suffering",
    "experience",
    "experiencing",
    "present",
    "diagnosed",
    "find",
    "findings",
    "finding",
    "noted",
    "note",
    "notes",
    "mention",
    "mentioned",
    "report",
    "reported",
    "seen",
];

/// The phrases of a question to embed: the question itself, and each run of content words between function words
/// (lower-cased, punctuation removed); deduplicated, the question first.
pub fn phrases(question: &str) -> Vec<String> {
    let mut out = vec![question.trim().to_string()];
    let mut run: Vec<String> = Vec::new();
    let mut runs = Vec::new();
    for word in question.split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '\'')) {
        let w = word.trim_matches(|c: char| c == '-' || c == '\'').to_lowercase();
        if w.is_empty() {
            continue;
        }
        if FUNCTION_WORDS.contains(&w.as_str()) {
            if !run.is_empty() {
                runs.push(run.join(" "));
                run.clear();
            }
        } else {
            run.push(w);
        }
    }
    if !run.is_empty() {
        runs.push(run.join(" "));
    }
    // All content words together too ("fluid pleural space").
    let all: Vec<String> = runs.iter().flat_map(|r| r.split(' ').map(str::to_string)).collect();
    if runs.len() > 1 {
        runs.push(all.join(" "));
    }
    for r in runs {
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out
}

/// Aligns a question (`phrase_vectors`: the embeddings of `phrases(question)`, same order).
///
/// Scores: a lexicon match that spans a whole content phrase ("cardiomegaly", "pleural effusion") or a compound's
/// gloss ("air in the pleural space", the lexicon's glosses) is certain (1);
/// a match inside a longer phrase ("lung" in "lung collapsed") only makes its target a candidate, scored by
/// embedding like every other label. Answer targets: scores ≥ `min_score` within `margin` of the best, at most
/// `max_targets`, anatomy only when nothing else qualifies (a body part is where, not what), and never a concept
/// found by embedding whose label shares with the question only the words that name a body part. Context targets: the
/// answer targets plus the next candidates ≥ `context_min_score` (at most `max_context`), so the windows also
/// cover what the question's words point at without being the answer ("the lungs are clear").
pub fn align(
    question: &str,
    phrase_vectors: &[Vec<f32>],
    lexicon: &Lexicon,
    variables: &[Variable],
    index: &LabelIndex,
    present: Option<&std::collections::HashSet<u32>>,
    params: AlignParams,
) -> Alignment {
    let by_embedding = index.scores(phrase_vectors, params.context_min_score);
    let mut scores: HashMap<Target, (f32, Found)> =
        by_embedding.into_iter().map(|(t, s)| (t, (s, Found::Embedding))).collect();
    let variable_of = |c: u32| variables.iter().position(|v| v.targets().contains(&c));
    let runs: Vec<String> = phrases(question).into_iter().skip(1).collect();
    // A compound said in plain words ("air in the pleural space") names its concept as surely as the term does.
    let glossed = lexicon.glosses().map(|g| g.find(question, 0, question.len())).unwrap_or_default();
    // Targets made certain by a gloss alone (no term of theirs spans a phrase of the question).
    let mut by_gloss: Vec<Target> = Vec::new();
    let mut by_term: Vec<Target> = Vec::new();
    let matches = lexicon.find(question);
    for (m, gloss) in matches.iter().cloned().map(|m| (m, false)).chain(glossed.into_iter().map(|m| (m, true))) {
        let target = variable_of(m.concept).map_or(Target::Concept(m.concept), Target::Variable);
        let matched = question[m.start..m.end].to_lowercase();
        let whole = gloss || runs.contains(&matched);
        match (gloss, whole) {
            (true, _) => by_gloss.push(target),
            (false, true) => by_term.push(target),
            (false, false) => {}
        }
        let entry = scores.entry(target).or_insert((0.0, Found::Lexicon));
        entry.1 = Found::Lexicon;
        entry.0 = if whole { 1.0 } else { entry.0.max(params.context_min_score) };
    }
    let mut ranked: Vec<(Target, f32, Found)> = scores.into_iter().map(|(t, (s, f))| (t, s, f)).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.retain(|r| r.1 >= params.context_min_score);
    let is_anatomy = |t: Target| is_anatomy(lexicon, t);
    // The question's words that name a body part ("chest" in "a chest infection"). A concept found by embedding whose
    // label meets the question in those words alone ("chest pain") is near it for the where, not the what: it is
    // context, never the answer.
    let site_terms: std::collections::HashSet<u32> = matches
        .iter()
        .filter(|m| is_anatomy(Target::Concept(m.concept)))
        .flat_map(|m| crate::store::bm25::terms(&question[m.start..m.end]))
        .collect();
    let question_terms: std::collections::HashSet<u32> = if site_terms.is_empty() {
        Default::default()
    } else {
        crate::store::bm25::terms(question).into_iter().collect()
    };
    let by_site_alone = |r: &(Target, f32, Found)| match *r {
        (Target::Concept(c), _, Found::Embedding) if !site_terms.is_empty() => {
            let shared: Vec<u32> = crate::store::bm25::terms(&lexicon.concept(c).preferred)
                .into_iter()
                .filter(|t| question_terms.contains(t))
                .collect();
            !shared.is_empty() && shared.iter().all(|t| site_terms.contains(t))
        }
        _ => false,
    };
    let answerable: Vec<&(Target, f32, Found)> = {
        let eligible: Vec<_> = ranked.iter().filter(|r| !by_site_alone(r)).collect();
        let findings: Vec<_> = eligible.iter().copied().filter(|r| !is_anatomy(r.0)).collect();
        if findings.first().is_some_and(|r| r.1 >= params.min_score) { findings } else { eligible }
    };
    let best = answerable.first().map_or(0.0, |r| r.1);
    let mut primary: Vec<Target> = answerable
        .iter()
        .filter(|r| r.1 >= params.min_score && r.1 >= best - params.margin)
        .take(params.max_targets)
        .map(|r| r.0)
        .collect();
    // The entities the patient's notes mention (all, when the caller gives none).
    let mentioned = |t: Target| match (t, present) {
        (_, None) => true,
        (Target::Concept(c), Some(p)) => p.contains(&c),
        (Target::Variable(i), Some(p)) => variables[i].targets().iter().any(|c| p.contains(c)),
    };
    // A description in plain words matched to a compound by its gloss ("fluid in the pleural space": hydro·thorax)
    // is certain of the construction, not of which finding the reports name it by. Where the patient's notes
    // mention none of the answer targets, each was found by a gloss alone and none is a configured variable, the
    // nearest configured variable by embedding that the notes do mention (≥ `min_score`) answers in their place.
    // A gloss that lands on a variable ("air in the pleural space": pneumothorax) is that variable's question: notes
    // that never name it answer "not mentioned", whatever else they name.
    let unmentioned_concept = |t: Target| match (t, present) {
        (Target::Concept(c), Some(p)) => !lexicon.with_descendants(&[c]).iter().any(|d| p.contains(d)),
        _ => false,
    };
    if !primary.is_empty()
        && primary.iter().all(|&t| by_gloss.contains(&t) && !by_term.contains(&t) && unmentioned_concept(t))
        && let Some(v) = ranked.iter().find(|r| {
            matches!(r.0, Target::Variable(_)) && r.2 == Found::Embedding && r.1 >= params.min_score && mentioned(r.0)
        })
    {
        primary.push(v.0);
    }
    // A configured variable among them is the curated form of the question's entity (its targets, synonyms and
    // rules): it answers alone rather than beside broad neighbours ("lung disease" and all its descendants).
    if primary.iter().any(|t| matches!(t, Target::Variable(_))) {
        primary.retain(|t| matches!(t, Target::Variable(_)));
    }
    let mut chosen: Vec<(Target, f32, Found)> = ranked.iter().filter(|r| primary.contains(&r.0)).copied().collect();
    // Context: what the question's words name (lexicon matches) always, then the nearest other labels.
    chosen.extend(ranked.iter().filter(|r| !primary.contains(&r.0) && r.2 == Found::Lexicon).copied());
    let named = chosen.len();
    // The nearest other labels among the entities the patient's notes mention (CLEAR on FHIR notes aligns the
    // question with the patient's own entities), or among all when the caller gives none.
    chosen.extend(
        ranked
            .iter()
            .filter(|r| !primary.contains(&r.0) && r.2 == Found::Embedding && mentioned(r.0))
            .take(params.max_context)
            .copied(),
    );
    debug_assert!(named <= chosen.len());
    // The site of each answer target (its labels' nearest anatomy: the heart for cardiomegaly, the lung for
    // pneumonia), as context at a lower score: a report that speaks of the site without naming the finding ("heart
    // size normal", "the lungs are clear") is evidence for the answer "no".
    for t in primary.clone() {
        if let Some((site, cos)) = index.nearest_to(t, &is_anatomy, params.context_min_score)
            && !chosen.iter().any(|c| c.0 == site)
        {
            chosen.push((site, cos * params.site_weight, Found::Embedding));
        }
    }

    let mut alignment = Alignment::default();
    for (target, score, found) in chosen {
        let answer = primary.contains(&target);
        let (id, label, reached): (String, String, Vec<u32>) = match target {
            Target::Variable(i) => {
                let v = &variables[i];
                if answer {
                    alignment.variable.get_or_insert(i);
                }
                (format!("variable:{}", v.name()), v.name().to_string(), v.targets().iter().copied().collect())
            }
            Target::Concept(c) => {
                let concept = lexicon.concept(c);
                // Descendants only for a concept the question names; a neighbour by embedding stands for itself.
                let reached = if found == Found::Lexicon {
                    lexicon.with_descendants(&[c]).into_iter().collect()
                } else {
                    vec![c]
                };
                (concept.id.clone(), concept.preferred.clone(), reached)
            }
        };
        for c in reached {
            let s = alignment.concepts.entry(c).or_insert(0.0);
            *s = s.max(score);
            if answer {
                alignment.answer_concepts.insert(c);
            }
        }
        alignment.aligned.push(Aligned { target, id, label, score, found, answer });
    }
    alignment
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dot_kernel_and_the_blocked_product_agree() {
        let dim = 40; // not a multiple of 16: the tail counts too
        let n = 300;
        let mut x = 1u32;
        let mut next = || {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let labels: Vec<(Target, String)> = (0..n).map(|i| (Target::Concept(i as u32), format!("l{i}"))).collect();
        let vectors: Vec<Vec<f32>> = (0..n).map(|_| (0..dim).map(|_| next()).collect()).collect();
        let index = LabelIndex::new(labels, vectors);
        let queries: Vec<f32> = (0..9 * dim).map(|_| next()).collect();
        let blocked = index.products(&queries, 9); // more than 8 rows: matrixmultiply
        for rows in [1usize, 3, 8] {
            let mut kernel = vec![0.0; rows * n];
            dots(&index.vectors, dim, &queries[..rows * dim], rows, &mut kernel);
            for r in 0..rows {
                for i in 0..n {
                    assert!((kernel[r * n + i] - blocked[r * n + i]).abs() < 1e-5, "row {r} label {i}");
                }
            }
            assert_eq!(index.products(&queries[..rows * dim], rows), kernel);
        }
    }

    #[test]
    fn label_vectors_round_trip_through_the_cache_only_for_the_same_labels() {
        let labels = vec![(Target::Concept(1), "a".to_string()), (Target::Variable(0), "b".to_string())];
        let index = LabelIndex::new(labels.clone(), vec![vec![3.0, 4.0], vec![0.0, 2.0]]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("labels.bin");
        let key = LabelIndex::cache_key("m", &labels);
        index.save(&path, &key).unwrap();
        let back = LabelIndex::load(&path, &key, labels.clone()).unwrap();
        assert_eq!(back.vectors, [0.6, 0.8, 0.0, 1.0]);
        let other = vec![(Target::Concept(1), "a".to_string()), (Target::Variable(0), "c".to_string())];
        assert_ne!(LabelIndex::cache_key("m", &other), key);
        assert!(LabelIndex::load(&path, &LabelIndex::cache_key("m", &other), other).is_none());
        assert_ne!(LabelIndex::cache_key("other-model", &labels), key);
    }

    #[test]
    fn phrases_are_the_question_and_its_content_runs() {
        assert_eq!(
            phrases("Is there fluid in the pleural space?"),
            ["Is there fluid in the pleural space?", "fluid", "pleural space", "fluid pleural space"]
        );
        assert_eq!(phrases("Does the patient have cardiomegaly?")[1..], ["cardiomegaly"]);
    }

    fn lexicon_and_variables() -> (Lexicon, Vec<Variable>) {
        let s = crate::config::Settings::load_from(None, Some(Default::default())).unwrap();
        let base = Lexicon::builtin();
        crate::stages::clear::compile(&s.clear.variables, 150, 1024, &base).unwrap()
    }

    /// Toy embeddings: one axis per label text, so a phrase aligns to the labels equal to it.
    fn toy_index(labels: &[(Target, String)], axis_of: &dyn Fn(&str) -> usize) -> LabelIndex {
        let vectors = labels
            .iter()
            .map(|(_, t)| {
                let mut v = vec![0.0; 8];
                v[axis_of(t)] = 1.0;
                v
            })
            .collect();
        LabelIndex::new(labels.to_vec(), vectors)
    }

    #[test]
    fn a_compound_in_plain_words_aligns_like_its_term() {
        let (lex, vars) = lexicon_and_variables();
        let glosses = crate::lexicon::gloss::Glosses::builtin(&lex);
        let glossed = lex.with_extra(&[]).unwrap().with_glosses(glosses);
        let ptx = vars.iter().position(|v| v.name() == "pneumothorax").unwrap();
        let question = "Is there air in the pleural space?";
        let a = align(question, &[], &glossed, &vars, &LabelIndex::default(), None, AlignParams::default());
        assert_eq!(a.variable, Some(ptx), "{:?}", a.aligned);
        assert_eq!((a.aligned[0].score, a.aligned[0].found, a.aligned[0].answer), (1.0, Found::Lexicon, true));
        // Without the glosses the question names no finding.
        let b = align(question, &[], &lex, &vars, &LabelIndex::default(), None, AlignParams::default());
        assert_eq!(b.variable, None, "{:?}", b.aligned);
    }

    #[test]
    fn a_gloss_the_notes_never_name_yields_to_the_nearest_variable_they_mention() {
        // The pleural effusion variable without its hand-written phrasings: "fluid in the pleural space" is then
        // found only as the gloss of hydro·thorax, a concept of its own.
        let s = crate::config::Settings::load_from(None, Some(Default::default())).unwrap();
        let mut defs = s.clear.variables.clone();
        defs.iter_mut().filter(|d| d.name == "pleural_effusion").for_each(|d| d.synonyms.clear());
        let (lex, vars) = crate::stages::clear::compile(&defs, 150, 1024, &Lexicon::builtin()).unwrap();
        let glossed = lex.with_extra(&[]).unwrap().with_glosses(crate::lexicon::gloss::Glosses::builtin(&lex));
        let pe = vars.iter().position(|v| v.name() == "pleural_effusion").unwrap();
        let hydro = glossed.concept_index("MESH:D006876").unwrap();
        assert!(!vars[pe].targets().contains(&hydro), "hydrothorax is no target of the variable here");
        let effusion = glossed.concept_index("MESH:D010996").unwrap();
        let labels = vec![
            (Target::Variable(pe), "pleural effusion".to_string()),
            (Target::Concept(hydro), "hydrothorax".to_string()),
        ];
        let index = toy_index(&labels, &|t| if t == "pleural effusion" { 1 } else { 2 });
        let question = "Is there fluid in the pleural space?";
        let ask = |q: Vec<f32>, present: Option<&std::collections::HashSet<u32>>| {
            align(question, &[q], &glossed, &vars, &index, present, AlignParams::default())
        };
        let near = vec![0.0, 0.8, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0]; // the variable's label at 0.8
        // The notes name the effusion, never the compound: the variable answers, the compound is context.
        let notes: std::collections::HashSet<u32> = [effusion].into();
        let a = ask(near.clone(), Some(&notes));
        assert_eq!(a.variable, Some(pe), "{:?}", a.aligned);
        assert!(a.answer_concepts.contains(&effusion) && !a.answer_concepts.contains(&hydro), "{:?}", a.aligned);
        assert!(a.aligned.iter().any(|x| x.target == Target::Concept(hydro) && !x.answer), "{:?}", a.aligned);
        // Notes that name the compound: it answers itself.
        let named: std::collections::HashSet<u32> = [hydro, effusion].into();
        let b = ask(near.clone(), Some(&named));
        assert_eq!(b.variable, None, "{:?}", b.aligned);
        assert!(b.answer_concepts.contains(&hydro), "{:?}", b.aligned);
        // Notes that name neither: nothing to yield to; the gloss stays the answer target.
        let neither = std::collections::HashSet::new();
        let c = ask(near.clone(), Some(&neither));
        assert_eq!(c.variable, None, "{:?}", c.aligned);
        assert!(c.answer_concepts.contains(&hydro));
        // A variable too far from the question (below `min_score`) does not answer.
        let far = vec![0.0, 0.5, 0.866, 0.0, 0.0, 0.0, 0.0, 0.0];
        let d = ask(far, Some(&notes));
        assert_eq!(d.variable, None, "{:?}", d.aligned);
        // Without the patient's entities (a search over all patients) the gloss answers as before.
        let e = ask(near, None);
        assert_eq!(e.variable, None, "{:?}", e.aligned);
        assert!(e.answer_concepts.contains(&hydro));
    }

    #[test]
    fn a_label_that_meets_the_question_only_in_its_body_part_is_context_not_the_answer() {
        let (lex, vars) = lexicon_and_variables();
        let pain = Target::Concept(lex.concept_index("MESH:D002637").unwrap()); // "Chest Pain"
        let bronchitis = Target::Concept(lex.concept_index("DOID:6132").unwrap()); // "bronchitis"
        let labels = vec![(pain, "Chest Pain".to_string()), (bronchitis, "bronchitis".to_string())];
        let index = toy_index(&labels, &|t| if t == "Chest Pain" { 1 } else { 2 });
        let ask =
            |question: &str, q: Vec<f32>| align(question, &[q], &lex, &vars, &index, None, AlignParams::default());
        // "chest" names the thorax: chest pain shares only that word with the question, so it is context.
        let near_pain = vec![0.0, 0.8, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0];
        let a = ask("Is there a chest infection?", near_pain.clone());
        assert!(a.answer_concepts.is_empty(), "{:?}", a.aligned);
        assert!(a.aligned.iter().any(|x| x.target == pain && !x.answer), "{:?}", a.aligned);
        // A label that shares no word with the question answers by embedding as before.
        let near_bronchitis = vec![0.0, 0.6, 0.8, 0.0, 0.0, 0.0, 0.0, 0.0];
        let b = ask("Is there a chest infection?", near_bronchitis);
        assert!(b.aligned.iter().any(|x| x.target == bronchitis && x.answer), "{:?}", b.aligned);
        // A question that names no body part is unaffected: the nearest label answers.
        let c = ask("Is the pain severe?", near_pain);
        assert!(c.aligned.iter().any(|x| x.target == pain && x.answer), "{:?}", c.aligned);
    }

    #[test]
    fn a_gloss_that_lands_on_a_variable_answers_for_it_even_when_the_notes_never_name_it() {
        let (lex, vars) = lexicon_and_variables();
        let glossed = lex.with_extra(&[]).unwrap().with_glosses(crate::lexicon::gloss::Glosses::builtin(&lex));
        let ptx = vars.iter().position(|v| v.name() == "pneumothorax").unwrap();
        let pe = vars.iter().position(|v| v.name() == "pleural_effusion").unwrap();
        let effusion = glossed.concept_index("MESH:D010996").unwrap();
        assert!(vars[pe].targets().contains(&effusion) && !vars[ptx].targets().contains(&effusion));
        // The effusion variable is near the question by embedding (0.8 ≥ min_score) and the notes name it.
        let labels = vec![
            (Target::Variable(pe), "pleural effusion".to_string()),
            (Target::Variable(ptx), "pneumothorax".to_string()),
        ];
        let index = toy_index(&labels, &|t| if t == "pleural effusion" { 1 } else { 2 });
        let notes: std::collections::HashSet<u32> = [effusion].into();
        let near = vec![0.0, 0.8, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0];
        let question = "Is there air in the pleural space?";
        let a = align(question, &[near], &glossed, &vars, &index, Some(&notes), AlignParams::default());
        assert_eq!(a.variable, Some(ptx), "{:?}", a.aligned);
        assert!(!a.answer_concepts.contains(&effusion), "{:?}", a.aligned);
        assert!(a.aligned.iter().any(|x| x.target == Target::Variable(pe) && !x.answer), "{:?}", a.aligned);
    }

    #[test]
    fn a_named_entity_aligns_through_the_lexicon_to_its_variable() {
        let (lex, vars) = lexicon_and_variables();
        let a = align(
            "Does the patient have cardiomegaly?",
            &[],
            &lex,
            &vars,
            &LabelIndex::default(),
            None,
            AlignParams::default(),
        );
        assert_eq!(a.aligned[0].id, "variable:cardiomegaly");
        assert_eq!(a.aligned[0].found, Found::Lexicon);
        let v = vars.iter().position(|v| v.name() == "cardiomegaly").unwrap();
        assert_eq!(a.variable, Some(v));
        assert!(vars[v].targets().iter().all(|c| a.concepts.get(c) == Some(&1.0)));
    }

    #[test]
    fn other_wording_aligns_through_label_embeddings_with_scores_and_thresholds() {
        let (lex, vars) = lexicon_and_variables();
        let ptx = vars.iter().position(|v| v.name() == "pneumothorax").unwrap();
        let labels = vec![
            (Target::Variable(ptx), "collapsed lung".to_string()),
            (Target::Variable(0), vars[0].name().to_string()),
            (Target::Concept(7), "something else".to_string()),
        ];
        let index = toy_index(&labels, &|t| match t {
            "collapsed lung" => 1,
            "something else" => 2,
            _ => 3,
        });
        // The phrase vector points mostly at "collapsed lung", a little at the other concept.
        let q = vec![0.0, 0.9, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0];
        let a = align("Is the lung collapsed?", &[q], &lex, &vars, &index, None, AlignParams::default());
        // The answer target by embedding; "lung" (named inside the phrase "lung collapsed") is context only.
        let answers: Vec<&Aligned> = a.aligned.iter().filter(|x| x.answer).collect();
        assert_eq!(answers.len(), 1, "{:?}", a.aligned);
        let lung: Vec<&Aligned> = a.aligned.iter().filter(|x| !x.answer).collect();
        assert_eq!(lung.len(), 1, "{:?}", a.aligned);
        assert_eq!((lung[0].label.as_str(), lung[0].found), ("Lung", Found::Lexicon));
        assert!(lung[0].score < a.aligned[0].score);
        let ptx_targets = vars[ptx].targets();
        assert!(a.answer_concepts.iter().all(|c| ptx_targets.contains(c)), "only the variable's mentions vote");
        assert_eq!(a.aligned[0].id, "variable:pneumothorax");
        assert_eq!(a.aligned[0].found, Found::Embedding);
        assert!((a.aligned[0].score - 0.9 / (0.9f32 * 0.9 + 0.09).sqrt()).abs() < 1e-4);
        assert_eq!(a.variable, Some(ptx));
        // Nothing close enough: nothing aligned.
        let far = vec![0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        let none = align("What is the weather?", &[far], &lex, &vars, &index, None, AlignParams::default());
        assert!(none.is_empty() && none.aligned.is_empty() && none.variable.is_none());
        // Context candidates by embedding only among the entities the patient's notes mention.
        let q = vec![0.0, 0.9, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let near = vec![0.0, 0.0, 0.7, 0.0, 0.0, 0.0, 0.0, 0.0];
        let with = align(
            "Is the lung collapsed?",
            &[q.clone(), near.clone()],
            &lex,
            &vars,
            &index,
            None,
            AlignParams::default(),
        );
        assert!(with.aligned.iter().any(|x| x.target == Target::Concept(7) && !x.answer), "{:?}", with.aligned);
        let absent = std::collections::HashSet::new();
        let without =
            align("Is the lung collapsed?", &[q, near], &lex, &vars, &index, Some(&absent), AlignParams::default());
        assert!(!without.aligned.iter().any(|x| x.target == Target::Concept(7)), "{:?}", without.aligned);
    }
}
