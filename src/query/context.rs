//! Context assembly: CLEAR windows across one patient's notes for an aligned question, and the answer they
//! support.
//!
//! 1. Each note's mentions of aligned concepts (in sections the aligned variable admits) get a window of
//!    ±`window_words` words; overlapping or touching windows of one note merge.
//! 2. A window's score is the best alignment score × section weight among its mentions; recency breaks ties.
//! 3. In score order, a window whose text (case and whitespace folded) was already taken from another note is a
//!    copy-forward duplicate and dropped; the rest are taken while the budget lasts (a window too large for what
//!    is left shrinks around its mentions, or is skipped). When no answer target is mentioned in the patient's
//!    notes at all, the windows (all of related targets, then) get only `related_share` of the budget: the
//!    caller fills the rest with the patient's passages nearest the question ([`fill`]). Each window says which
//!    path produced it ([`Path`]).
//! 4. The kept windows are ordered by date (then note and position).
//! 5. The answer: each target mention inside a kept window votes with weight × alignment score — affirmed (and
//!    historical, unless the variable says `historical_is_present = false`) for present, uncertain or hypothetical
//!    for uncertain, negated for absent; family mentions do not vote. The variable's decision rule picks the
//!    winner (`any_present`, or the heaviest vote); no vote is `not_mentioned`.
//!
//! Token counts come from the caller's counter (the embedding model's tokenizer, or the downstream LLM's), so the
//! budget holds however long the record is.

use std::collections::HashSet;

use serde::Serialize;

use super::align::Alignment;
use crate::config::Decision;
use crate::lexicon::Lexicon;
use crate::model::mention::Assertion;
use crate::model::{Label, Mention, Section};
use crate::stages::clear::{Variable, word_spans};

/// One processed note of the patient, as the context needs it.
#[derive(Debug, Clone, Copy)]
pub struct PatientNote<'a> {
    pub doc_id: &'a str,
    pub version: &'a str,
    /// ISO date (or date-time) of the note; sorts as text.
    pub date: Option<&'a str>,
    /// Byte offset of `text` in the note (0 for a whole note; a stored window's start otherwise).
    pub offset: usize,
    pub text: &'a str,
    pub sections: &'a [Section],
    pub mentions: &'a [Mention],
}

impl<'a> From<&'a super::windows::WindowNote> for PatientNote<'a> {
    fn from(w: &'a super::windows::WindowNote) -> Self {
        PatientNote {
            doc_id: &w.doc_id,
            version: &w.version,
            date: w.date.as_deref(),
            offset: w.offset,
            text: &w.text,
            sections: &w.sections,
            mentions: &w.mentions,
        }
    }
}

impl<'a> From<&'a crate::model::Document> for PatientNote<'a> {
    /// A processed note (undated or unversioned fields stay empty).
    fn from(d: &'a crate::model::Document) -> Self {
        PatientNote {
            doc_id: &d.note.doc_id,
            version: d.note.version.as_deref().unwrap_or(""),
            date: d.note.date.as_deref(),
            offset: 0,
            text: &d.note.text,
            sections: &d.sections,
            mentions: &d.mentions,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct ContextParams<'a> {
    pub budget_tokens: usize,
    pub window_words: usize,
    /// CPTF: keep this share of each chosen window's tokens (its most important words: `query::cptf`), choosing
    /// windows as if the budget were `budget / ratio`, so more of them fit.
    pub compress: Option<Compress<'a>>,
    /// When no answer target is mentioned in the patient's notes (the lexicon missed the finding, or the question
    /// named none), the share of the budget the windows of the other (related) targets may take; the rest is left
    /// to the dense path (`fill`). 1 = no limit.
    pub related_share: f32,
}

/// [`ContextParams::related_share`] by default: three quarters of the budget for related windows when the answer
/// target is not mentioned (set by the qa set's evidence recall, with and without the hand-written synonyms:
/// docs/read-side.md, "When the lexicon missed").
pub const RELATED_SHARE: f32 = 0.75;

/// A window's text → the text kept of it: `(text, mention spans in it, allowance in tokens)` → `(kept text, its
/// tokens)`. The caller's (it scores with a model and counts with the budget's tokenizer).
pub type Filter<'a> = dyn Fn(&str, &[(usize, usize)], usize) -> (String, usize) + Sync + 'a;

/// CPTF for [`ContextParams::compress`].
#[derive(Clone, Copy)]
pub struct Compress<'a> {
    /// The share of a window's tokens kept, in (0, 1].
    pub ratio: f32,
    pub filter: &'a Filter<'a>,
}

impl std::fmt::Debug for Compress<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compress").field("ratio", &self.ratio).finish_non_exhaustive()
    }
}

impl ContextParams<'_> {
    pub fn new(budget_tokens: usize, window_words: usize) -> Self {
        ContextParams { budget_tokens, window_words, compress: None, related_share: RELATED_SHARE }
    }

    /// The tokens the windows may take: the budget, or its related share when no answer target is mentioned.
    fn window_budget(&self, answer_mentions: usize) -> usize {
        if answer_mentions > 0 {
            self.budget_tokens
        } else {
            ((self.budget_tokens as f64 * f64::from(self.related_share.clamp(0.0, 1.0))).floor() as usize)
                .min(self.budget_tokens)
        }
    }
}

/// Which path of the assembly produced a window or a chunk of a context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Path {
    /// A window around a mention of an answer target (what the question asks about).
    AnswerTarget,
    /// A window around mentions of related targets only (the patient's entities nearest the question, the
    /// finding's site).
    Related,
    /// A chunk of the patient's notes nearest the question by embedding (the fill, or the fallback).
    Dense,
}

