//! The concept-label index the alignment needs (`align::LabelIndex`): every concept's and variable's labels
//! embedded with the model in use, cached in a directory per model and label list so a restart does not embed
//! them again.

use std::path::Path;

use super::align::LabelIndex;
use crate::embed::{EmbedError, Embedder};
use crate::stages::Pipeline;

/// The concept-label embeddings for the model and lexicon in use: loaded from `cache_dir` when a previous start
/// left them there, embedded (and saved) otherwise.
pub async fn label_index(pipeline: &Pipeline, embedder: &Embedder, cache_dir: &Path) -> Result<LabelIndex, EmbedError> {
    let labels = LabelIndex::labels(pipeline.lexicon(), pipeline.variables());
    let key = LabelIndex::cache_key(&embedder.info().name, &labels);
    let cache = cache_dir.join(format!("labels-{key}.bin"));
    if !cache_dir.as_os_str().is_empty()
        && let Some(index) = LabelIndex::load(&cache, &key, labels.clone())
    {
        return Ok(index);
    }
    let texts: Vec<&str> = labels.iter().map(|(_, t)| t.as_str()).collect();
    let mut vectors = Vec::with_capacity(texts.len());
    for batch in texts.chunks(512) {
        vectors.extend(embedder.embed(batch).await?);
    }
    let index = LabelIndex::new(labels, vectors);
    if !cache_dir.as_os_str().is_empty()
        && let Err(e) = index.save(&cache, &key)
    {
        tracing::warn!(error = %e, "Could not cache the label embeddings; they are embedded again at the next start.");
    }
    Ok(index)
}
