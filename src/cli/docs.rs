//! Operator-facing tables generated from the code, so documentation cannot drift (a test compares them with
//! the files in docs/).

use crate::error::ErrorCode;

/// The error codes with disposition and meaning; Markdown for docs/errors.md, or plain text.
pub fn errors_table(markdown: bool) -> String {
    let mut out = String::new();
    if markdown {
        out.push_str("| code | disposition | meaning |\n|---|---|---|\n");
    }
    for code in ErrorCode::ALL {
        let disposition = match code.disposition() {
            crate::error::Disposition::DeadLetter => "dead_letter",
            crate::error::Disposition::Retry => "retry",
            crate::error::Disposition::Halt => "halt",
        };
        if markdown {
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                code.as_str(),
                disposition,
                code.description().replace('|', "\\|")
            ));
        } else {
            out.push_str(&format!("{:<26} {:<12} {}\n", code.as_str(), disposition, code.description()));
        }
    }
    out
}

/// A readable account of what the text stages find in `text` (the `explain` command).
pub fn explain(pipeline: &crate::stages::Pipeline, text: String) -> String {
    use std::fmt::Write as _;
    let doc = pipeline.analyse(crate::model::Note::from_text("explain", text));
    let t = &doc.note.text;
    let mut out = String::new();
    for s in &doc.sections {
        let _ = writeln!(out, "section {} ({:?}) weight {}", s.name, s.title, s.weight);
    }
    for m in &doc.mentions {
        let c = pipeline.lexicon().concept(m.concept);
        let _ = writeln!(
            out,
            "mention {:<10} {:?} -> {} {:?} [{}] in {}",
            m.kind.as_str(),
            &t[m.start..m.end],
            c.id,
            c.preferred,
            m.assertion.short(),
            doc.sections[m.section].name
        );
    }
    for v in doc.variables.iter().filter(|v| v.mentions_found > 0) {
        let _ = writeln!(
            out,
            "variable {} = {} (confidence {:.2}, {} mentions, {} context tokens)",
            v.variable,
            v.label.as_str(),
            v.confidence,
            v.mentions_found,
            v.context_tokens
        );
    }
    out
}
