//! `clinstream search`: embeds the query with the configured model, asks the configured store for dense and BM25
//! candidates fused by score (optionally filtered by patient and section), and prints what was indexed — so a user
//! can see what `clinstream run` stored. It prints note text (the user asked for it); logs never do.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use crate::config::Settings;
use crate::embed::Embedder;
use crate::query::Reader;
use crate::query::api::{SearchRequest, SearchStrategy};
use crate::store::Hit;

use anyhow::Context as _;

use super::runtime;

#[derive(clap::Args)]
pub struct Args {
    /// What to look for.
    #[arg(long, short)]
    query: String,
    /// Only this patient's chunks (the FHIR reference as indexed, e.g. `Patient/123`).
    #[arg(long)]
    patient: Option<String>,
    /// Only chunks of this section (canonical name, e.g. `assessment_and_plan`).
    #[arg(long)]
    section: Option<String>,
    #[arg(long, short = 'k', default_value_t = 5)]
    top: usize,
    /// hybrid (default), dense, or tree (the patient's chunks and RAPTOR summaries; needs --patient).
    #[arg(long, default_value = "hybrid", value_parser = ["hybrid", "dense", "tree"])]
    strategy: String,
    /// Print the hits with their whole payload as JSON lines.
    #[arg(long)]
    json: bool,
    #[arg(long, env = "CLINSTREAM_CONFIG")]
    config: Option<PathBuf>,
}

pub fn exec(args: Args) -> anyhow::Result<ExitCode> {
    let Args { query, patient, section, top, strategy, json, config } = args;
    let strategy: SearchStrategy = serde_json::from_value(serde_json::Value::String(strategy))?;
    let mut settings = Settings::load(config.as_deref()).context("loading configuration")?;
    settings.log.level = "warn,clinstream::audit=info".into();
    crate::telemetry::init_logging(&settings.log)?;
    let hits = runtime(&settings)?.block_on(async {
        let request = SearchRequest {
            query: query.clone(),
            patient: patient.clone(),
            top: Some(top.max(1).min(settings.serve.max_top)),
            sections: section.clone().into_iter().collect(),
            document_types: Vec::new(),
            concepts: Vec::new(),
            since: None,
            until: None,
            neighbours: false,
            strategy: Some(strategy),
        };
        let hits = search(&settings, &request).await?;
        let documents: std::collections::BTreeSet<String> =
            hits.iter().filter_map(|h| h.payload.get("doc_id")?.as_str().map(str::to_string)).collect();
        super::audit_operator(&settings, "search", patient.as_deref(), hits.len(), documents.into_iter().collect())
            .await?;
        anyhow::Ok(hits)
    })?;
    print!("{}", render(&hits, json));
    Ok(ExitCode::SUCCESS)
}

/// The read side's method over the configured store, for one command.
pub(super) async fn reader(settings: &Settings) -> anyhow::Result<Reader> {
    let pipeline =
        Arc::new(crate::stages::Pipeline::new(settings).map_err(|e| anyhow::anyhow!(e.problems().join("\n")))?);
    let embedder = Embedder::start_async(&settings.embed).await.context("embedding model")?;
    let store = crate::store::Store::open_existing(&settings.store).await.context("vector store")?;
    Reader::new(settings, pipeline, embedder, Arc::new(store))
}

/// Runs one search against the configured store (what `POST /v1/search` answers).
/// A `hybrid` or `tree` search aligns the query to concepts (`serve.match_concepts`): the first one with a model
/// builds the label index, as the first `clinstream context` does (with its progress bar).
pub async fn search(settings: &Settings, request: &SearchRequest) -> anyhow::Result<Vec<Hit>> {
    let reader = reader(settings).await?;
    if settings.serve.match_concepts && request.strategy != Some(SearchStrategy::Dense) {
        super::context::prepare(&reader).await?;
    }
    let response = reader.search(request).await.context("search failed")?;
    Ok(response
        .hits
        .into_iter()
        .map(|h| Hit { id: h.id, score: h.score, payload: h.payload, found: h.found.unwrap_or_default() })
        .collect())
}

/// The rankings that returned a hit, as ` (dense 0.712, words 0.80, concept)`; empty when none is known.
fn found(f: &crate::store::Found) -> String {
    let mut parts = Vec::new();
    if let Some(d) = f.dense {
        parts.push(format!("dense {d:.3}"));
    }
    if let Some(w) = f.words {
        parts.push(format!("words {w:.2}"));
    }
    if f.concept {
        parts.push("concept".to_string());
    }
    if parts.is_empty() { String::new() } else { format!(" ({})", parts.join(", ")) }
}

/// Text: one block per hit (rank, score, document, section, a snippet); JSON: one line per hit with its payload.
pub fn render(hits: &[Hit], json: bool) -> String {
    let mut out = String::new();
    if json {
        for h in hits {
            let mut line = serde_json::json!({"id": h.id, "score": h.score, "payload": h.payload});
            if !h.found.is_empty() {
                line["found"] = serde_json::json!(h.found);
            }
            let _ = writeln!(out, "{line}");
        }
        return out;
    }
    if hits.is_empty() {
        out.push_str("no matching chunks\n");
    }
    for (rank, h) in hits.iter().enumerate() {
        let field = |k: &str| h.payload.get(k).and_then(|v| v.as_str()).unwrap_or("-").to_string();
        let text = field("text");
        let snippet: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let snippet = match snippet.char_indices().nth(200) {
            Some((at, _)) => format!("{}…", &snippet[..at]),
            None => snippet,
        };
        let _ = writeln!(
            out,
            "{:>2}. {:.4}{}  doc {}  v{}  section {}  chunk {}  patient {}\n    {}",
            rank + 1,
            h.score,
            found(&h.found),
            match h.payload.get("level") {
                // A summary quotes several notes.
                Some(level) => format!(
                    "summary (level {level}, notes {})",
                    h.payload.get("doc_ids").map_or(0, |d| d.as_array().map_or(0, Vec::len))
                ),
                None => field("doc_id"),
            },
            field("doc_version"),
            field("section"),
            h.payload.get("chunk_index").map_or("-".to_string(), |v| v.to_string()),
            field("patient"),
            snippet
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Found;

    fn hit(found: Found) -> Hit {
        let payload = serde_json::json!({"doc_id": "d1", "doc_version": "2", "section": "impression", "text": "a b"});
        Hit { id: "x".into(), score: 0.5, payload: payload.as_object().unwrap().clone(), found }
    }

    #[test]
    fn each_hit_says_which_rankings_found_it() {
        let both = Found { dense: Some(0.7123), words: Some(0.8), concept: true };
        let text =
            render(&[hit(both), hit(Found { words: Some(1.25), ..Found::default() }), hit(Found::default())], false);
        let heads: Vec<&str> = text.lines().filter(|l| l.contains("  doc ")).collect();
        assert_eq!(heads.len(), 3, "{text}");
        assert!(heads[0].starts_with(" 1. 0.5000 (dense 0.712, words 0.80, concept)  doc d1"), "{text}");
        assert!(heads[1].starts_with(" 2. 0.5000 (words 1.25)  doc d1"), "{text}");
        assert!(heads[2].starts_with(" 3. 0.5000  doc d1"), "{text}");
        // JSON lines carry it as the API does; a hit found by nothing says nothing.
        let lines: Vec<serde_json::Value> = render(&[hit(both), hit(Found::default())], true)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["found"], serde_json::json!({"dense": 0.7123_f32, "words": 0.8_f32, "concept": true}));
        assert!(lines[1].get("found").is_none());
    }
}
