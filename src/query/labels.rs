//! The concept-label index the alignment needs (`align::LabelIndex`): every concept's and variable's labels
//! embedded with the model in use (~22k labels: about a minute on two CPU cores, seconds on a GPU), cached in
//! `serve.cache_dir` under a key of the model file's digest and the label list, so a restart with the same model
//! and lexicon loads them in milliseconds and another model file never reuses them.
//!
//! The first build says so in the log and reports its progress to the caller (`clinstream context` draws it on a
//! terminal; the query service logs it and keeps `/readyz` false until it is done).

use std::path::Path;
use std::time::Instant;

use super::align::LabelIndex;
use crate::embed::{EmbedError, Embedder};
use crate::stages::Pipeline;

/// Labels embedded per request while building.
const BATCH: usize = 512;

/// The concept-label embeddings for the model and lexicon in use: loaded from `cache_dir` when a previous start
/// left them there, embedded (and saved) otherwise. `progress(done, total)` is called after each batch embedded.
pub async fn label_index_with(
    pipeline: &Pipeline,
    embedder: &Embedder,
    cache_dir: &Path,
    progress: &(dyn Fn(usize, usize) + Send + Sync),
) -> Result<LabelIndex, EmbedError> {
    let labels = LabelIndex::labels(pipeline.lexicon(), pipeline.variables());
    let model = format!("{} {} {}", embedder.info().name, embedder.digest().await, pipeline.lexicon().version());
    let key = LabelIndex::cache_key(&model, &labels);
    let cache = cache_dir.join(format!("labels-{key}.bin"));
    if !cache_dir.as_os_str().is_empty()
        && let Some(index) = LabelIndex::load(&cache, &key, labels.clone())
    {
        tracing::debug!(labels = labels.len(), "Label index loaded from the cache.");
        return Ok(index);
    }
    let clock = Instant::now();
    tracing::info!(
        labels = labels.len(),
        model = %embedder.info().name,
        "Building the label index (once per model and lexicon; cached in serve.cache_dir)."
    );
    let texts: Vec<&str> = labels.iter().map(|(_, t)| t.as_str()).collect();
    let mut vectors = Vec::with_capacity(texts.len());
    progress(0, texts.len());
    for batch in texts.chunks(BATCH) {
        vectors.extend(embedder.embed(batch).await?);
        progress(vectors.len(), texts.len());
    }
    let index = LabelIndex::new(labels, vectors);
    if !cache_dir.as_os_str().is_empty()
        && let Err(e) = index.save(&cache, &key)
    {
        tracing::warn!(error = %e, "Could not cache the label embeddings; they are embedded again at the next start.");
    }
    tracing::info!(took_ms = clock.elapsed().as_millis() as u64, "Label index built.");
    Ok(index)
}

/// [`label_index_with`] without progress reports.
pub async fn label_index(pipeline: &Pipeline, embedder: &Embedder, cache_dir: &Path) -> Result<LabelIndex, EmbedError> {
    label_index_with(pipeline, embedder, cache_dir, &|_, _| {}).await
}
