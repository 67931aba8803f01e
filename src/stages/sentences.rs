//! Section bodies → sentence spans, with rules for clinical text in the spirit of PyRuSH.
//!
//! Boundaries: `.` `?` `!` followed by whitespace and a capital, digit or bracket (or the end); a blank line;
//! a single line break when the next line starts a list item, or the line before ends in punctuation or is
//! short (templated notes), and the next line starts with a capital or digit; the end of a section (headers are
//! always boundaries). MTSamples' lost line breaks (`.,`) count as breaks.
//!
//! Not boundaries: titles and Latin abbreviations (`Dr.`, `Mr.`, `vs.`, `e.g.`, `approx.`), initials (`J. Smith`),
//! decimals and vitals (`4.7`, `BP 120/80.` only ends a sentence when a capital follows), enumerators
//! (`1. Left atrial…`), and dose abbreviations followed by lower case (`p.o. b.i.d.`). A sentence longer than
//! `sentences.max_sentence_bytes` is cut at whitespace so later stages stay bounded. Cannot fail.

use crate::model::{Section, Sentence};

/// Words that never end a sentence when followed by `.` (lower-case, without the final dot).
const NEVER_END: &[&str] = &[
    "dr", "mr", "mrs", "ms", "prof", "sr", "st", "vs", "v", "e.g", "i.e", "cf", "approx", "appt", "dept", "fig", "no",
    "nos", "resp", "temp", "wt", "ht", "hr", "est", "incl", "min", "max", "pt", "pts", "ca", "viz", "al",
];

#[derive(Debug, Clone)]
pub struct SentenceParams {
    pub max_sentence_bytes: usize,
}

impl SentenceParams {
    pub fn from_settings(s: &crate::config::Settings) -> Self {
        Self { max_sentence_bytes: s.sentences.max_sentence_bytes }
    }
}

/// Splits every section's body into sentences, in text order.
pub fn split(text: &str, sections: &[Section], p: &SentenceParams) -> Vec<Sentence> {
    let mut out = Vec::new();
    for (index, s) in sections.iter().enumerate() {
        split_span(text, s.body_start.min(s.end), s.end, index, p, &mut out);
    }
    out
}

/// Splits `text[start..end]` and appends to `out`.
pub fn split_span(text: &str, start: usize, end: usize, section: usize, p: &SentenceParams, out: &mut Vec<Sentence>) {
    let bytes = text.as_bytes();
    let mut sent_start = start;
    let mut i = start;
    while i < end {
        i = next_mark(bytes, i, end);
        if i == end {
            break;
        }
        let b = bytes[i];
        let boundary_end = match b {
            b'.' | b'?' | b'!' => terminal(text, sent_start, i, end),
            b'\n' => line_break(text, sent_start, i, end),
            _ => None,
        };
        if let Some(cut) = boundary_end {
            emit(text, sent_start, cut, section, p, out);
            sent_start = cut;
            i = cut.max(i + 1);
        } else {
            i += 1;
        }
    }
    emit(text, sent_start, end, section, p, out);
}

