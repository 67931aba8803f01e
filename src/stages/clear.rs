//! CLEAR (clinical entity augmented retrieval): per clinical variable, windows of ±N words around the mentions
//! of its target entities, merged when they overlap, ranked by section weight and cut to a token budget; the
//! label (present / absent / uncertain / not_mentioned) is decided from the mentions inside those windows only.
//! Variables about current behaviour (tobacco, alcohol, drugs) set `historical_is_present = false`: a former
//! smoker counts as absent.
//!
//! Targets: the variable's concepts and all their descendants in the lexicon hierarchies, plus its own synonyms
//! (added to the lexicon as a concept `CS:variable:<name>`); with `elliptic_heads`, also the head noun of each of
//! its concepts' preferred names said alone ("effusion", "edema"; a lexicon term targets its concept, another joins
//! the variable's own), only in the sections that hold an imaging result (`elliptic_sections`) and not when an
//! anatomy term of another site stands right before it ("ankle edema") or is attached after it by a preposition
//! ("edema of the legs"). Sections: an optional
//! allow-list and deny-list of canonical names. Decision: each target mention votes with its section's weight —
//! affirmed (and historical, unless `historical_is_present = false`) for present, uncertain or hypothetical for
//! uncertain, negated for absent; mentions about family members do not vote. The heaviest vote wins (ties: present,
//! uncertain, absent); confidence is the winner's share of the votes. Context tokens are counted as words plus
//! punctuation marks in the kept windows, so the count stays bounded by the budget however long the note is.

use std::collections::{HashMap, HashSet};

use crate::config::ConfigError;
pub use crate::config::{Decision, VariableDef};
use crate::lexicon::{EntityKind, ExtraTerm, Lexicon};
use crate::model::variable::EvidenceMention;
pub use crate::model::variable::{Label, VariableResult, Window};
use crate::model::{Mention, Section};
use crate::stages::sections::CANONICAL_SECTIONS;

/// A variable compiled against the lexicon.
#[derive(Debug, Clone)]
pub struct Variable {
    pub def: VariableDef,
    targets: HashSet<u32>,
    allowed: Option<HashSet<String>>,
    excluded: HashSet<String>,
    window_words: usize,
    token_budget: usize,
    /// `elliptic_heads`: the head nouns said alone (lower case, singular and plural) and the stems of the other
    /// words of its concepts' names (a site's anatomy term before a head with one of these is its own site).
    heads: Heads,
}

/// A variable's elliptic heads (`VariableDef::elliptic_heads`).
#[derive(Debug, Clone, Default)]
pub struct Heads {
    pub forms: HashSet<String>,
    sites: Vec<String>,
    /// Canonical sections where a head said alone counts (`VariableDef::elliptic_sections`).
    sections: HashSet<String>,
}

/// Prepositions that attach a site after a finding ("edema of the legs", "effusion in the knee").
const LOCATIVE: &[&str] =
    &["of", "in", "at", "around", "about", "involving", "within", "over", "along", "on", "throughout"];
/// Most words from a head to the anatomy term of a site named after it, the preposition included ("edema of the
/// left lower extremity").
const SITE_AFTER_WORDS: usize = 5;

/// Letters of a word that name its stem when sites are compared ("pleura" and "pleural").
const SITE_STEM: usize = 5;

impl Heads {
    /// The head noun (last word) of each root concept's preferred name of two or more words, when that noun alone
    /// is no lexicon term of another kind than disease or symptom ("heart" of "enlarged heart" is anatomy); with its
    /// plural. English noun phrases are head-final: "pleural effusion" → "effusion", "pulmonary edema" → "edema".
    fn of(roots: &[u32], lexicon: &Lexicon) -> Heads {
        let mut h = Heads::default();
        let names: Vec<&str> = roots.iter().map(|&c| lexicon.concept(c).preferred.as_str()).collect();
        for name in &names {
            let words: Vec<String> = name.split_whitespace().map(str::to_lowercase).collect();
            let [.., head] = words.as_slice() else { continue };
            if words.len() < 2 || !head.chars().all(|c| c.is_ascii_alphabetic()) {
                continue;
            }
            let kind = lexicon.term_concept(head).map(|c| lexicon.concept(c).kind);
            if kind.is_some_and(|k| !k.is_finding()) {
                continue;
            }
            h.forms.insert(head.clone());
            if !head.ends_with('s') {
                h.forms.insert(format!("{head}s"));
            }
        }
        if h.forms.is_empty() {
            return h;
        }
        let roots: HashSet<u32> = roots.iter().copied().collect();
        let mut sites: HashSet<String> = HashSet::new();
        for (term, c) in lexicon.terms() {
            if roots.contains(&c) {
                for w in term.split(|c: char| !c.is_ascii_alphabetic()).filter(|w| w.len() >= 4) {
                    let w = w.to_ascii_lowercase();
                    if !h.forms.contains(&w) {
                        sites.insert(w.chars().take(SITE_STEM).collect());
                    }
                }
            }
        }
        h.sites = sites.into_iter().collect();
        h.sites.sort();
        h
    }

