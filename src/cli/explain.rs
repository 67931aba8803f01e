//! `clinstream explain`: what the text stages make of a piece of text — sections, mentions with assertions,
//! variable labels. For tuning vocabularies and variable definitions; prints the text it is given.

use std::path::PathBuf;
use std::process::ExitCode;

use super::pipeline;

#[derive(clap::Args)]
pub struct Args {
    /// The text (or `-` to read stdin).
    #[arg(long)]
    text: String,
    #[arg(long, env = "CLINSTREAM_CONFIG")]
    config: Option<PathBuf>,
}

pub fn exec(args: Args) -> anyhow::Result<ExitCode> {
    let (_, pipeline) = pipeline(args.config.as_deref())?;
    let text = if args.text == "-" { std::io::read_to_string(std::io::stdin())? } else { args.text };
    print!("{}", explain(&pipeline, text));
    Ok(ExitCode::SUCCESS)
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