/// The first `.` `?` `!` or line break in `bytes[i..end]`, or `end`; 8 bytes per step.
#[inline]
fn next_mark(bytes: &[u8], mut i: usize, end: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    // The top bit of each byte of `x` equal to `b` (exact: `(v & LOW7) + LOW7` never carries into a neighbour).
    let equal = |x: u64, b: u8| {
        let v = x ^ (ONES * u64::from(b));
        !(((v & LOW7) + LOW7) | v | LOW7)
    };
    while i + 8 <= end {
        let x = u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let marks = equal(x, b'.') | equal(x, b'?') | equal(x, b'!') | equal(x, b'\n');
        if marks != 0 {
            return i + (marks.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < end && !matches!(bytes[i], b'.' | b'?' | b'!' | b'\n') {
        i += 1;
    }
    i
}

/// At a `.?!` at `i`: where the sentence ends, if it ends here.
fn terminal(text: &str, sent_start: usize, i: usize, end: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    // Closing quotes and brackets belong to the sentence they close.
    let mut j = i + 1;
    while j < end && matches!(bytes[j], b'"' | b'\'' | b')' | b']' | b'.' | b'?' | b'!') {
        j += 1;
    }
    let cut = j;
    // MTSamples: `.,` stands for a lost line break.
    if j < end && bytes[j] == b',' && bytes[i] == b'.' {
        j += 1;
    }
    let gap_start = j;
    while j < end && matches!(bytes[j], b' ' | b'\t' | b'\n') {
        j += 1;
    }
    if j >= end {
        return Some(cut);
    }
    if j == gap_start && gap_start <= cut {
        return None; // `4.7`, `p.o`, `a.m.` — no space after the dot.
    }
    let next = bytes[j];
    if !(next.is_ascii_uppercase() || next.is_ascii_digit() || matches!(next, b'"' | b'(' | b'[' | b'-' | b'*' | b'#'))
    {
        return None;
    }
    if bytes[i] == b'.' && !ends_sentence_word(text, sent_start, i) {
        return None;
    }
    Some(cut)
}

/// Whether the word before the `.` at `dot` can end a sentence.
fn ends_sentence_word(text: &str, sent_start: usize, dot: usize) -> bool {
    let before = &text[sent_start..dot];
    let word_start = before
        .char_indices()
        .rev()
        .find(|(_, c)| c.is_whitespace() || *c == '(' || *c == ',')
        .map_or(0, |(p, c)| p + c.len_utf8());
    let word = &before[word_start..];
    if word.is_empty() {
        return true;
    }
    // Enumerator at the start of a sentence: `1.`, `a.`, `IV.`
    if before.trim_start_matches([' ', ',', ';']).len() == word.len()
        && (word.bytes().all(|b| b.is_ascii_digit()) && word.len() <= 2
            || word.len() == 1 && word.as_bytes()[0].is_ascii_lowercase()
            || matches!(word, "I" | "II" | "III" | "IV" | "V" | "VI"))
    {
        return false;
    }
    // Initials: a single capital letter (`J. Smith`), unless a number precedes it (`98.6 F.`).
    if word.len() == 1 && word.as_bytes()[0].is_ascii_uppercase() {
        let prev_word = before[..word_start].trim_end();
        if !prev_word.ends_with(|c: char| c.is_ascii_digit()) {
            return false;
        }
    }
    let word = word.trim_start_matches(['"', '\'', '[']);
    !NEVER_END.iter().any(|never| never.eq_ignore_ascii_case(word))
}

/// At a `\n` at `i`: where the sentence ends, if it ends here.
fn line_break(text: &str, sent_start: usize, i: usize, end: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    // Blank line: always a boundary.
    let mut j = i + 1;
    while j < end && matches!(bytes[j], b' ' | b'\t') {
        j += 1;
    }
    if j >= end {
        return Some(i);
    }
    if bytes[j] == b'\n' {
        return Some(i);
    }
    let line_start = text[..i].rfind('\n').map_or(0, |p| p + 1).max(sent_start);
    let prev = text[line_start..i].trim_end();
    if prev.is_empty() {
        return None;
    }
    let next_line = &text[j..end];
    if starts_list_item(next_line) {
        return Some(i);
    }
    let next = bytes[j];
    let next_starts = next.is_ascii_uppercase() || next.is_ascii_digit();
    let prev_closed = prev.ends_with(['.', '?', '!', ':', ';']);
    let prev_short = prev.len() < 50;
    (next_starts && (prev_closed || prev_short)).then_some(i)
}

fn starts_list_item(line: &str) -> bool {
    let b = line.as_bytes();
    if line.starts_with("- ") || line.starts_with("* ") || line.starts_with("• ") || line.starts_with("+ ") {
        return true;
    }
    let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
    (1..=3).contains(&digits) && matches!(b.get(digits), Some(b'.' | b')')) && b.get(digits + 1) == Some(&b' ')
}

/// Trims the span and records it (cut into pieces no longer than the limit).
fn emit(text: &str, start: usize, end: usize, section: usize, p: &SentenceParams, out: &mut Vec<Sentence>) {
    let span = &text[start..end];
    let lead = span.len() - span.trim_start_matches(|c: char| c.is_whitespace() || c == ',' || c == ';').len();
    let (mut s, e) = (start + lead, start + span.trim_end().len());
    if s >= e
        || !text[s..e].bytes().any(|b| b.is_ascii_alphanumeric()) && !text[s..e].chars().any(char::is_alphanumeric)
    {
        return;
    }
    while e - s > p.max_sentence_bytes {
        let mut cut = s + p.max_sentence_bytes;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let piece_end = text[s..cut].rfind(char::is_whitespace).map(|w| s + w).filter(|&w| w > s).unwrap_or(cut);
        let trimmed_end = s + text[s..piece_end].trim_end().len();
        out.push(Sentence { start: s, end: trimmed_end, section });
        s = piece_end + text[piece_end..e].len() - text[piece_end..e].trim_start().len();
    }
    if s < e {
        out.push(Sentence { start: s, end: e, section });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sents(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        split_span(text, 0, text.len(), 0, &SentenceParams { max_sentence_bytes: 4000 }, &mut out);
        out.iter().map(|s| &text[s.start..s.end]).collect()
    }

    /// The 8-byte search for `.?!` and line breaks finds what a byte-by-byte one finds, from every start, with
    /// marks in every lane and multi-byte UTF-8 around them.
    #[test]
    fn marks_are_found_eight_bytes_at_a_time() {
        let text = "Pt. seen — ok?\nYes!  no…é.  end without mark and then some more text. ¿Qué?! a\n\nb";
        let bytes = text.as_bytes();
        for start in 0..bytes.len() {
            for end in start..=bytes.len() {
                let want = (start..end).find(|&k| matches!(bytes[k], b'.' | b'?' | b'!' | b'\n')).unwrap_or(end);
                assert_eq!(next_mark(bytes, start, end), want, "{start}..{end}");
            }
        }
    }

    #[test]
    fn abbreviations_do_not_split() {
        assert_eq!(
            sents("Seen by Dr. Smith today. Tylenol 500 mg p.o. b.i.d. for pain. Aspirin q.d. Compare vs. placebo."),
            vec![
                "Seen by Dr. Smith today.",
                "Tylenol 500 mg p.o. b.i.d. for pain.",
                "Aspirin q.d.",
                "Compare vs. placebo."
            ]
        );
        assert_eq!(sents("Referred by J. Smith, e.g. Here."), vec!["Referred by J. Smith, e.g. Here."]);
    }

    #[test]
    fn numbers_vitals_and_enumerations() {
        assert_eq!(
            sents("BP 120/80. Pulse 72. Temp 98.6 F. Weight 70.5 kg."),
            vec!["BP 120/80.", "Pulse 72.", "Temp 98.6 F.", "Weight 70.5 kg."]
        );
        assert_eq!(
            sents("1.  Left atrial enlargement of 4.7 cm.,2.  Normal size ventricle.,3.  No effusion."),
            vec!["1.  Left atrial enlargement of 4.7 cm.", "2.  Normal size ventricle.", "3.  No effusion."]
        );
    }

    #[test]
    fn line_breaks() {
        assert_eq!(
            sents(
                "Medications:\n- Lisinopril 10 mg\n- Metformin\nThe patient was\nadvised to rest.\n\nFollow up in 2 weeks"
            ),
            vec![
                "Medications:",
                "- Lisinopril 10 mg",
                "- Metformin",
                "The patient was\nadvised to rest.",
                "Follow up in 2 weeks"
            ]
        );
        assert_eq!(sents("Is it pain? Yes! ok"), vec!["Is it pain?", "Yes! ok"]);
    }

    #[test]
    fn long_sentences_are_cut_at_whitespace() {
        let text = "word ".repeat(100);
        let mut out = Vec::new();
        split_span(&text, 0, text.len(), 0, &SentenceParams { max_sentence_bytes: 64 }, &mut out);
        assert!(out.len() >= 7);
        for s in &out {
            assert!(s.end - s.start <= 64);
            assert!(!text[s.start..s.end].starts_with(' ') && !text[s.start..s.end].ends_with(' '));
        }
    }
}
