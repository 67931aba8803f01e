//! Note text → sections: headers as they appear in real notes, mapped to canonical names and weighted.
//!
//! Headers recognised (in text already normalised to `\n` line ends):
//! * Markdown headings (`# Chief Complaint`, `## Plan`), as Synthea writes them;
//! * `Title:` at the start of a line, optionally numbered (`2. PLAN:`), with the body on the same line or
//!   the next (`HISTORY OF PRESENT ILLNESS: The patient…`);
//! * a line holding only an ALL-CAPS title (`PHYSICAL EXAMINATION`) or only a known title in any case
//!   (`Assessment and Plan`, as HTML headings become);
//! * inline `TITLE:` after `,` `;` or `.` (MTSamples, whose transcriptions lost their line breaks).
//!
//! A known title (synonym table `data/sections/section_titles.tsv`, built by `tools/build_sections.py` from the
//! medSpaCy section patterns, NegBio's radiology titles and a curated list) maps to its canonical name; an
//! unknown ALL-CAPS title opens an `other` section; body-system sub-headings (`HEENT:`, `Lungs:`) stay inside
//! the open section. Titles of one or two letters (`S:`, `PE:`) count only in upper case. Text before the first
//! header, or a note without headers, is a `body` section. Sections tile the text: each runs to the next header.
//! This stage cannot fail.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::model::Section;

/// Every canonical section name (keys of `sections.weights`).
pub const CANONICAL_SECTIONS: &[&str] = &[
    "assessment_and_plan",
    "assessment",
    "plan",
    "impression",
    "history_of_present_illness",
    "diagnoses",
    "hospital_course",
    "findings",
    "chief_complaint",
    "problem_list",
    "body",
    "reason_for_exam",
    "physical_exam",
    "labs_and_studies",
    "imaging",
    "procedures",
    "subjective",
    "objective",
    "review_of_systems",
    "past_medical_history",
    "medications",
    "social_history",
    "addendum",
    "past_surgical_history",
    "family_history",
    "allergies",
    "comparison",
    "technique",
    "patient_instructions",
    "other",
    "signature",
];

const TITLES_TSV: &str = include_str!("../../data/sections/section_titles.tsv");

/// Longest title (bytes) considered for a header.
const MAX_TITLE: usize = 60;
/// Most words in an unknown ALL-CAPS title.
const MAX_UNKNOWN_WORDS: usize = 6;

#[derive(Debug, Clone, Copy)]
struct Entry {
    canonical: &'static str,
    sub: bool,
}

/// The synonym table, parsed once per process.
fn table() -> &'static HashMap<String, Entry> {
    static TABLE: OnceLock<HashMap<String, Entry>> = OnceLock::new();
    TABLE.get_or_init(|| {
        TITLES_TSV
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let mut cols = l.split('\t');
                let title = cols.next().unwrap_or_default().to_string();
                let canon = cols.next().unwrap_or_default();
                let canonical = CANONICAL_SECTIONS
                    .iter()
                    .find(|c| **c == canon)
                    .unwrap_or_else(|| panic!("section table names unknown canonical {canon}"));
                let sub = cols.next() == Some("sub");
                (title, Entry { canonical, sub })
            })
            .collect()
    })
}

/// Looks a title up in the synonym table (after normalisation).
pub fn canonical_for(title: &str) -> Option<&'static str> {
    lookup(title).map(|e| e.canonical)
}

/// Exact match after normalisation; otherwise the longest known title of two or more words that the title
/// starts with (`HOSPITAL COURSE AND TREATMENT` → hospital_course). Sub-headings match exactly only.
fn lookup(title: &str) -> Option<Entry> {
    let normalised = normalise(title);
    if let Some(e) = table().get(&normalised) {
        return Some(*e);
    }
    let words: Vec<&str> = normalised.split(' ').collect();
    (2..words.len().min(MAX_UNKNOWN_WORDS + 1))
        .rev()
        .find_map(|n| table().get(&words[..n].join(" ")).filter(|e| !e.sub).copied())
}

fn normalise(title: &str) -> String {
    let mut t = String::with_capacity(title.len());
    for word in title.split_whitespace() {
        if !t.is_empty() {
            t.push(' ');
        }
        t.extend(word.chars().map(|c| c.to_ascii_lowercase()));
    }
    let t = t.trim_end_matches(':').trim_end();
    let t = t.strip_suffix("(es)").or_else(|| t.strip_suffix("(s)")).unwrap_or(t).trim_end();
    t.to_string()
}