    /// Whether the mention at `i` stands for the variable as far as its heads go: a mention that is no head said
    /// alone does; a head said alone does in the sections that hold an imaging result (`elliptic_sections`) unless
    /// another site names it — an anatomy term of another site right before it ("ankle edema", "knee effusion") or
    /// attached after it by a preposition ("edema of the lower extremities", "effusion in the knee").
    pub fn admit(&self, text: &str, sections: &[Section], mentions: &[Mention], i: usize) -> bool {
        let m = &mentions[i];
        if self.forms.is_empty()
            || !text.get(m.start..m.end).is_some_and(|t| self.forms.contains(&t.to_ascii_lowercase()))
        {
            return true;
        }
        if !sections.get(m.section).is_some_and(|s| self.sections.contains(s.name)) {
            return false;
        }
        let before = i.checked_sub(1).map(|j| &mentions[j]).filter(|b| {
            b.end <= m.start
                && text.get(b.end..m.start).is_some_and(|t| t.chars().all(|c| c.is_whitespace() || c == '-'))
        });
        !before.is_some_and(|b| self.another_site(text, b)) && !self.site_after(text, mentions, i)
    }

    /// Whether the mention after the head at `i` is an anatomy term of another site attached by a preposition, within
    /// the clause: "edema of the left leg", "effusion in the knee joint" (no punctuation between, no other mention).
    fn site_after(&self, text: &str, mentions: &[Mention], i: usize) -> bool {
        let m = &mentions[i];
        let Some(next) = mentions[i + 1..].iter().find(|n| n.start >= m.end) else { return false };
        let Some(gap) = text.get(m.end..next.start) else { return false };
        let first = gap.split_whitespace().next().map(str::to_ascii_lowercase);
        first.is_some_and(|w| LOCATIVE.contains(&w.as_str()))
            && gap.split_whitespace().count() <= SITE_AFTER_WORDS
            && !gap.contains(['.', ',', ';', ':', '(', ')'])
            && self.another_site(text, next)
    }

    /// Whether `m` is an anatomy term none of whose words shares a stem with the variable's names ("ankle" for
    /// pulmonary edema; "lung" is its own site: "wet lung").
    fn another_site(&self, text: &str, m: &Mention) -> bool {
        m.kind == EntityKind::Anatomy
            && !text[m.start..m.end]
                .split(|c: char| !c.is_ascii_alphabetic())
                .filter(|w| w.len() >= 4)
                .any(|w| self.sites.iter().any(|s| w.to_ascii_lowercase().starts_with(s.as_str())))
    }
}

impl Variable {
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// Concept indexes this variable targets (its concepts, their descendants, its synonyms' concepts).
    pub fn targets(&self) -> &HashSet<u32> {
        &self.targets
    }

    /// Its elliptic heads (none unless `elliptic_heads`).
    pub fn heads(&self) -> &Heads {
        &self.heads
    }

    /// Whether mentions in this section count for the variable (its allow-list and deny-list).
    pub fn admits_section(&self, name: &str) -> bool {
        self.allowed.as_ref().is_none_or(|a| a.contains(name)) && !self.excluded.contains(name)
    }
}

