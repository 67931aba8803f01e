//! The generative steps' prompts: an answer over a CLEAR context, and RAPTOR's abstractive summaries. Pure: the
//! call itself is `llm::Llm::chat`'s, the context `Reader::context`'s, the tree `query::raptor`'s.
//!
//! Answers. In: the question, the patient's context (`ContextResponse`: windows, then the fill or fallback chunks)
//! and the prompt templates. The passages are numbered `[1]`…`[n]` in context order; the model sees nothing else —
//! only this patient's passages, which the context's patient filter already guarantees. Out: the answer, its status
//! (`present` | `absent` | `uncertain` | `not_mentioned`, as the rule vote says it) and citations that each name
//! a passage of this context by number; a citation of any other number is refused (dropped and counted), never
//! passed on.
//!
//! Summaries (`raptor.abstractive`). In: the texts of one summary node's members (its chunks, or the summaries of
//! the level below) — one patient's, cut to `raptor.abstract_input_tokens`. Out: one paragraph of plain text, or
//! nothing when the model answered nothing usable.
//!
//! Templates: `llm.prompt_dir` may hold `answer.system.txt` and `answer.user.txt` (placeholders `{question}` and
//! `{passages}`), `summary.system.txt` and `summary.user.txt` (`{passages}`); the built-in ones are used otherwise.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::api::ContextResponse;

/// The built-in system prompt.
pub const SYSTEM: &str = "You answer clinical questions about one patient using only the numbered passages from \
    the patient's notes. Say `present` when the passages affirm the finding, `absent` when they negate it, \
    `uncertain` when they hedge, and `not_mentioned` when they do not speak of it. Cite the numbers of the passages \
    your answer rests on. Answer in JSON only.";

/// The built-in user prompt.
pub const USER: &str = "Question: {question}\n\nPassages:\n{passages}\n\nAnswer with JSON: {\"answer\": a short \
    answer, \"status\": one of present, absent, uncertain, not_mentioned, \"citations\": the passage numbers}.";

/// The prompt templates.
#[derive(Debug, Clone, PartialEq)]
pub struct Templates {
    pub system: String,
    pub user: String,
}

impl Default for Templates {
    fn default() -> Self {
        Templates { system: SYSTEM.to_string(), user: USER.to_string() }
    }
}

/// The built-in system prompt of a summary.
pub const SUMMARY_SYSTEM: &str = "You summarise passages from one patient's clinical notes. Using only what the \
    passages state, write one paragraph that keeps the findings, diagnoses, medications, procedures and results, \
    with their negations, uncertainty and dates. Add nothing the passages do not say. Write the summary only.";

/// The built-in user prompt of a summary.
pub const SUMMARY_USER: &str = "Passages:\n{passages}\n\nSummary:";

impl Templates {
    /// The answer's templates from `dir` (`answer.system.txt`, `answer.user.txt`; each optional), or the built-in
    /// ones for an empty `dir`. A user template without `{passages}` is refused: the model would answer from nothing.
    pub fn load(dir: &str) -> Result<Templates, String> {
        Self::load_named(dir, "answer", Templates::default())
    }

    /// The summary's templates (`summary.system.txt`, `summary.user.txt`), as `load`.
    pub fn load_summary(dir: &str) -> Result<Templates, String> {
        Self::load_named(dir, "summary", Templates { system: SUMMARY_SYSTEM.into(), user: SUMMARY_USER.into() })
    }