/// Weights per canonical name, resolved once from settings.
#[derive(Debug, Clone)]
pub struct SectionParams {
    weights: HashMap<&'static str, f32>,
}

impl SectionParams {
    pub fn from_settings(s: &crate::config::Settings) -> Self {
        Self { weights: CANONICAL_SECTIONS.iter().map(|c| (*c, s.section_weight(c))).collect() }
    }

    pub fn weight(&self, canonical: &str) -> f32 {
        self.weights.get(canonical).copied().unwrap_or(0.0)
    }
}

/// A header found in the text.
#[derive(Debug, Clone)]
struct Header {
    start: usize,
    body_start: usize,
    title_start: usize,
    title_end: usize,
    canonical: &'static str,
    sub: bool,
}

/// Splits a note into sections. Always returns at least one section when the text is non-empty.
pub fn split(text: &str, p: &SectionParams) -> Vec<Section> {
    let headers = find_headers(text);
    let mut sections: Vec<Section> = Vec::new();
    let push = |sections: &mut Vec<Section>, name: &'static str, title: &str, start, body_start| {
        if let Some(last) = sections.last_mut() {
            last.end = start;
        }
        sections.push(Section {
            name,
            title: title.to_string(),
            start,
            end: text.len(),
            body_start,
            weight: p.weight(name),
        });
    };
    let first = headers.iter().find(|h| !h.sub).map_or(text.len(), |h| h.start);
    if !text[..first].trim().is_empty() || headers.is_empty() {
        let start = text.len() - text.trim_start().len();
        push(&mut sections, "body", "", start.min(first), start.min(first));
    }
    for h in &headers {
        if h.sub && !sections.is_empty() {
            continue;
        }
        push(&mut sections, h.canonical, &text[h.title_start..h.title_end], h.start, h.body_start);
    }
    if let Some(last) = sections.last_mut() {
        last.end = text.trim_end().len().max(last.body_start);
    }
    // A section never ends before its body starts (a header at the very end of the text).
    for s in &mut sections {
        s.end = s.end.max(s.body_start);
    }
    sections
}

fn find_headers(text: &str) -> Vec<Header> {
    let mut headers = Vec::new();
    let mut line_start = 0;
    for line in text.split_inclusive('\n') {
        let line_end = line_start + line.trim_end_matches('\n').len();
        scan_line(text, line_start, line_end, &mut headers);
        line_start += line.len();
    }
    headers
}

/// Finds the headers in one line: at its start, then inline after separators.
fn scan_line(text: &str, start: usize, end: usize, out: &mut Vec<Header>) {
    let line = &text[start..end];
    let indent = line.len() - line.trim_start().len();
    let content_start = start + indent;
    let content = line.trim();
    if content.is_empty() {
        return;
    }
    let mut inline_from = content_start;
    if let Some(h) = markdown_header(text, content_start, end) {
        out.push(h);
        return;
    } else if let Some(h) = colon_header(text, content_start, end, true) {
        inline_from = h.body_start;
        out.push(h);
    } else if let Some(h) = whole_line_header(text, content_start, start + indent + content.len(), end) {
        out.push(h);
        return;
    }
    // Inline headers after `,` `;` `.` (MTSamples). An inline title ends at a colon within `MAX_TITLE + 1` bytes
    // of its start, so a candidate with no colon in reach is passed over without a look (the next colon is
    // found once per stretch of text, not once per candidate).
    let bytes = text.as_bytes();
    let mut next_colon = None;
    let mut i = inline_from;
    while i < end
        && let Some(k) = memchr::memchr3(b',', b';', b'.', &bytes[i..end])
    {
        i += k;
        let mut j = i + 1;
        while j < end && (bytes[j] == b' ' || bytes[j] == b'\t') {
            j += 1;
        }
        if j < end && bytes[j].is_ascii_alphabetic() && !(bytes[i] == b'.' && j == i + 1) {
            if next_colon.is_none_or(|c| c < j) {
                next_colon = Some(memchr::memchr(b':', &bytes[j..end]).map_or(end, |c| j + c));
            }
            if next_colon.is_some_and(|c| c < (j + MAX_TITLE + 1).min(end))
                && let Some(h) = colon_header(text, j, end, false)
            {
                i = h.body_start;
                out.push(h);
                continue;
            }
        }
        i += 1;
    }
}