/// One kept window (also the query service's response type: `serve::api`).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ContextWindow {
    pub doc_id: String,
    pub doc_version: String,
    pub date: Option<String>,
    /// The heaviest section among its mentions (canonical name).
    pub section: String,
    pub weight: f32,
    /// Byte offsets in the note's text.
    pub start: usize,
    pub end: usize,
    pub text: String,
    /// Concept ids of the aligned mentions inside, in text order.
    pub concepts: Vec<String>,
    /// Their assertions (`affirmed`, `negated`, `uncertain`, `hypothetical`, `family`, `historical`).
    pub assertions: Vec<String>,
    /// Alignment × section weight.
    pub score: f32,
    pub tokens: usize,
    /// `answer_target` or `related`.
    pub path: Path,
    /// With CPTF (`compress`): the window's tokens before filtering; `text` then holds the words kept of
    /// `start..end`, in order, joined by one space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compressed_from: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    pub status: Label,
    /// The winner's share of the votes (1 when nothing voted).
    pub confidence: f32,
    /// Indexes into `windows` of the windows holding a mention that voted for the status.
    pub supporting: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Context {
    pub windows: Vec<ContextWindow>,
    pub tokens: usize,
    pub answer: Answer,
    /// Target mentions found in the patient's notes before the budget cut.
    pub mentions_found: usize,
    /// Of those, mentions of an answer target (0: the windows were held to `related_share` of the budget).
    pub answer_mentions: usize,
}

/// How votes decide (from the aligned variable, or the defaults for a bare concept).
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    pub decision: Decision,
    pub historical_is_present: bool,
    pub differential_is_present: bool,
}

impl Rules {
    pub fn of(variable: Option<&Variable>) -> Rules {
        match variable {
            Some(v) => Rules {
                decision: v.def.decision,
                historical_is_present: v.def.historical_is_present,
                differential_is_present: v.def.differential_is_present,
            },
            None => Rules { decision: Decision::Weighted, historical_is_present: true, differential_is_present: false },
        }
    }
}

/// A candidate window of one note: word range, its mentions.
struct Candidate<'a> {
    note: usize,
    lo: usize,
    hi: usize,
    mentions: Vec<&'a Mention>,
    score: f32,
}

