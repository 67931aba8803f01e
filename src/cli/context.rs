//! `clinstream context`: the CLEAR context for a question about one patient, from the configured store — what
//! `POST /v1/context` answers, computed by the same function (`query::Reader::context`). Prints note text (the user
//! asked for it); logs never do.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use super::runtime;
use super::search::{reader, render};
use crate::config::Settings;
use crate::query::api::{ContextRequest, ContextResponse, Strategy};
use crate::store::Hit;

#[derive(clap::Args)]
pub struct Args {
    /// The patient reference as the notes carry it (`Patient/123`) or a bare id.
    #[arg(long)]
    patient: String,
    #[arg(long, short)]
    question: String,
    /// Token budget (default `serve.default_budget_tokens`).
    #[arg(long)]
    budget: Option<usize>,
    /// Only notes on or after / before this day (YYYY-MM-DD).
    #[arg(long)]
    since: Option<String>,
    #[arg(long)]
    until: Option<String>,
    /// Only notes of this type (repeatable).
    #[arg(long = "type")]
    document_types: Vec<String>,
    /// Only mentions in this section (canonical name; repeatable).
    #[arg(long = "section")]
    sections: Vec<String>,
    /// The CLEAR windows only: do not fill the rest of the budget with chunks (`serve.fill`).
    #[arg(long)]
    no_fill: bool,
    /// CPTF: keep this share of each window's tokens, its most important words (the request's `compress`).
    #[arg(long)]
    compress: Option<f64>,
    /// Print the response as JSON (the API's body).
    #[arg(long)]
    json: bool,
    #[arg(long, env = "CLINSTREAM_CONFIG")]
    config: Option<PathBuf>,
}

pub fn exec(args: Args) -> anyhow::Result<ExitCode> {
    let Args { patient, question, budget, since, until, document_types, sections, no_fill, compress, json, config } =
        args;
    let mut settings = Settings::load(config.as_deref()).context("loading configuration")?;
    settings.log.level = "warn,clinstream::audit=info".into();
    crate::telemetry::init_logging(&settings.log)?;
    let request = ContextRequest {
        patient,
        question,
        budget_tokens: budget,
        since,
        until,
        document_types,
        sections,
        fill: no_fill.then_some(false),
        compress,
    };
    let response = runtime(&settings)?.block_on(async {
        let response = context(&settings, &request).await?;
        let (returned, documents) = crate::serve::audit::Returned::returned(&response);
        super::audit_operator(&settings, "context", Some(&request.patient), returned, documents).await?;
        anyhow::Ok(response)
    })?;
    print!("{}", render_context(&response, json));
    Ok(ExitCode::SUCCESS)
}

/// The context for one question (what `POST /v1/context` answers). The first question with a model builds the
/// label index (about a minute on two CPU cores; cached afterwards): on a terminal a progress bar says so.
pub async fn context(settings: &Settings, request: &ContextRequest) -> anyhow::Result<ContextResponse> {
    let reader = reader(settings).await?;
    prepare(&reader).await?;
    Ok(reader.context(request).await?)
}

/// Builds (or loads) the label index, with a progress bar on a terminal while it is built.
pub(super) async fn prepare(reader: &crate::query::Reader) -> anyhow::Result<()> {
    let bar = label_progress();
    reader
        .prepare_with(&|done, total| {
            if done == 0 {
                bar.set_length(total as u64);
                bar.set_message("embedding the concept labels (first question with this model; cached afterwards)");
            }
            bar.set_position(done as u64);
        })
        .await
        .context("building the label index")?;
    bar.finish_and_clear();
    Ok(())
}

/// A progress bar on stderr when it is a terminal (hidden otherwise, and until the index needs building).
fn label_progress() -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(0);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{msg}\n{bar:40} {pos}/{len} labels (eta {eta})") {
        bar.set_style(style);
    }
    bar
}

/// Text: the answer, the aligned entities, then each window with its provenance; JSON: the API's body.
pub fn render_context(r: &ContextResponse, json: bool) -> String {
    if json {
        return serde_json::to_string_pretty(r).unwrap_or_default() + "\n";
    }
    let mut out = String::new();
    let status = serde_json::to_value(r.answer.status).ok().and_then(|v| v.as_str().map(str::to_string));
    let strategy = serde_json::to_value(r.strategy).ok().and_then(|v| v.as_str().map(str::to_string));
    let _ = writeln!(
        out,
        "answer {} (confidence {:.2})  strategy {}  {} of {} tokens  {} mentions found ({} of the answer target{})",
        status.unwrap_or_default(),
        r.answer.confidence,
        strategy.unwrap_or_default(),
        r.tokens,
        r.budget_tokens,
        r.mentions_found,
        r.answer_mentions,
        if r.answer_mentions == 0 && !r.windows.is_empty() {
            ": related windows held to 3/4 of the budget"
        } else {
            ""
        }
    );
    for e in &r.entities {
        let _ = writeln!(
            out,
            "entity {} {:?} score {:.2} ({}{})",
            e.id,
            e.label,
            e.score,
            e.found,
            if e.answer { ", answer" } else { "" }
        );
    }
    for (i, w) in r.windows.iter().enumerate() {
        let support = if r.answer.supporting.contains(&i) { " *" } else { "" };
        let _ = writeln!(
            out,
            "\n[{}]{} {} doc {} v{} {} section {} ({:.1}) bytes {}..{} {}\n    {}",
            i,
            support,
            match w.path {
                crate::query::context::Path::AnswerTarget => "answer-target",
                crate::query::context::Path::Related => "related",
                crate::query::context::Path::Dense => "dense",
            },
            w.doc_id,
            w.doc_version,
            w.date.as_deref().unwrap_or("-"),
            w.section,
            w.weight,
            w.start,
            w.end,
            w.assertions.join(","),
            w.text.split_whitespace().collect::<Vec<_>>().join(" ")
        );
    }
    if !r.chunks.is_empty() {
        let hits: Vec<Hit> = r
            .chunks
            .iter()
            .map(|h| Hit {
                id: h.id.clone(),
                score: h.score,
                payload: h.payload.clone(),
                found: h.found.unwrap_or_default(),
            })
            .collect();
        out.push_str(if r.strategy == Strategy::Clear {
            "\nchunks nearest the question, in what the windows left of the budget:\n"
        } else {
            "\nno aligned entity in this patient's notes; the chunks nearest the question:\n"
        });
        out.push_str(&render(&hits, false));
    }
    out
}