fn markdown_header(text: &str, at: usize, line_end: usize) -> Option<Header> {
    let s = &text[at..line_end];
    let hashes = s.bytes().take_while(|&b| b == b'#').count();
    if hashes == 0 || hashes > 6 || !s[hashes..].starts_with(' ') {
        return None;
    }
    let title = s[hashes..].trim().trim_end_matches('#').trim().trim_end_matches(':').trim_end();
    if title.is_empty() || title.len() > MAX_TITLE {
        return None;
    }
    let title_start = at + s.find(title).unwrap_or(hashes);
    let entry = lookup(title);
    Some(Header {
        start: at,
        body_start: line_end,
        title_start,
        title_end: title_start + title.len(),
        canonical: entry.map_or("other", |e| e.canonical),
        sub: entry.is_some_and(|e| e.sub),
    })
}

/// `[n. ]Title:` at `at`. `line_start` allows mixed-case known titles and a numbering prefix.
fn colon_header(text: &str, at: usize, line_end: usize, line_start: bool) -> Option<Header> {
    let bytes = text.as_bytes();
    let mut i = at;
    if line_start {
        // Optional enumeration: `1.` `2)` `IV.`
        let mut j = i;
        while j < line_end && (bytes[j].is_ascii_digit() || matches!(bytes[j], b'I' | b'V' | b'X')) {
            j += 1;
        }
        if j > i && j < line_end && matches!(bytes[j], b'.' | b')') && bytes.get(j + 1) == Some(&b' ') {
            i = j + 1;
            while i < line_end && bytes[i] == b' ' {
                i += 1;
            }
        }
    }
    let title_start = i;
    let limit = (title_start + MAX_TITLE + 1).min(line_end);
    let mut colon = None;
    let mut k = title_start;
    while k < limit {
        let b = bytes[k];
        if b == b':' {
            colon = Some(k);
            break;
        }
        let allowed = b.is_ascii_alphanumeric()
            || matches!(b, b' ' | b'/' | b'&' | b'-' | b'(' | b')' | b'\'')
            || (line_start && b == b',');
        if !allowed {
            return None;
        }
        k += 1;
    }
    let colon = colon?;
    // `Time: 10:30` is fine; `http://` and `12:30` are not headers.
    if matches!(bytes.get(colon + 1), Some(b'/')) {
        return None;
    }
    let title = text[title_start..colon].trim_end();
    if title.is_empty() || !title.as_bytes()[0].is_ascii_alphabetic() {
        return None;
    }
    let entry = match lookup(title) {
        Some(e) if title.len() > 2 || is_all_caps(title) => Some(e),
        Some(_) => return None,
        None => None,
    };
    let known = entry.is_some();
    if !known {
        let letters = title.bytes().filter(u8::is_ascii_alphabetic).count();
        let min_letters = if line_start { 3 } else { 4 };
        if !is_all_caps(title) || letters < min_letters || title.split_whitespace().count() > MAX_UNKNOWN_WORDS {
            return None;
        }
    } else if !line_start && !starts_upper(title) {
        return None;
    }
    let after = &text[colon + 1..line_end];
    let mut body_start =
        colon + 1 + (after.len() - after.trim_start_matches(|c: char| c.is_whitespace() || c == ',').len());
    if body_start == line_end {
        // The body starts on the next line.
        body_start = (line_end + 1).min(text.len());
    }
    Some(Header {
        start: at,
        body_start,
        title_start,
        title_end: title_start + title.len(),
        canonical: entry.map_or("other", |e| e.canonical),
        sub: entry.is_some_and(|e| e.sub),
    })
}

/// A line that is only a title: ALL CAPS (known or not), or a known title in any case.
fn whole_line_header(text: &str, at: usize, content_end: usize, line_end: usize) -> Option<Header> {
    let title = &text[at..content_end];
    if title.len() > MAX_TITLE || title.ends_with('.') {
        return None;
    }
    if !title.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b' ' | b'/' | b'&' | b'-' | b'(' | b')' | b','))
    {
        return None;
    }
    let entry = lookup(title);
    let letters = title.bytes().filter(u8::is_ascii_alphabetic).count();
    let header = match entry {
        Some(e) if (title.len() > 3 && starts_upper(title)) || is_all_caps(title) => Some(e),
        Some(_) => return None,
        None if is_all_caps(title) && letters >= 3 && title.split_whitespace().count() <= MAX_UNKNOWN_WORDS + 2 => None,
        None => return None,
    };
    Some(Header {
        start: at,
        body_start: (line_end + 1).min(text.len()),
        title_start: at,
        title_end: content_end,
        canonical: header.map_or("other", |e| e.canonical),
        sub: header.is_some_and(|e| e.sub),
    })
}