/// Assembles the context for an aligned question over the patient's notes.
pub fn assemble(
    notes: &[PatientNote<'_>],
    alignment: &Alignment,
    variables: &[Variable],
    lexicon: &Lexicon,
    params: ContextParams<'_>,
    count_tokens: &dyn Fn(&str) -> usize,
) -> Context {
    assemble_with(notes, alignment, variables, lexicon, params, count_tokens, None)
}

/// Where each token of a text ends (byte offsets), from the tokenizer that counts the budget.
pub type TokenEnds<'a> = dyn Fn(&str) -> Vec<usize> + 'a;

/// [`assemble`], with `token_ends` (the byte offsets where each token of a text ends, from the same tokenizer) to
/// cut a window too long for what is left of the budget: its cut is searched on one tokenization of the window
/// instead of one per step of the search, then counted exactly, and the result is the same as without it (the
/// search falls back to exact counts where the estimate and the count disagree).
pub fn assemble_with(
    notes: &[PatientNote<'_>],
    alignment: &Alignment,
    variables: &[Variable],
    lexicon: &Lexicon,
    params: ContextParams<'_>,
    count_tokens: &dyn Fn(&str) -> usize,
    token_ends: Option<&TokenEnds<'_>>,
) -> Context {
    let variable = alignment.variable.and_then(|i| variables.get(i));
    let rules = Rules::of(variable);
    let words: Vec<Vec<(usize, usize)>> = notes.iter().map(|n| word_spans(n.text)).collect();
    let mut candidates: Vec<Candidate<'_>> = Vec::new();
    let (mut mentions_found, mut answer_mentions) = (0, 0);
    for (ni, note) in notes.iter().enumerate() {
        let w = &words[ni];
        if w.is_empty() {
            continue;
        }
        let word_of = |offset: usize| w.partition_point(|&(_, e)| e <= offset).min(w.len() - 1);
        let mut targets: Vec<&Mention> = note
            .mentions
            .iter()
            .enumerate()
            .filter(|(_, m)| alignment.concepts.contains_key(&m.concept))
            .filter(|&(i, m)| {
                // The answer variable's section filters apply to its own mentions, and so do its rules for heads
                // said alone (only where an imaging result is written, not of another site: "ankle edema").
                !alignment.answer_concepts.contains(&m.concept)
                    || variable.is_none_or(|v| {
                        v.admits_section(note.sections[m.section].name)
                            && v.heads().admit(note.text, note.sections, note.mentions, i)
                    })
            })
            .map(|(_, m)| m)
            .collect();
        targets.sort_by_key(|m| m.start);
        mentions_found += targets.len();
        answer_mentions += targets.iter().filter(|m| alignment.answer_concepts.contains(&m.concept)).count();
        let mut merged: Vec<Candidate<'_>> = Vec::new();
        for m in targets {
            let lo = word_of(m.start).saturating_sub(params.window_words);
            let hi = (word_of(m.end.saturating_sub(1)) + params.window_words).min(w.len() - 1);
            let score = alignment.concepts[&m.concept] * note.sections[m.section].weight;
            match merged.last_mut() {
                Some(c) if lo <= c.hi + 1 => {
                    c.hi = c.hi.max(hi);
                    c.mentions.push(m);
                    c.score = c.score.max(score);
                }
                _ => merged.push(Candidate { note: ni, lo, hi, mentions: vec![m], score }),
            }
        }
        candidates.extend(merged);
    }
    // Best first; recency breaks ties (undated notes last), then a stable order.
    candidates.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| notes[b.note].date.cmp(&notes[a.note].date))
            .then_with(|| notes[a.note].doc_id.cmp(notes[b.note].doc_id))
            // Position in the note (byte offset, so whole notes and stored windows order alike).
            .then((notes[a.note].offset + words[a.note][a.lo].0).cmp(&(notes[b.note].offset + words[b.note][b.lo].0)))
    });

    let mut seen_texts: HashSet<String> = HashSet::new();
    // When no answer target is mentioned, the related windows are context of a guess: they get a share of the
    // budget, and the dense path the rest.
    let mut remaining = params.window_budget(answer_mentions);
    let mut kept: Vec<(usize, ContextWindow, Vec<&Mention>)> = Vec::new();
    for c in candidates {
        if remaining == 0 {
            break; // every window holds at least one token
        }
        let note = &notes[c.note];
        let w = &words[c.note];
        let word_of = |offset: usize| w.partition_point(|&(_, e)| e <= offset).min(w.len() - 1);
        let span = |lo: usize, hi: usize| &note.text[w[lo].0..w[hi].1];
        let folded = fold(span(c.lo, c.hi));
        if !seen_texts.insert(folded) {
            continue; // copy-forward: the same passage from another (or the same) note is already in
        }
        // With CPTF a window is chosen by its tokens before filtering, against the budget as it will stretch.
        let fit = match params.compress {
            Some(c) => (remaining as f64 / f64::from(c.ratio.clamp(0.05, 1.0))).floor() as usize,
            None => remaining,
        };
        let (mut lo, mut hi) = (c.lo, c.hi);
        let mut tokens = count_tokens(span(lo, hi));
        if tokens > fit {
            let remaining = fit;
            // Shrink symmetrically around the mentions, one word a side per step, to the first step that fits:
            // a binary search over the steps (a span's token count never grows as words leave it).
            let core_lo = word_of(c.mentions[0].start);
            let core_hi = c.mentions.iter().map(|m| word_of(m.end.saturating_sub(1))).max().unwrap_or(core_lo);
            let at = |k: usize| ((c.lo + k).min(core_lo.max(c.lo)), c.hi.saturating_sub(k).max(core_hi.min(c.hi)));
            let steps = core_lo.saturating_sub(c.lo).max(c.hi.saturating_sub(core_hi));
            // The mentions alone first: when even they do not fit, no step does.
            let (l, h) = at(steps);
            if steps == 0 || count_tokens(span(l, h)) > remaining {
                continue;
            }
            // The first step whose span fits by `tokens_of`, with its count.
            let first_fit = |tokens_of: &dyn Fn(usize) -> usize| {
                let mut fits_from = None;
                let (mut a, mut b) = (1usize, steps);
                while a <= b {
                    let k = a + (b - a) / 2;
                    let t = tokens_of(k);
                    if t <= remaining {
                        fits_from = Some((k, t));
                        b = k - 1;
                    } else {
                        a = k + 1;
                    }
                }
                fits_from
            };
            let exact = |k: usize| {
                let (l, h) = at(k);
                count_tokens(span(l, h))
            };
            // With token ends: search on the window's one tokenization (tokens ending inside a step's span), then
            // check the step found with exact counts — it fits, and the step before it does not.
            let estimated = token_ends.and_then(|ends_of| {
                let base = w[c.lo].0;
                let ends = ends_of(span(c.lo, c.hi));
                let inside = |k: usize| {
                    let (l, h) = at(k);
                    let (from, to) = (w[l].0 - base, w[h].1 - base);
                    ends.partition_point(|&e| e <= to) - ends.partition_point(|&e| e <= from)
                };
                let (k, _) = first_fit(&inside)?;
                let t = exact(k);
                (t <= remaining && (k == 1 || exact(k - 1) > remaining)).then_some((k, t))
            });
            let Some((k, t)) = estimated.or_else(|| first_fit(&exact)) else { continue };
            (lo, hi) = at(k);
            tokens = t;
        }
        let (start, end) = (w[lo].0, w[hi].1);
        let inside: Vec<&Mention> = c.mentions.into_iter().filter(|m| m.start >= start && m.end <= end).collect();
        let Some(best) =
            inside.iter().max_by(|a, b| note.sections[a.section].weight.total_cmp(&note.sections[b.section].weight))
        else {
            continue;
        };
        let (text, compressed_from) = match params.compress {
            Some(cp) => {
                let spans: Vec<(usize, usize)> = inside.iter().map(|m| (m.start - start, m.end - start)).collect();
                let allowance = (tokens as f64 * f64::from(cp.ratio.clamp(0.05, 1.0))).ceil() as usize;
                let (kept, kept_tokens) = (cp.filter)(&note.text[start..end], &spans, allowance);
                if kept_tokens > remaining {
                    continue;
                }
                let before = tokens;
                tokens = kept_tokens;
                (kept, Some(before))
            }
            None => (note.text[start..end].to_string(), None),
        };
        remaining -= tokens;
        let section = &note.sections[best.section];
        let window = ContextWindow {
            doc_id: note.doc_id.to_string(),
            doc_version: note.version.to_string(),
            date: note.date.map(str::to_string),
            section: section.name.to_string(),
            weight: section.weight,
            start: note.offset + start,
            end: note.offset + end,
            text,
            concepts: inside.iter().map(|m| lexicon.concept(m.concept).id.clone()).collect(),
            assertions: inside.iter().map(|m| assertion_name(&m.assertion).to_string()).collect(),
            score: c.score,
            tokens,
            path: if inside.iter().any(|m| alignment.answer_concepts.contains(&m.concept)) {
                Path::AnswerTarget
            } else {
                Path::Related
            },
            compressed_from,
        };
        kept.push((c.note, window, inside));
    }
    kept.sort_by(|a, b| {
        notes[a.0]
            .date
            .cmp(&notes[b.0].date)
            .then_with(|| notes[a.0].doc_id.cmp(notes[b.0].doc_id))
            .then(a.1.start.cmp(&b.1.start))
    });
    let votes = kept.iter().enumerate().flat_map(|(i, (ni, _, ms))| {
        ms.iter()
            .filter(|m| alignment.answer_concepts.contains(&m.concept))
            .map(move |m| (i, m.assertion, alignment.concepts[&m.concept] * notes[*ni].sections[m.section].weight))
    });
    let answer = vote(votes, rules);
    let windows: Vec<ContextWindow> = kept.into_iter().map(|(_, w, _)| w).collect();
    Context { tokens: windows.iter().map(|w| w.tokens).sum(), windows, answer, mentions_found, answer_mentions }
}