/// Compiles variable definitions: checks them, adds their synonyms to the lexicon, expands their targets.
/// Errors name the variable and the field.
pub fn compile(
    defs: &[VariableDef],
    window_words: usize,
    token_budget: usize,
    base: &Lexicon,
) -> Result<(Lexicon, Vec<Variable>), ConfigError> {
    let mut problems = Vec::new();
    let mut names = HashSet::new();
    let mut extra = Vec::new();
    // A synonym the lexicon already has targets that term's concept (no duplicate pattern, whose match would
    // be ambiguous); other synonyms become terms of the variable's own concept.
    let mut known_targets: Vec<Vec<u32>> = vec![Vec::new(); defs.len()];
    for (i, d) in defs.iter().enumerate() {
        let key = format!("clear.variables[{i}] ({})", d.name);
        if d.name.is_empty() || !d.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
            problems.push(format!("{key}.name: must be snake_case"));
        }
        if !names.insert(d.name.clone()) {
            problems.push(format!("{key}.name: defined twice"));
        }
        let Some(kind) = EntityKind::parse(&d.kind) else {
            problems.push(format!("{key}.kind: must be one of medication, symptom, disease, procedure, lab, anatomy"));
            continue;
        };
        if d.concepts.is_empty() && d.synonyms.is_empty() {
            problems.push(format!("{key}: needs concepts or synonyms"));
        }
        for c in &d.concepts {
            if base.concept_index(c).is_none() {
                problems.push(format!("{key}.concepts: unknown concept id `{c}`"));
            }
        }
        for s in d.sections.iter().chain(&d.exclude_sections).chain(&d.elliptic_sections) {
            if !CANONICAL_SECTIONS.contains(&s.as_str()) {
                problems.push(format!("{key}: unknown section `{s}`"));
            }
        }
        if d.window_words == Some(0) || d.token_budget == Some(0) {
            problems.push(format!("{key}: window_words and token_budget must be greater than 0"));
        }
        for s in &d.synonyms {
            if let Some(c) = base.term_concept(&s.to_lowercase()) {
                known_targets[i].push(c);
                continue;
            }
            extra.push(ExtraTerm {
                text: s.clone(),
                concept_id: format!("CS:variable:{}", d.name),
                kind,
                preferred: d.name.replace('_', " "),
            });
        }
    }
    if !problems.is_empty() {
        return Err(ConfigError::Invalid(problems));
    }
    // Elliptic heads: a head that is a lexicon term targets that term's concept (as a synonym would); another is
    // a term of the variable's own concept.
    let mut heads: Vec<Heads> = vec![Heads::default(); defs.len()];
    for (i, d) in defs.iter().enumerate().filter(|(_, d)| d.elliptic_heads) {
        let roots: Vec<u32> = d.concepts.iter().filter_map(|c| base.concept_index(c)).collect();
        heads[i] = Heads::of(&roots, base);
        heads[i].sections = d.elliptic_sections.iter().cloned().collect();
        let mut forms: Vec<&String> = heads[i].forms.iter().collect();
        forms.sort();
        for f in forms {
            match base.term_concept(f) {
                Some(c) => known_targets[i].push(c),
                None if d.synonyms.iter().any(|s| s.eq_ignore_ascii_case(f)) => {}
                None => extra.push(ExtraTerm {
                    text: f.clone(),
                    concept_id: format!("CS:variable:{}", d.name),
                    kind: EntityKind::parse(&d.kind).unwrap_or(EntityKind::Disease),
                    preferred: d.name.replace('_', " "),
                }),
            }
        }
    }
    let lexicon = base.with_extra(&extra).map_err(|e| ConfigError::Invalid(vec![format!("clear.variables: {e}")]))?;
    let vars = defs
        .iter()
        .zip(known_targets)
        .zip(heads)
        .map(|((d, known), heads)| {
            let mut roots: Vec<u32> = d.concepts.iter().filter_map(|c| lexicon.concept_index(c)).collect();
            if let Some(own) = lexicon.concept_index(&format!("CS:variable:{}", d.name)) {
                roots.push(own);
            }
            let mut targets =
                if d.include_descendants { lexicon.with_descendants(&roots) } else { roots.into_iter().collect() };
            // Concepts reached through a synonym are targets themselves, without their descendants.
            targets.extend(known);
            Variable {
                targets,
                allowed: (!d.sections.is_empty()).then(|| d.sections.iter().cloned().collect()),
                excluded: d.exclude_sections.iter().cloned().collect(),
                window_words: d.window_words.unwrap_or(window_words),
                token_budget: d.token_budget.unwrap_or(token_budget),
                heads,
                def: d.clone(),
            }
        })
        .collect();
    Ok((lexicon, vars))
}

