//! `clinstream search`: embeds the query with the configured model, asks the configured store for dense and BM25
//! candidates fused by RRF (optionally filtered by patient and section), and prints what was indexed — so a user
//! can see what `clinstream run` stored. It prints note text (the user asked for it); logs never do.

use std::fmt::Write;

use crate::config::Settings;
use crate::embed::Embedder;
use crate::store::{Hit, Query, Store, bm25};

use anyhow::Context as _;

/// Runs one search against the configured store.
pub async fn search(
    settings: &Settings,
    query: &str,
    patient: Option<&str>,
    section: Option<&str>,
    top: usize,
) -> anyhow::Result<Vec<Hit>> {
    let embedder = Embedder::start_async(&settings.embed).await.context("embedding model")?;
    let store = Store::open_existing(&settings.store).await.context("vector store")?;
    let dense = embedder.embed(&[query]).await?.pop().unwrap_or_default();
    let bm25 = bm25::encoder(settings.store.bm25_avg_len)?;
    let q = Query {
        dense,
        sparse: bm25::sparse_query(&bm25, query),
        patient: patient.map(str::to_string),
        section: section.map(str::to_string),
        top,
    };
    store.search(&q).await.context("search failed")
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