/// Decides from votes `(window index, assertion, weight)`.
pub fn vote(votes: impl Iterator<Item = (usize, Assertion, f32)>, rules: Rules) -> Answer {
    let mut weight = [0.0f32; 3]; // present, uncertain, absent
    let mut by_label: [Vec<usize>; 3] = Default::default();
    for (window, a, w) in votes {
        if a.family {
            continue;
        }
        let slot = if a.negated {
            2
        } else if a.votes_uncertain(rules.differential_is_present) {
            1
        } else if !a.historical || rules.historical_is_present {
            0
        } else {
            2 // past, and the question is about now
        };
        weight[slot] += w.max(0.01);
        if !by_label[slot].contains(&window) {
            by_label[slot].push(window);
        }
    }
    let total: f32 = weight.iter().sum();
    let slot = if total == 0.0 {
        None
    } else if rules.decision == Decision::AnyPresent {
        Some(if weight[0] > 0.0 {
            0
        } else if weight[1] > 0.0 {
            1
        } else {
            2
        })
    } else if weight[0] >= weight[1] && weight[0] >= weight[2] {
        Some(0)
    } else if weight[1] >= weight[2] {
        Some(1)
    } else {
        Some(2)
    };
    match slot {
        None => Answer { status: Label::NotMentioned, confidence: 1.0, supporting: Vec::new() },
        Some(s) => Answer {
            status: [Label::Present, Label::Uncertain, Label::Absent][s],
            confidence: weight[s] / total,
            supporting: std::mem::take(&mut by_label[s]),
        },
    }
}

pub fn assertion_name(a: &Assertion) -> &'static str {
    if a.negated {
        "negated"
    } else if a.uncertain {
        "uncertain"
    } else if a.hypothetical {
        "hypothetical"
    } else if a.family {
        "family"
    } else if a.historical {
        "historical"
    } else {
        "affirmed"
    }
}

/// Case and whitespace folded (copy-forward detection).
/// A retrieved passage of one of the patient's notes (a chunk), offered to [`fill`].
#[derive(Debug, Clone, Copy)]
pub struct Passage<'a> {
    pub doc_id: &'a str,
    /// Byte offsets in the note's text.
    pub start: usize,
    pub end: usize,
    pub text: &'a str,
    /// Its tokens when already counted with the same tokenizer (a stored chunk's `tokens`); counted here otherwise.
    pub tokens: Option<usize>,
}

/// How many retrieved passages to offer [`fill`] (or the hybrid fallback) for a budget: one per 32 tokens (at least
/// 8) — chunks hold 100–200 tokens, so that leaves room for the ones skipped as overlapping, repeated or too large.
pub fn fill_candidates(budget_tokens: usize) -> usize {
    (budget_tokens / 32).max(8)
}

/// A passage [`fill`] took: which, the part kept (byte offsets in the note) and its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filled {
    pub index: usize,
    pub start: usize,
    pub end: usize,
    pub tokens: usize,
}