/// The variables' embedding expansion as shipped (`clinstream-lab vocab expand` writes it; the shipped model, lexicon
/// and default variables): `variable<TAB>concept id<TAB>cosine<TAB>preferred term` per line.
pub const EXPANSION_TSV: &str = include_str!("../../data/variables/expansion.tsv");

/// Adds to each variable the expansion concepts with a cosine ≥ `min` (`clear.expansion_min_score`; 0 adds none).
/// Lines for variables or concepts this build does not have are ignored, so a user's own variables are expanded
/// only by a table made for them.
pub fn expand(variables: &mut [Variable], lexicon: &Lexicon, table: &str, min: f32) -> usize {
    if min <= 0.0 {
        return 0;
    }
    let mut added = 0;
    for line in table.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut cols = line.split('\t');
        let (Some(name), Some(id), Some(score)) = (cols.next(), cols.next(), cols.next()) else { continue };
        let Ok(score) = score.parse::<f32>() else { continue };
        if score < min {
            continue;
        }
        let (Some(v), Some(c)) = (variables.iter_mut().find(|v| v.def.name == name), lexicon.concept_index(id)) else {
            continue;
        };
        added += usize::from(v.targets.insert(c));
    }
    added
}

/// Whether `text[i..]` starts with whitespace, alphanumeric, and the character's length: ASCII bytes without
/// decoding (9–13 and space are the ASCII characters `char::is_whitespace` takes), others decoded.
#[inline]
fn class_at(text: &str, i: usize) -> (bool, bool, usize) {
    let b = text.as_bytes()[i];
    if b < 0x80 {
        (matches!(b, b'\t'..=b'\r' | b' '), b.is_ascii_alphanumeric(), 1)
    } else {
        let c = text[i..].chars().next().unwrap_or(' ');
        (c.is_whitespace(), c.is_alphanumeric(), c.len_utf8())
    }
}