    fn load_named(dir: &str, name: &str, mut t: Templates) -> Result<Templates, String> {
        if dir.trim().is_empty() {
            return Ok(t);
        }
        let dir = std::path::Path::new(dir.trim());
        let read = |file: String| -> Result<Option<String>, String> {
            let p = dir.join(file);
            match std::fs::read_to_string(&p) {
                Ok(s) => Ok(Some(s)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(format!("llm.prompt_dir: {}: {e}", p.display())),
            }
        };
        if let Some(s) = read(format!("{name}.system.txt"))? {
            t.system = s;
        }
        if let Some(u) = read(format!("{name}.user.txt"))? {
            t.user = u;
        }
        if !t.user.contains("{passages}") {
            return Err(format!("llm.prompt_dir: {name}.user.txt must hold {{passages}}"));
        }
        Ok(t)
    }
}

/// One numbered passage of the context.
#[derive(Debug, Clone, PartialEq)]
pub struct Passage {
    pub doc_id: String,
    pub date: Option<String>,
    pub section: String,
    pub start: usize,
    pub end: usize,
    pub text: String,
}

impl From<&crate::query::context::ContextWindow> for Passage {
    fn from(w: &crate::query::context::ContextWindow) -> Self {
        Passage {
            doc_id: w.doc_id.clone(),
            date: w.date.clone(),
            section: w.section.clone(),
            start: w.start,
            end: w.end,
            text: w.text.clone(),
        }
    }
}

/// The context's passages in the order they are numbered: the windows, then the chunks.
pub fn passages(ctx: &ContextResponse) -> Vec<Passage> {
    let field = |p: &serde_json::Map<String, Value>, k: &str| p.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let offset = |p: &serde_json::Map<String, Value>, k: &str| p.get(k).and_then(|v| v.as_u64()).unwrap_or(0) as usize;
    ctx.windows
        .iter()
        .map(Passage::from)
        .chain(ctx.chunks.iter().map(|c| Passage {
            doc_id: field(&c.payload, "doc_id").unwrap_or_default(),
            date: field(&c.payload, "doc_date"),
            section: field(&c.payload, "section").unwrap_or_default(),
            start: offset(&c.payload, "start"),
            end: offset(&c.payload, "end"),
            text: field(&c.payload, "text").unwrap_or_default(),
        }))
        .collect()
}

/// A chat message (OpenAI's shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// The system and user messages for `question` over `passages`.
pub fn messages(t: &Templates, question: &str, passages: &[Passage]) -> Vec<Message> {
    let mut listed = String::new();
    for (i, p) in passages.iter().enumerate() {
        let date = p.date.as_deref().unwrap_or("undated");
        if p.section.is_empty() {
            listed.push_str(&format!("[{}] ({date}) {}\n", i + 1, p.text.trim()));
        } else {
            listed.push_str(&format!("[{}] ({date}, {}) {}\n", i + 1, p.section, p.text.trim()));
        }
    }
    if passages.is_empty() {
        listed.push_str("(none: the patient's notes hold nothing on this)\n");
    }
    let user = fill(&t.user, question.trim(), listed.trim_end());
    vec![Message { role: "system".into(), content: t.system.clone() }, Message { role: "user".into(), content: user }]
}

/// The system and user messages asking for one summary of `passages` (each a member's text, in the order given).
pub fn summary_messages(t: &Templates, passages: &[String]) -> Vec<Message> {
    let listed: Vec<&str> = passages.iter().map(|p| p.trim()).filter(|p| !p.is_empty()).collect();
    let user = fill(&t.user, "", &listed.join("\n\n"));
    vec![Message { role: "system".into(), content: t.system.clone() }, Message { role: "user".into(), content: user }]
}

/// The passages that fit `budget` tokens (`count`), in order, up to the first that does not; the first is cut to
/// fit when it alone does not.
pub fn fit(passages: Vec<String>, budget: usize, count: &dyn Fn(&str) -> usize) -> Vec<String> {
    let mut left = budget;
    let mut out = Vec::new();
    for p in passages {
        let t = count(&p);
        if t <= left {
            left -= t;
            out.push(p);
            continue;
        }
        if out.is_empty() {
            let mut end = p.len() * left / t.max(1);
            while !p.is_char_boundary(end) {
                end -= 1;
            }
            out.push(p[..end].to_string());
        }
        break;
    }
    out
}

/// The longest summary kept (characters); a longer completion is cut at the last sentence end before it.
pub const MAX_SUMMARY_CHARS: usize = 4000;

/// A completion as a summary: trimmed, a leading "Summary:" dropped, cut to `MAX_SUMMARY_CHARS` at a sentence end;
/// `None` when nothing is left.
pub fn summary_of(content: &str) -> Option<String> {
    let mut s = content.trim();
    for label in ["Summary:", "summary:", "SUMMARY:"] {
        if let Some(rest) = s.strip_prefix(label) {
            s = rest.trim_start();
        }
    }
    if s.len() > MAX_SUMMARY_CHARS {
        let mut cut = MAX_SUMMARY_CHARS;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        let head = &s[..cut];
        s = head.rfind(". ").map_or(head, |i| &head[..=i]);
    }
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// The template with `{question}` and `{passages}` filled in one pass: text that comes in (a question holding the
/// literal `{passages}`) is never read as a placeholder.
fn fill(template: &str, question: &str, passages: &str) -> String {
    let mut out = String::with_capacity(template.len() + question.len() + passages.len());
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("{question}") {
            out.push_str(question);
            rest = after;
        } else if let Some(after) = tail.strip_prefix("{passages}") {
            out.push_str(passages);
            rest = after;
        } else {
            out.push('{');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The longest answer asked for: a short answer with its citations fits `llm.max_tokens`' default, so the JSON
/// is never cut off mid-way.
pub const MAX_ANSWER_CHARS: usize = 600;

/// The JSON schema the answer must follow (`response_format`): an answer of at most `MAX_ANSWER_CHARS`, citations
/// that are passage numbers 1…n.
pub fn schema(n: usize) -> Value {
    json!({
        "type": "object",
        "properties": {
            "answer": {"type": "string", "maxLength": MAX_ANSWER_CHARS},
            "status": {"type": "string", "enum": ["present", "absent", "uncertain", "not_mentioned"]},
            "citations": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": n.max(1)},
                          "maxItems": n}
        },
        "required": ["answer", "status", "citations"],
        "additionalProperties": false
    })
}

/// What the model answered, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    pub answer: String,
    pub status: String,
    /// Passage indexes (0-based) cited, each once, in the order cited.
    pub citations: Vec<usize>,
    /// Citations of numbers outside 1…n (dropped).
    pub refused: usize,
}

/// Why a completion could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the model's answer {0}")]
pub struct Unusable(pub &'static str);

/// Reads the model's JSON answer against `n` passages.
pub fn parse(content: &str, n: usize) -> Result<Generated, Unusable> {
    #[derive(Deserialize)]
    struct Raw {
        answer: String,
        status: String,
        #[serde(default)]
        citations: Vec<Value>,
    }
    // Some servers wrap JSON in a code fence even when asked for JSON only.
    let body = content.trim().trim_start_matches("```json").trim_start_matches("```").trim_end_matches("```").trim();
    let raw: Raw = serde_json::from_str(body).map_err(|_| Unusable("is not the JSON asked for"))?;
    if !["present", "absent", "uncertain", "not_mentioned"].contains(&raw.status.as_str()) {
        return Err(Unusable("has a status outside present, absent, uncertain, not_mentioned"));
    }
    let mut citations = Vec::new();
    let mut refused = 0;
    for c in &raw.citations {
        match c.as_u64().map(|c| c as usize) {
            Some(k) if (1..=n).contains(&k) => {
                if !citations.contains(&(k - 1)) {
                    citations.push(k - 1);
                }
            }
            _ => refused += 1,
        }
    }
    Ok(Generated { answer: raw.answer.trim().to_string(), status: raw.status, citations, refused })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passage(doc: &str, text: &str) -> Passage {
        Passage {
            doc_id: doc.into(),
            date: Some("2024-01-10".into()),
            section: "impression".into(),
            start: 0,
            end: text.len(),
            text: text.into(),
        }
    }

    #[test]
    fn the_prompt_numbers_the_passages_and_holds_nothing_else() {
        let ps = [passage("d1", "Small left pleural effusion."), passage("d2", "No pneumothorax.")];
        let m = messages(&Templates::default(), "Is there an effusion? {passages}", &ps);
        assert_eq!(m[0].role, "system");
        let user = &m[1].content;
        assert!(user.contains("[1] (2024-01-10, impression) Small left pleural effusion."), "{user}");
        assert!(user.contains("[2] (2024-01-10, impression) No pneumothorax."), "{user}");
        assert_eq!(user.matches("Small left pleural effusion").count(), 1, "a question cannot repeat the notes");
        let none = messages(&Templates::default(), "q", &[]);
        assert!(none[1].content.contains("(none"), "{}", none[1].content);
    }

    #[test]
    fn citations_outside_the_context_are_refused() {
        let g = parse(r#"{"answer": "Yes", "status": "present", "citations": [2, 1, 2, 0, 3, -1, "x"]}"#, 2).unwrap();
        assert_eq!(g.citations, [1, 0], "in order, each once, 0-based");
        assert_eq!(g.refused, 4, "0, 3, -1 and a string");
        assert_eq!(g.status, "present");
        let fenced = parse("```json\n{\"answer\": \"No\", \"status\": \"absent\", \"citations\": []}\n```", 0).unwrap();
        assert_eq!(fenced.status, "absent");
        assert!(parse("yes, there is", 2).is_err());
        assert!(parse(r#"{"answer": "x", "status": "probably", "citations": []}"#, 2).is_err());
    }

    #[test]
    fn the_schema_bounds_citations_by_the_passages() {
        let s = schema(3);
        assert_eq!(s["properties"]["citations"]["items"]["maximum"], 3);
        assert_eq!(s["properties"]["citations"]["maxItems"], 3);
        assert_eq!(s["properties"]["answer"]["maxLength"], MAX_ANSWER_CHARS);
        assert_eq!(s["required"], json!(["answer", "status", "citations"]));
    }

    #[test]
    fn a_summary_prompt_holds_the_passages_and_a_summary_is_cleaned() {
        let t = Templates::load_summary("").unwrap();
        assert_eq!((t.system.as_str(), t.user.as_str()), (SUMMARY_SYSTEM, SUMMARY_USER));
        let m = summary_messages(&t, &[" Mild cardiomegaly. ".into(), String::new(), "No effusion {question}.".into()]);
        assert_eq!(m[0].role, "system");
        assert_eq!(m[1].content, "Passages:\nMild cardiomegaly.\n\nNo effusion {question}.\n\nSummary:");
        assert_eq!(
            summary_of("  Summary: Mild cardiomegaly; no effusion.\n"),
            Some("Mild cardiomegaly; no effusion.".into())
        );
        assert_eq!(summary_of(" \n "), None);
        assert_eq!(summary_of("Summary:"), None);
        let long = "Stable findings. ".repeat(400);
        let cut = summary_of(&long).unwrap();
        assert!(cut.len() <= MAX_SUMMARY_CHARS && cut.ends_with('.'), "{}", cut.len());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("summary.user.txt"), "Summarise: {passages}").unwrap();
        let t = Templates::load_summary(&dir.path().display().to_string()).unwrap();
        assert_eq!((t.system.as_str(), t.user.as_str()), (SUMMARY_SYSTEM, "Summarise: {passages}"));
        // The answer's templates are not the summary's.
        assert_eq!(Templates::load(&dir.path().display().to_string()).unwrap(), Templates::default());
        std::fs::write(dir.path().join("summary.user.txt"), "Summarise.").unwrap();
        assert!(Templates::load_summary(&dir.path().display().to_string()).unwrap_err().contains("summary.user.txt"));
    }

    #[test]
    fn passages_fit_the_budget_in_order() {
        let words = |t: &str| t.split_whitespace().count();
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(fit(p(&["a b", "c d e", "f"]), 5, &words), p(&["a b", "c d e"]));
        // Stops at the first that does not fit, though a later one would.
        assert_eq!(fit(p(&["a b", "c d e f", "g"]), 4, &words), p(&["a b"]));
        // A first passage over the budget is cut to about the budget.
        let cut = fit(p(&["one two three four five six seven eight"]), 4, &words);
        assert_eq!(cut.len(), 1);
        assert!(words(&cut[0]) <= 5 && cut[0].starts_with("one two"), "{cut:?}");
        assert!(fit(Vec::new(), 4, &words).is_empty());
    }

    #[test]
    fn templates_load_from_a_directory_and_must_hold_the_passages() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Templates::load("").unwrap(), Templates::default());
        assert_eq!(Templates::load(&dir.path().display().to_string()).unwrap(), Templates::default());
        std::fs::write(dir.path().join("answer.user.txt"), "Q: {question}\n{passages}").unwrap();
        let t = Templates::load(&dir.path().display().to_string()).unwrap();
        assert_eq!(t.user, "Q: {question}\n{passages}");
        assert_eq!(t.system, SYSTEM);
        std::fs::write(dir.path().join("answer.user.txt"), "Q: {question}").unwrap();
        assert!(Templates::load(&dir.path().display().to_string()).is_err());
    }
}