/// Fills what the windows left of the budget with retrieved passages, in the order given (best first). A passage
/// that overlaps kept windows of its note is cut to its longest part outside them (chunks overlap their neighbours
/// by a sentence, so the one after a window often starts inside it); one wholly inside a window, one repeating the
/// text of a window or of a passage already taken (copy-forward), and one too large for what is left are skipped.
pub fn fill(
    windows: &[ContextWindow],
    passages: &[Passage<'_>],
    budget_tokens: usize,
    count_tokens: &dyn Fn(&str) -> usize,
) -> Vec<Filled> {
    let used: usize = windows.iter().map(|w| w.tokens).sum();
    let mut remaining = budget_tokens.saturating_sub(used);
    let mut seen: HashSet<String> = windows.iter().map(|w| fold(&w.text)).collect();
    let mut taken = Vec::new();
    for (index, p) in passages.iter().enumerate() {
        if remaining == 0 {
            break;
        }
        let Some((start, end)) = outside(windows, p) else { continue };
        let text = &p.text[start - p.start..end - p.start];
        if text.trim().is_empty() {
            continue;
        }
        let tokens = match p.tokens {
            Some(t) if (start, end) == (p.start, p.end) => t,
            _ => count_tokens(text),
        };
        if tokens > remaining || !seen.insert(fold(text)) {
            continue;
        }
        remaining -= tokens;
        taken.push(Filled { index, start, end, tokens });
    }
    taken
}

/// The longest part of a passage outside the windows of its note (byte offsets in the note), or `None` when
/// nothing is left (or the passage's offsets do not match its text, so it cannot be cut).
fn outside(windows: &[ContextWindow], p: &Passage<'_>) -> Option<(usize, usize)> {
    let mut covered: Vec<(usize, usize)> = windows
        .iter()
        .filter(|w| w.doc_id == p.doc_id && w.start < p.end && p.start < w.end)
        .map(|w| (w.start.max(p.start), w.end.min(p.end)))
        .collect();
    if covered.is_empty() {
        return Some((p.start, p.end));
    }
    if p.end.checked_sub(p.start) != Some(p.text.len()) {
        return None;
    }
    covered.sort_unstable();
    let mut best: Option<(usize, usize)> = None;
    let mut at = p.start;
    for (s, e) in covered.into_iter().chain([(p.end, p.end)]) {
        if s > at && best.is_none_or(|(a, b)| s - at > b - a) {
            best = Some((at, s));
        }
        at = at.max(e);
    }
    best.filter(|&(a, b)| p.text.is_char_boundary(a - p.start) && p.text.is_char_boundary(b - p.start))
}

fn fold(text: &str) -> String {
    text.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::Settings;
    use crate::model::Document;
    use crate::query::align::{AlignParams, LabelIndex, align};
    use crate::stages::Pipeline;

    pub(crate) fn pipeline() -> Pipeline {
        Pipeline::new(&Settings::load_from(None, Some(Default::default())).unwrap()).unwrap()
    }

    /// A processed note of `Patient/t`.
    pub(crate) fn doc(p: &Pipeline, id: &str, date: &str, text: &str) -> Document {
        use base64::Engine as _;
        let event = serde_json::json!({
            "resourceType": "DocumentReference", "id": id, "date": date, "meta": {"versionId": "1"},
            "subject": {"reference": "Patient/t"},
            "content": [{"attachment": {"contentType": "text/plain",
                "data": base64::engine::general_purpose::STANDARD.encode(text)}}]
        });
        p.process(event.to_string().as_bytes()).unwrap()
    }

    fn words(text: &str) -> usize {
        word_spans(text).len()
    }

    fn context(p: &Pipeline, docs: &[Document], question: &str, budget: usize, window: usize) -> Context {
        let a = align(question, &[], p.lexicon(), p.variables(), &LabelIndex::default(), None, AlignParams::default());
        let notes: Vec<PatientNote<'_>> = docs.iter().map(PatientNote::from).collect();
        assemble(&notes, &a, p.variables(), p.lexicon(), ContextParams::new(budget, window), &words)
    }

    fn filler(n: usize) -> String {
        (0..n).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn windows_merge_within_a_note_are_cut_to_the_budget_and_ordered_by_date() {
        let p = pipeline();
        let newer = doc(
            &p,
            "n2",
            "2024-03-01",
            &format!("IMPRESSION: Small left pleural effusion. {} Pleural effusion again seen.", filler(12)),
        );
        let older =
            doc(&p, "n1", "2023-01-01", &format!("FINDINGS: {} No pleural effusion. {}", filler(40), filler(40)));
        let docs = [newer, older];
        let c = context(&p, &docs, "Is there a pleural effusion?", 1000, 10);
        // Two mentions 12 words apart with ±10-word windows: one merged window in n2; one window in n1.
        assert_eq!(c.windows.len(), 2, "{:?}", c.windows);
        assert_eq!(c.windows[0].doc_id, "n1", "ordered by date");
        assert_eq!(c.windows[1].doc_id, "n2");
        assert_eq!(c.windows[1].concepts.len(), 2, "the merged window holds both mentions");
        assert!(c.windows[0].text.starts_with("w") && c.windows[0].text.contains("No pleural effusion"));
        assert_eq!(c.tokens, c.windows.iter().map(|w| w.tokens).sum::<usize>());
        assert_eq!(c.windows[0].tokens, words(&c.windows[0].text));
        // An affirmed impression outweighs a negated finding.
        assert_eq!(c.answer.status, Label::Present);
        assert_eq!(c.answer.supporting, [1]);
        // A budget smaller than both: the best window (impression, weight 1.0) shrinks around its mentions first.
        let small = context(&p, &docs, "Is there a pleural effusion?", 20, 10);
        assert!(small.tokens <= 20, "{}", small.tokens);
        assert_eq!(small.windows[0].doc_id, "n2");
        assert!(small.windows[0].text.contains("Small left pleural effusion"));
    }

    #[test]
    fn related_windows_keep_a_share_of_the_budget_when_the_answer_target_is_not_mentioned() {
        let p = pipeline();
        let lexicon = p.lexicon();
        // The question's target (a pneumothorax) is in no note; a related concept (an effusion) is in both.
        let ptx = lexicon.term_concept("pneumothorax").unwrap();
        let effusion = lexicon.term_concept("pleural effusion").unwrap();
        let mut a = Alignment::default();
        a.concepts.insert(ptx, 1.0);
        a.concepts.insert(effusion, 0.5);
        a.answer_concepts.insert(ptx);
        let docs = [
            doc(&p, "n1", "2024-01-01", &format!("FINDINGS: {} Small pleural effusion. {}", filler(60), filler(60))),
            doc(&p, "n2", "2024-02-01", &format!("FINDINGS: {} Pleural effusion again. {}", filler(60), filler(60))),
        ];
        let notes: Vec<PatientNote<'_>> = docs.iter().map(PatientNote::from).collect();
        let at = |share: f32| {
            let params = ContextParams { related_share: share, ..ContextParams::new(200, 50) };
            assemble(&notes, &a, p.variables(), lexicon, params, &words)
        };
        let (all, quarter, none) = (at(1.0), at(0.25), at(0.0));
        assert_eq!(all.answer_mentions, 0);
        assert_eq!(all.mentions_found, 2);
        assert!(all.tokens > 50 && all.tokens <= 200, "unlimited, the related windows take the budget: {}", all.tokens);
        assert!(all.windows.iter().all(|w| w.path == Path::Related), "{:?}", all.windows);
        assert!(!quarter.windows.is_empty() && quarter.tokens <= 50, "a quarter of 200: {}", quarter.tokens);
        assert!(none.windows.is_empty() && none.tokens == 0);
        assert_eq!(all.answer.status, Label::NotMentioned, "related mentions never vote");
        // Once the answer target is mentioned, the whole budget is the windows' again, and its window says so.
        let with_target =
            [doc(&p, "n0", "2023-12-01", "IMPRESSION: Small right pneumothorax."), docs[0].clone(), docs[1].clone()];
        let notes: Vec<PatientNote<'_>> = with_target.iter().map(PatientNote::from).collect();
        let params = ContextParams { related_share: 0.0, ..ContextParams::new(200, 50) };
        let c = assemble(&notes, &a, p.variables(), lexicon, params, &words);
        assert_eq!(c.answer_mentions, 1);
        assert!(c.tokens > 50, "{}", c.tokens);
        assert_eq!(c.windows[0].path, Path::AnswerTarget);
        assert!(c.windows[1..].iter().all(|w| w.path == Path::Related));
        assert_eq!(c.answer.status, Label::Present);
    }

    #[test]
    fn cptf_filters_each_window_so_more_of_them_fit_the_budget() {
        let p = pipeline();
        let docs: Vec<Document> = (0..6)
            .map(|i| {
                // Distinct notes (copies would be dropped as copy-forward).
                let text = format!("FINDINGS: {} Small pleural effusion. {}", filler(30 + i), filler(30));
                doc(&p, &format!("n{i}"), &format!("2024-0{}-01", i + 1), &text)
            })
            .collect();
        let a = align(
            "Is there a pleural effusion?",
            &[],
            p.lexicon(),
            p.variables(),
            &LabelIndex::default(),
            None,
            AlignParams::default(),
        );
        let notes: Vec<PatientNote<'_>> = docs.iter().map(PatientNote::from).collect();
        // A stand-in for the model: keeps the mentions and the first words up to the allowance.
        let filter = |text: &str, spans: &[(usize, usize)], allowance: usize| {
            let tokens: Vec<crate::query::cptf::Token> = word_spans(text)
                .into_iter()
                .enumerate()
                .map(|(i, (start, end))| crate::query::cptf::Token { start, end, importance: 1.0 / (1 + i) as f32 })
                .collect();
            let kept = crate::query::cptf::filter(text, &tokens, spans, allowance);
            let n = words(&kept.text);
            (kept.text, n)
        };
        let plain = assemble(&notes, &a, p.variables(), p.lexicon(), ContextParams::new(150, 20), &words);
        let params =
            ContextParams { compress: Some(Compress { ratio: 0.5, filter: &filter }), ..ContextParams::new(150, 20) };
        let compressed = assemble(&notes, &a, p.variables(), p.lexicon(), params, &words);
        assert!(compressed.tokens <= 150 && plain.tokens <= 150);
        assert!(
            compressed.windows.len() > plain.windows.len(),
            "{} vs {}",
            compressed.windows.len(),
            plain.windows.len()
        );
        for w in &compressed.windows {
            let before = w.compressed_from.expect("filtered");
            assert!(w.tokens <= before.div_ceil(2) && w.tokens == words(&w.text), "{w:?}");
            assert!(w.text.contains("pleural effusion"), "the mention is kept: {}", w.text);
            assert!(w.end - w.start > w.text.len(), "start..end is still the source span");
        }
        assert!(plain.windows.iter().all(|w| w.compressed_from.is_none()));
        // The answer is voted by the same mentions.
        assert_eq!((compressed.answer.status, plain.answer.status), (Label::Present, Label::Present));
        assert_eq!(compressed.answer.supporting.len(), compressed.windows.len());
    }

    #[test]
    fn fill_takes_the_nearest_passages_that_add_text_inside_what_the_windows_left() {
        let p = pipeline();
        let text = format!("FINDINGS: {} Small left pleural effusion. {}", filler(30), filler(30));
        let docs = [doc(&p, "n1", "2024-03-01", &text)];
        let c = context(&p, &docs, "Is there a pleural effusion?", 40, 5);
        assert_eq!(c.windows.len(), 1);
        let (ws, we) = (c.windows[0].start, c.windows[0].end);
        let used = c.tokens;
        let other = "The cardiomediastinal silhouette is within normal limits.";
        let long = filler(40);
        let passage =
            |doc_id, start: usize, end: usize| Passage { doc_id, start, end, text: &text[start..end], tokens: None };
        // Starts two words before the window and ends inside it: cut to the two words.
        let before = text[..ws].trim_end().rfind(' ').and_then(|i| text[..i].rfind(' ')).unwrap() + 1;
        let passages = [
            passage("n1", ws + 1, we - 1), // wholly inside the window: skipped
            Passage { doc_id: "n2", start: 0, end: other.len(), text: other, tokens: None }, // another note: taken whole
            Passage { doc_id: "n3", start: 0, end: other.len(), text: other, tokens: None }, // the same text again: skipped
            passage("n1", before, we - 3), // overlapping: cut to its part before the window
            Passage { doc_id: "n4", start: 0, end: long.len(), text: &long, tokens: None }, // too large for what is left: skipped
            passage("n1", we, we),                                                          // empty: skipped
        ];
        let taken = fill(&c.windows, &passages, 40, &words);
        let idx: Vec<usize> = taken.iter().map(|t| t.index).collect();
        assert_eq!(idx, [1, 3], "{taken:?}");
        assert_eq!((taken[0].start, taken[0].end, taken[0].tokens), (0, other.len(), words(other)));
        assert_eq!((taken[1].start, taken[1].end), (before, ws));
        assert_eq!(text[taken[1].start..taken[1].end].split_whitespace().count(), 2);
        assert_eq!(taken[1].tokens, 2);
        let total = used + taken.iter().map(|t| t.tokens).sum::<usize>();
        assert!(total <= 40, "{total}");
        // A passage spanning the window: its longer side is kept.
        let wide = fill(&c.windows, &[passage("n1", 0, text.len())], 1000, &words);
        assert_eq!(wide.len(), 1);
        let (left, right) = (ws, text.len() - we);
        assert_eq!((wide[0].start, wide[0].end), if left >= right { (0, ws) } else { (we, text.len()) });
        // Offsets that do not match the text: an overlapping passage cannot be cut, so it is skipped.
        let odd = Passage { doc_id: "n1", start: 0, end: text.len(), text: "short", tokens: None };
        assert!(fill(&c.windows, &[odd], 1000, &words).is_empty());
        // A count given with the passage is used for an uncut passage (and only then).
        let counted = Passage { tokens: Some(3), ..passages[1] };
        assert_eq!(fill(&c.windows, &[counted], 40, &words)[0].tokens, 3);
        let cut = Passage { tokens: Some(99), ..passages[3] };
        assert_eq!(fill(&c.windows, &[cut], 40, &words)[0].tokens, 2);
        // Nothing left of the budget: nothing taken.
        assert!(fill(&c.windows, &passages, used, &words).is_empty());
        assert!(fill(&c.windows, &passages, 0, &words).is_empty());
    }

    #[test]
    fn token_ends_cut_the_same_windows_with_fewer_exact_counts() {
        use std::cell::Cell;
        let p = pipeline();
        let docs = [
            doc(
                &p,
                "n2",
                "2024-03-01",
                &format!("IMPRESSION: Small left pleural effusion. {} Pleural effusion again seen.", filler(12)),
            ),
            doc(&p, "n1", "2023-01-01", &format!("FINDINGS: {} No pleural effusion. {}", filler(40), filler(40))),
            doc(&p, "n0", "2022-06-01", &format!("HPI: {} Effusion on the left, small. {}", filler(70), filler(9))),
        ];
        let a = align(
            "Is there a pleural effusion?",
            &[],
            p.lexicon(),
            p.variables(),
            &LabelIndex::default(),
            None,
            AlignParams::default(),
        );
        let notes: Vec<PatientNote<'_>> = docs.iter().map(PatientNote::from).collect();
        let calls = Cell::new(0usize);
        let count = |t: &str| {
            calls.set(calls.get() + 1);
            words(t)
        };
        // Where each word ends (this test's tokenizer: one token per word), an under- and an over-estimate.
        let exact_ends = |t: &str| word_spans(t).into_iter().map(|(_, e)| e).collect::<Vec<_>>();
        let under = |t: &str| word_spans(t).into_iter().step_by(2).map(|(_, e)| e).collect::<Vec<_>>();
        let over = |t: &str| word_spans(t).into_iter().flat_map(|(_, e)| [e, e]).collect::<Vec<_>>();
        let (mut exact_calls, mut ends_calls) = (0, 0);
        for budget in [8, 15, 23, 40, 57, 90] {
            let params = ContextParams::new(budget, 20);
            calls.set(0);
            let plain = assemble(&notes, &a, p.variables(), p.lexicon(), params, &count);
            exact_calls += calls.get();
            assert!(plain.tokens <= budget && !plain.windows.is_empty(), "{budget}");
            calls.set(0);
            let with = assemble_with(&notes, &a, p.variables(), p.lexicon(), params, &count, Some(&exact_ends));
            ends_calls += calls.get();
            assert_eq!(with, plain, "budget {budget}");
            // A wrong estimate only costs counts: the cut is checked exactly and searched again when it is off.
            for wrong in [&under as &dyn Fn(&str) -> Vec<usize>, &over] {
                let c = assemble_with(&notes, &a, p.variables(), p.lexicon(), params, &count, Some(wrong));
                assert_eq!(c, plain, "budget {budget}");
            }
        }
        assert!(ends_calls < exact_calls, "{ends_calls} exact counts with token ends, {exact_calls} without");
    }

    #[test]
    fn copy_forward_passages_are_dropped_and_the_budget_stays_constant_as_the_record_grows() {
        let p = pipeline();
        let passage = "ASSESSMENT: Cardiomegaly, stable. Continue diuretics.";
        let mut docs = vec![doc(&p, "a0", "2024-01-01", passage)];
        let one = context(&p, &docs, "Does the patient have cardiomegaly?", 200, 20);
        assert_eq!(one.windows.len(), 1);
        for i in 1..30 {
            docs.push(doc(&p, &format!("a{i}"), &format!("2024-02-{:02}", i % 28 + 1), passage));
        }
        let many = context(&p, &docs, "Does the patient have cardiomegaly?", 200, 20);
        assert_eq!(many.windows.len(), 1, "copied-forward text appears once");
        assert_eq!(many.mentions_found, 30);
        // Most recent copy kept (recency breaks the tie).
        assert!(many.windows[0].date.as_deref().unwrap() >= "2024-02-28", "{:?}", many.windows[0].date);
        // Distinct passages: the budget caps the context however many notes there are.
        let mut distinct: Vec<Document> = Vec::new();
        for i in 0..60 {
            let text = format!("ASSESSMENT: Cardiomegaly noted on visit {i}. {}", filler(30));
            distinct.push(doc(&p, &format!("d{i}"), "2024-05-01", &text));
        }
        let capped = context(&p, &distinct, "Does the patient have cardiomegaly?", 300, 20);
        assert!(capped.tokens <= 300 && capped.tokens > 250, "{}", capped.tokens);
        assert_eq!(capped.mentions_found, 60);
    }

    #[test]
    fn stored_windows_give_the_same_context_as_whole_notes() {
        use crate::query::windows::{StoredWindow, WindowNote, build, relations};
        let p = pipeline();
        let mut docs = Vec::new();
        for i in 0..12usize {
            let text = format!(
                "HISTORY OF PRESENT ILLNESS: Shortness of breath. {a} No chest pain. {b}\n\nFINDINGS: {c} Small \
                 left pleural effusion. {d} Possible pneumothorax on the right. {e}\n\nIMPRESSION: Cardiomegaly. \
                 {f} Pleural effusion, stable. No pneumothorax.",
                a = filler(3 + i * 7),
                b = filler(40 - i),
                c = filler(i * 13 % 50),
                d = filler(5 + i * 11 % 70),
                e = filler(20),
                f = filler(i * 17 % 90),
            );
            docs.push(doc(&p, &format!("e{i}"), &format!("2024-0{}-01", 1 + i % 9), &text));
        }
        // Two copies of one note: copy-forward detection must behave alike too.
        docs.push(doc(&p, "copy", "2024-12-01", &docs[3].note.text.clone()));
        for stored_radius in [30usize, 60] {
            let notes: Vec<WindowNote> = docs
                .iter()
                .flat_map(|d| {
                    let rel = relations(&d.kg);
                    let ws = build(&d.note.text, &d.sections, &d.mentions, &rel, p.lexicon(), stored_radius);
                    ws.into_iter().map(move |w| (d, w))
                })
                .map(|(d, w)| {
                    // Through the payload's JSON form, as the store keeps it.
                    let w: StoredWindow = serde_json::from_value(serde_json::to_value(&w).unwrap()).unwrap();
                    WindowNote::new(d.note.doc_id.clone(), "1".into(), d.note.date.clone(), w, p.lexicon())
                })
                .collect();
            let stored: Vec<PatientNote<'_>> = notes.iter().map(PatientNote::from).collect();
            let whole: Vec<PatientNote<'_>> = docs.iter().map(PatientNote::from).collect();
            if stored_radius == 30 {
                assert!(stored.len() > docs.len(), "some notes keep more than one window at radius 30");
            }
            for question in ["Is there a pleural effusion?", "Does the patient have a pneumothorax?", "Chest pain?"] {
                let a =
                    align(question, &[], p.lexicon(), p.variables(), &LabelIndex::default(), None, Default::default());
                for (radius, budget) in [(10, 120), (stored_radius, 400), (stored_radius / 2, 2000)] {
                    let params = ContextParams::new(budget, radius);
                    let from_whole = assemble(&whole, &a, p.variables(), p.lexicon(), params, &words);
                    let from_stored = assemble(&stored, &a, p.variables(), p.lexicon(), params, &words);
                    assert!(!from_whole.windows.is_empty(), "{question}");
                    assert_eq!(from_stored, from_whole, "{question} radius {radius} budget {budget}");
                }
            }
        }
    }

    #[test]
    fn a_head_of_another_site_or_outside_an_imaging_section_is_no_window_of_the_variable() {
        use crate::query::windows::{WindowNote, build, relations};
        let p = pipeline();
        let lexicon = p.lexicon();
        let docs = [
            doc(
                &p,
                "legs",
                "2024-02-01",
                &format!("{} EXTREMITIES: 2+ ankle edema bilaterally. {}", filler(30), filler(30)),
            ),
            doc(&p, "cxr", "2024-01-01", &format!("{} IMPRESSION: No pulmonary edema. {}", filler(30), filler(30))),
            // In an examination the head alone is the limbs' (the variable's `elliptic_sections`).
            doc(
                &p,
                "exam",
                "2024-03-01",
                &format!("PHYSICAL EXAMINATION: Lungs clear. 1+ pitting edema. {}", filler(30)),
            ),
        ];
        let question = "Is there pulmonary edema?";
        let c = context(&p, &docs, question, 1000, 10);
        assert!(c.windows.iter().all(|w| w.doc_id != "legs" && w.doc_id != "exam"), "{:?}", c.windows);
        assert_eq!(c.answer.status, Label::Absent, "the chest film's negation decides, not the ankles");
        // The same from the stored windows the service reads.
        let notes: Vec<WindowNote> = docs
            .iter()
            .flat_map(|d| {
                build(&d.note.text, &d.sections, &d.mentions, &relations(&d.kg), lexicon, 30)
                    .into_iter()
                    .map(move |w| WindowNote::new(d.note.doc_id.clone(), "1".into(), None, w, lexicon))
            })
            .collect();
        assert!(notes.iter().any(|n| n.doc_id == "legs"), "the ankle's window is stored (its anatomy mention)");
        assert!(notes.iter().any(|n| n.doc_id == "exam"), "the examination's window is stored (the lungs)");
        let stored: Vec<PatientNote<'_>> = notes.iter().map(PatientNote::from).collect();
        let a = align(question, &[], p.lexicon(), p.variables(), &LabelIndex::default(), None, Default::default());
        let from_stored = assemble(&stored, &a, p.variables(), p.lexicon(), ContextParams::new(1000, 10), &words);
        assert!(
            from_stored.windows.iter().all(|w| w.doc_id != "legs" && w.doc_id != "exam"),
            "{:?}",
            from_stored.windows
        );
        assert_eq!(from_stored.answer.status, Label::Absent);
        // Without the anatomy term the head alone is the variable's (the rule removes only the other site's).
        let bare = [doc(&p, "b", "2024-03-01", &format!("{} IMPRESSION: Mild edema. {}", filler(30), filler(30)))];
        let c = context(&p, &bare, question, 1000, 10);
        assert_eq!(c.answer.status, Label::Present, "{:?}", c.windows);
        // The examination alone: no vote.
        let c = context(&p, &docs[2..], question, 1000, 10);
        assert_eq!(c.answer.status, Label::NotMentioned, "{:?}", c.windows);
    }

    #[test]
    fn answers_follow_assertions_and_the_variable_rules() {
        let p = pipeline();
        let ask = |text: &str| {
            let d = [doc(&p, "x", "2024-01-01", text)];
            context(&p, &d, "Is there a pneumothorax?", 500, 30).answer.status
        };
        assert_eq!(ask("IMPRESSION: No pneumothorax."), Label::Absent);
        assert_eq!(ask("IMPRESSION: Small apical pneumothorax."), Label::Present);
        assert_eq!(ask("IMPRESSION: Possible small pneumothorax."), Label::Uncertain);
        assert_eq!(ask("IMPRESSION: Lungs are clear."), Label::NotMentioned);
        // pneumothorax: historical_is_present = false, any_present.
        assert_eq!(ask("IMPRESSION: History of pneumothorax."), Label::Absent);
        assert_eq!(ask("FINDINGS: No pneumothorax. IMPRESSION: Tiny right pneumothorax."), Label::Present);
    }

    #[test]
    fn vote_weights_and_family_mentions() {
        let rules = Rules { decision: Decision::Weighted, historical_is_present: true, differential_is_present: false };
        let neg = Assertion { negated: true, ..Default::default() };
        let fam = Assertion { family: true, ..Default::default() };
        let a = vote([(0, Assertion::default(), 0.5), (1, neg, 0.9), (2, fam, 1.0)].into_iter(), rules);
        assert_eq!(a.status, Label::Absent);
        assert_eq!(a.supporting, [1]);
        assert!((a.confidence - 0.9 / 1.4).abs() < 1e-6);
        let any = Rules { decision: Decision::AnyPresent, ..rules };
        assert_eq!(vote([(0, Assertion::default(), 0.5), (1, neg, 0.9)].into_iter(), any).status, Label::Present);
        assert_eq!(vote([(0, fam, 1.0)].into_iter(), rules).status, Label::NotMentioned);
        // A differential with no other hedge: uncertain, or present where the variable counts it.
        let dx = Assertion { uncertain: true, differential: true, ..Default::default() };
        let hedged = Assertion { uncertain: true, ..Default::default() };
        assert_eq!(vote([(0, dx, 1.0)].into_iter(), any).status, Label::Uncertain);
        let coded = Rules { differential_is_present: true, ..any };
        assert_eq!(vote([(0, dx, 1.0)].into_iter(), coded).status, Label::Present);
        assert_eq!(vote([(0, hedged, 1.0)].into_iter(), coded).status, Label::Uncertain);
    }
}