fn is_all_caps(s: &str) -> bool {
    s.bytes().any(|b| b.is_ascii_uppercase()) && !s.bytes().any(|b| b.is_ascii_lowercase())
}

fn starts_upper(s: &str) -> bool {
    s.as_bytes().first().is_some_and(u8::is_ascii_uppercase)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> SectionParams {
        SectionParams::from_settings(&crate::config::Settings::load_from(None, Some(Default::default())).unwrap())
    }

    fn names(text: &str) -> Vec<(&'static str, String)> {
        split(text, &params()).into_iter().map(|s| (s.name, s.title)).collect()
    }

    #[test]
    fn no_headers_is_one_body_section() {
        let s = split("Patient doing well. No complaints.\n", &params());
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].name, s[0].start, s[0].end), ("body", 0, 34));
        assert_eq!(s[0].weight, 0.7);
    }

    #[test]
    fn line_start_caps_and_known_titles() {
        let text = "CHIEF COMPLAINT: Chest pain.\nHistory of Present Illness:\nThe patient is 54.\n\
            PHYSICAL EXAMINATION\nHEENT: Normal.\nLungs: Clear.\nASSESSMENT AND PLAN: Costochondritis.\n";
        assert_eq!(
            names(text),
            vec![
                ("chief_complaint", "CHIEF COMPLAINT".into()),
                ("history_of_present_illness", "History of Present Illness".into()),
                ("physical_exam", "PHYSICAL EXAMINATION".into()),
                ("assessment_and_plan", "ASSESSMENT AND PLAN".into()),
            ]
        );
        let s = split(text, &params());
        assert_eq!(&text[s[0].body_start..s[0].end], "Chest pain.\n");
        assert_eq!(&text[s[1].body_start..s[1].end], "The patient is 54.\n");
        assert_eq!(s[3].weight, 1.0);
        assert_eq!(s[1].weight, 0.9);
    }

    #[test]
    fn markdown_numbered_soap_and_inline() {
        assert_eq!(
            names("1987-11-19\n\n# Chief Complaint\n- Cough\n\n# Assessment and Plan\n\n## Plan\nRest.\n"),
            vec![
                ("body", "".into()),
                ("chief_complaint", "Chief Complaint".into()),
                ("assessment_and_plan", "Assessment and Plan".into()),
                ("plan", "Plan".into())
            ]
        );
        assert_eq!(
            names("S: Sore toe.\n\nO: Swollen.\n\nA: stubbed toe\n\nP:  Rest.\n"),
            vec![
                ("subjective", "S".into()),
                ("objective", "O".into()),
                ("assessment", "A".into()),
                ("plan", "P".into())
            ]
        );
        assert_eq!(
            names(
                "SUBJECTIVE:,  Allergies.,MEDICATIONS: , Allegra.,OBJECTIVE:,Vitals:  BP 124/78.,Neck:  Supple.,PLAN:,1.  Zyrtec."
            ),
            vec![
                ("subjective", "SUBJECTIVE".into()),
                ("medications", "MEDICATIONS".into()),
                ("objective", "OBJECTIVE".into()),
                ("plan", "PLAN".into())
            ]
        );
        assert_eq!(names("2. PLAN: Follow up.\n")[0].0, "plan");
    }

    #[test]
    fn things_that_are_not_headers() {
        for text in [
            "Blood pressure: 120/80 today.\n",
            "see http://example.org for details\n",
            "He took aspirin at 10:30 and felt better.\n",
            "The plan: discussed with the family.\n",
            "s: lowercase single letter\n",
            "No acute disease.\n",
        ] {
            assert_eq!(names(text), vec![("body", String::new())], "{text}");
        }
    }

    #[test]
    fn known_prefix_of_a_longer_title() {
        assert_eq!(names("HOSPITAL COURSE AND TREATMENT: Uneventful.")[0].0, "hospital_course");
        assert_eq!(names("PAST MEDICAL HISTORY REVIEWED: None.")[0].0, "past_medical_history");
    }

    #[test]
    fn unknown_caps_title_is_other_and_sections_tile_the_text() {
        let text = "DOPPLER STUDY RESULTS: Mild regurgitation.\nIMPRESSION: Normal.";
        let s = split(text, &params());
        assert_eq!(s.iter().map(|s| s.name).collect::<Vec<_>>(), vec!["other", "impression"]);
        assert_eq!(s[0].end, s[1].start);
        assert_eq!(s[1].end, text.len());
    }
}