/// Word spans of a text (runs of non-whitespace, as `char::is_whitespace` says).
pub fn word_spans(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(text.len() / 6);
    let mut start = None;
    let mut i = 0;
    while i < text.len() {
        let (ws, _, len) = class_at(text, i);
        match (ws, start) {
            (true, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
        i += len;
    }
    if let Some(s) = start {
        out.push((s, text.len()));
    }
    out
}

/// Tokens in `text`: words plus punctuation marks (a stable, model-free estimate of LLM context tokens).
pub fn count_tokens(text: &str) -> usize {
    let mut n = 0;
    let mut in_word = false;
    let mut i = 0;
    while i < text.len() {
        let (ws, alnum, len) = class_at(text, i);
        if alnum {
            if !in_word {
                n += 1;
                in_word = true;
            }
        } else {
            in_word = false;
            if !ws {
                n += 1;
            }
        }
        i += len;
    }
    n
}

/// Which variables target each concept: a note's mentions are sorted to their variables with one lookup each,
/// not one per mention and variable (17 built-in variables, each with thousands of target concepts).
#[derive(Debug, Default)]
pub struct TargetIndex {
    variables_of: HashMap<u32, Vec<u32>>,
}

impl TargetIndex {
    /// Built from the variables as they are final (after `expand`).
    pub fn new(vars: &[Variable]) -> Self {
        let mut variables_of: HashMap<u32, Vec<u32>> = HashMap::new();
        for (i, v) in vars.iter().enumerate() {
            for &c in &v.targets {
                variables_of.entry(c).or_default().push(i as u32);
            }
        }
        Self { variables_of }
    }
}

/// Evaluates every variable on one note (`index` built from these `vars`).
pub fn evaluate(
    text: &str,
    sections: &[Section],
    mentions: &[Mention],
    vars: &[Variable],
    index: &TargetIndex,
) -> Vec<VariableResult> {
    let mut targets: Vec<Vec<&Mention>> = vec![Vec::new(); vars.len()];
    for (i, m) in mentions.iter().enumerate() {
        for &v in index.variables_of.get(&m.concept).map(Vec::as_slice).unwrap_or_default() {
            let var = &vars[v as usize];
            if var.admits_section(sections[m.section].name) && var.heads.admit(text, sections, mentions, i) {
                targets[v as usize].push(m);
            }
        }
    }
    // Words and token counts only when some variable has a mention to take a window around (a variable without
    // one never reads them).
    let any = targets.iter().any(|t| !t.is_empty());
    let (words, prefix) = if any { words_and_prefix(text) } else { Default::default() };
    vars.iter().zip(targets).map(|(v, t)| evaluate_one(sections, t, &words, &prefix, v)).collect()
}

/// `word_spans(text)` and, in the same pass, `prefix[i]` = tokens in the first `i` words. Words are
/// whitespace-separated and `count_tokens` counts nothing in whitespace, so the tokens of words `lo..=hi` are
/// `prefix[hi + 1] - prefix[lo]`: shrinking a window word by word costs O(1) a step, not a recount of the window
/// (which made long notes quadratic).
fn words_and_prefix(text: &str) -> (Vec<(usize, usize)>, Vec<usize>) {
    if text.is_ascii() { ascii_words_and_prefix(text.as_bytes()) } else { words_and_prefix_chars(text) }
}

/// `words_and_prefix` of an ASCII text, 64 bytes at a time: masks of its whitespace and of its letters and digits
/// (8 bytes per step), whose edges are the words' starts and ends; a byte is a token unless it is whitespace or a
/// letter or digit right after another (`count_tokens`), so the tokens before a word's end are a popcount.
fn ascii_words_and_prefix(src: &[u8]) -> (Vec<(usize, usize)>, Vec<usize>) {
    use crate::lexicon::matcher::{ascii_alnum_bits, ascii_space_bits};
    let mut words = Vec::with_capacity(src.len() / 6);
    let mut prefix = Vec::with_capacity(src.len() / 6 + 1);
    prefix.push(0);
    let (mut total, mut open, mut prev_solid, mut prev_alnum) = (0usize, 0usize, 0u64, 0u64);
    for (n, chunk) in src.chunks(64).enumerate() {
        let base = n * 64;
        // Padded with spaces: a word running to the end of the text ends at the first pad byte.
        let mut padded = [b' '; 64];
        padded[..chunk.len()].copy_from_slice(chunk);
        let (mut space, mut alnum) = (0u64, 0u64);
        for (k, eight) in padded.chunks_exact(8).enumerate() {
            let x = u64::from_le_bytes(eight.try_into().expect("8 bytes"));
            space |= ascii_space_bits(x) << (8 * k);
            alnum |= ascii_alnum_bits(x) << (8 * k);
        }
        let solid = !space;
        let tokens = solid & !(alnum & (alnum << 1 | prev_alnum));
        let after_solid = solid << 1 | prev_solid;
        let mut edges = (solid & !after_solid) | (space & after_solid);
        while edges != 0 {
            let k = edges.trailing_zeros() as usize;
            if solid >> k & 1 == 1 {
                open = base + k;
            } else {
                words.push((open, base + k));
                prefix.push(total + (tokens & ((1u64 << k) - 1)).count_ones() as usize);
            }
            edges &= edges - 1;
        }
        total += tokens.count_ones() as usize;
        (prev_solid, prev_alnum) = (solid >> 63, alnum >> 63);
    }
    if prev_solid == 1 {
        words.push((open, src.len()));
        prefix.push(total);
    }
    (words, prefix)
}

/// `words_and_prefix` char by char (any text).
fn words_and_prefix_chars(text: &str) -> (Vec<(usize, usize)>, Vec<usize>) {
    let mut words = Vec::with_capacity(text.len() / 6);
    let mut prefix = Vec::with_capacity(text.len() / 6 + 1);
    prefix.push(0);
    let (mut total, mut start, mut in_alnum) = (0, None, false);
    let mut i = 0;
    while i < text.len() {
        let (ws, alnum, len) = class_at(text, i);
        if ws {
            if let Some(s) = start.take() {
                words.push((s, i));
                prefix.push(total);
            }
            in_alnum = false;
        } else {
            start.get_or_insert(i);
            if !alnum || !in_alnum {
                total += 1;
            }
            in_alnum = alnum;
        }
        i += len;
    }
    if let Some(s) = start {
        words.push((s, text.len()));
        prefix.push(total);
    }
    (words, prefix)
}

/// One variable from its target mentions (in text order, in admitted sections).
fn evaluate_one(
    sections: &[Section],
    targets: Vec<&Mention>,
    words: &[(usize, usize)],
    prefix: &[usize],
    v: &Variable,
) -> VariableResult {
    let word_of = |offset: usize| words.partition_point(|&(_, e)| e <= offset).min(words.len().saturating_sub(1));
    // Windows as word ranges, merged when they overlap or touch.
    let mut windows: Vec<(usize, usize, Vec<&Mention>)> = Vec::new();
    for m in &targets {
        let (first, last) = (word_of(m.start), word_of(m.end.saturating_sub(1)));
        let lo = first.saturating_sub(v.window_words);
        let hi = (last + v.window_words).min(words.len().saturating_sub(1));
        match windows.last_mut() {
            Some(w) if lo <= w.1 + 1 => {
                w.1 = w.1.max(hi);
                w.2.push(m);
            }
            _ => windows.push((lo, hi, vec![m])),
        }
    }
    let weight_of = |ms: &[&Mention]| ms.iter().map(|m| sections[m.section].weight).fold(0.0f32, f32::max);
    windows.sort_by(|a, b| weight_of(&b.2).total_cmp(&weight_of(&a.2)).then(a.0.cmp(&b.0)));

    let mut kept = Vec::new();
    let mut remaining = v.token_budget;
    for (mut lo, mut hi, ms) in windows {
        let span_tokens = |lo: usize, hi: usize| prefix[hi + 1] - prefix[lo];
        let mut tokens = span_tokens(lo, hi);
        if tokens > remaining {
            // Shrink around the window's mentions until it fits.
            let (core_lo, core_hi) =
                (word_of(ms[0].start), word_of(ms[ms.len() - 1].end.saturating_sub(1)).max(word_of(ms[0].start)));
            while tokens > remaining && (lo < core_lo || hi > core_hi) {
                if lo < core_lo {
                    lo += 1;
                }
                if hi > core_hi && tokens > remaining {
                    hi -= 1;
                }
                tokens = span_tokens(lo, hi);
            }
            if tokens > remaining {
                continue;
            }
        }
        remaining -= tokens;
        let (start, end) = (words[lo].0, words[hi].1);
        let inside: Vec<&Mention> = ms.into_iter().filter(|m| m.start >= start && m.end <= end).collect();
        let best = inside.iter().max_by(|a, b| sections[a.section].weight.total_cmp(&sections[b.section].weight));
        let Some(best) = best else { continue };
        kept.push(Window {
            start,
            end,
            section: sections[best.section].name,
            weight: sections[best.section].weight,
            tokens,
            mentions: inside
                .iter()
                .map(|m| EvidenceMention {
                    start: m.start,
                    end: m.end,
                    section: sections[m.section].name,
                    weight: sections[m.section].weight,
                    assertion: m.assertion,
                })
                .collect(),
        });
    }
    kept.sort_by_key(|w| w.start);

    let (mut present, mut uncertain, mut absent) = (0.0f32, 0.0f32, 0.0f32);
    for w in &kept {
        for m in &w.mentions {
            let a = m.assertion;
            let weight = m.weight.max(0.01);
            if a.family {
                continue;
            }
            if a.negated {
                absent += weight;
            } else if a.votes_uncertain(v.def.differential_is_present) {
                uncertain += weight;
            } else if !a.historical || v.def.historical_is_present {
                present += weight;
            } else {
                // Past use of something whose variable means current use: not present now.
                absent += weight;
            }
        }
    }
    let total = present + uncertain + absent;
    let (label, top) = if total == 0.0 {
        (Label::NotMentioned, 0.0)
    } else if v.def.decision == Decision::AnyPresent {
        if present > 0.0 {
            (Label::Present, present)
        } else if uncertain > 0.0 {
            (Label::Uncertain, uncertain)
        } else {
            (Label::Absent, absent)
        }
    } else if present >= uncertain && present >= absent {
        (Label::Present, present)
    } else if uncertain >= absent {
        (Label::Uncertain, uncertain)
    } else {
        (Label::Absent, absent)
    };
    VariableResult {
        variable: v.def.name.clone(),
        label,
        confidence: if total > 0.0 { top / total } else { 1.0 },
        context_tokens: kept.iter().map(|w| w.tokens).sum(),
        evidence: kept,
        mentions_found: targets.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 64-bytes-at-a-time split of ASCII text gives the char-by-char words and token prefix, on real notes
    /// and on generated texts over whitespace of every kind, punctuation, letters and digits, every length to 200.
    #[test]
    fn ascii_words_and_prefix_are_the_char_by_char_ones() {
        let mut texts = vec![
            include_str!("../../tests/fixtures/mtsamples/17-cardiovascular--pulmonary.txt").to_string(),
            include_str!("../../tests/fixtures/mtsamples/1506-radiology.txt").to_string(),
            String::new(),
            " ".repeat(64),
            "x".repeat(64),
            "x".repeat(128),
        ];
        let alphabet = [b'a', b'Z', b'7', b' ', b'\t', b'\n', 0x0b, 0x0c, b'\r', b'.', b',', b'-', b'/', b'(', 0x1f];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..=200 {
            for _ in 0..5 {
                let text: String = (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        char::from(alphabet[(seed % alphabet.len() as u64) as usize])
                    })
                    .collect();
                texts.push(text);
            }
        }
        let mut words = 0;
        for text in &texts {
            assert!(text.is_ascii());
            let fast = ascii_words_and_prefix(text.as_bytes());
            assert_eq!(fast, words_and_prefix_chars(text), "{text:?}");
            assert_eq!(fast.0, word_spans(text));
            words += fast.0.len();
        }
        assert!(words > 10_000, "{words}");
    }

    #[test]
    fn tokens_and_words() {
        assert_eq!(count_tokens("No pleural effusion, or pneumothorax."), 7);
        // Word prefix sums give every span's count.
        let text = "Pt c/o  SOB,\nno fever; BP 120/80 — stable.\t Plan: f/u.";
        let (words, prefix) = words_and_prefix(text);
        assert_eq!(words, word_spans(text));
        for lo in 0..words.len() {
            for hi in lo..words.len() {
                assert_eq!(prefix[hi + 1] - prefix[lo], count_tokens(&text[words[lo].0..words[hi].1]), "{lo}..={hi}");
            }
        }
        assert_eq!(word_spans(" a  bc\nd "), vec![(1, 2), (4, 6), (7, 8)]);
    }

    /// The byte-wise versions agree with the plain char-by-char definitions, Unicode included.
    #[test]
    fn fast_word_and_token_counts_match_the_definitions() {
        fn words_ref(text: &str) -> Vec<(usize, usize)> {
            let mut out = Vec::new();
            let mut start = None;
            for (i, c) in text.char_indices() {
                match (c.is_whitespace(), start) {
                    (true, Some(s)) => {
                        out.push((s, i));
                        start = None;
                    }
                    (false, None) => start = Some(i),
                    _ => {}
                }
            }
            if let Some(s) = start {
                out.push((s, text.len()));
            }
            out
        }
        fn tokens_ref(text: &str) -> usize {
            let (mut n, mut in_word) = (0, false);
            for c in text.chars() {
                if c.is_alphanumeric() {
                    n += usize::from(!in_word);
                    in_word = true;
                } else {
                    in_word = false;
                    n += usize::from(!c.is_whitespace());
                }
            }
            n
        }
        let alphabet: Vec<char> =
            "ab Z9\t\n\r\u{0B}\u{0C}\u{1C}.,;-/é中\u{00A0}\u{2003}\u{0085}\u{3000}µ²½".chars().collect();
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for len in 0..400 {
            let text: String = (0..len % 60)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    alphabet[(seed % alphabet.len() as u64) as usize]
                })
                .collect();
            assert_eq!(word_spans(&text), words_ref(&text), "{text:?}");
            assert_eq!(count_tokens(&text), tokens_ref(&text), "{text:?}");
            let (words, prefix) = words_and_prefix(&text);
            assert_eq!(words, words_ref(&text), "{text:?}");
            let counts: Vec<usize> = words.iter().map(|&(a, b)| tokens_ref(&text[a..b])).collect();
            assert_eq!(prefix.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>(), counts, "{text:?}");
        }
    }
}
