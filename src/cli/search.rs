//! `clinstream search`: embeds the query with the configured model, asks the configured store for dense and BM25
//! candidates fused by RRF (optionally filtered by patient and section), and prints what was indexed — so a user
//! can see what `clinstream run` stored. It prints note text (the user asked for it); logs never do.

use std::fmt::Write;

use std::sync::Arc;

use crate::config::Settings;
use crate::embed::Embedder;
use crate::serve::{ContextRequest, ContextResponse, SearchRequest, Service};
use crate::store::Hit;

use anyhow::Context as _;

/// The query service's core over the configured store, for one command.
async fn service(settings: &Settings) -> anyhow::Result<Service> {
    let pipeline =
        Arc::new(crate::stages::Pipeline::new(settings).map_err(|e| anyhow::anyhow!(e.problems().join("\n")))?);
    let embedder = Embedder::start_async(&settings.embed).await.context("embedding model")?;
    let store = crate::store::Store::open_existing(&settings.store).await.context("vector store")?;
    Service::new(settings, pipeline, embedder, Arc::new(store))
}

/// Runs one search against the configured store (what `POST /v1/search` answers).
pub async fn search(
    settings: &Settings,
    query: &str,
    patient: Option<&str>,
    section: Option<&str>,
    top: usize,
) -> anyhow::Result<Vec<Hit>> {
    let request = SearchRequest {
        query: query.to_string(),
        patient: patient.map(str::to_string),
        top: Some(top.min(settings.serve.max_top)),
        sections: section.map(str::to_string).into_iter().collect(),
        document_types: Vec::new(),
        concepts: Vec::new(),
        since: None,
        until: None,
        neighbours: false,
    };
    let response = service(settings).await?.search(&request).await.context("search failed")?;
    Ok(response.hits.into_iter().map(|h| Hit { id: h.id, score: h.score, payload: h.payload }).collect())
}

/// The context for one question (what `POST /v1/context` answers).
pub async fn context(settings: &Settings, request: &ContextRequest) -> anyhow::Result<ContextResponse> {
    Ok(service(settings).await?.context(request).await?)
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
        "answer {} (confidence {:.2})  strategy {}  {} of {} tokens  {} mentions found",
        status.unwrap_or_default(),
        r.answer.confidence,
        strategy.unwrap_or_default(),
        r.tokens,
        r.budget_tokens,
        r.mentions_found
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
            "\n[{}]{} doc {} v{} {} section {} ({:.1}) bytes {}..{} {}\n    {}",
            i,
            support,
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
        let hits: Vec<Hit> =
            r.chunks.iter().map(|h| Hit { id: h.id.clone(), score: h.score, payload: h.payload.clone() }).collect();
        out.push_str(if r.strategy == crate::serve::api::Strategy::Clear {
            "\nchunks nearest the question, in what the windows left of the budget:\n"
        } else {
            "\nno aligned entity in this patient's notes; hybrid chunks:\n"
        });
        out.push_str(&render(&hits, false));
    }
    out
}

/// Text: one block per hit (rank, score, document, section, a snippet); JSON: one line per hit with its payload.
pub fn render(hits: &[Hit], json: bool) -> String {
    let mut out = String::new();
    if json {
        for h in hits {
            let line = serde_json::json!({"id": h.id, "score": h.score, "payload": h.payload});
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
            "{:>2}. {:.4}  doc {}  v{}  section {}  chunk {}  patient {}\n    {}",
            rank + 1,
            h.score,
            field("doc_id"),
            field("doc_version"),
            field("section"),
            h.payload.get("chunk_index").map_or("-".to_string(), |v| v.to_string()),
            field("patient"),
            snippet
        );
    }
    out
}
