//! BM25 sparse vectors for hybrid search, shared by indexing and search: Qdrant's own tokenizer, stemmer and
//! stopwords (`qdrant-edge`), so the embedded engine and a server score the same terms.

use qdrant_edge::bm25_embed::{EdgeBm25, EdgeBm25Config};

use super::{Sparse, StoreError};

/// The BM25 encoder (`store.bm25_avg_len`: the average document length in tokens).
pub fn encoder(avg_len: f64) -> Result<EdgeBm25, StoreError> {
    let avg_len = qdrant_edge::external::ordered_float::NotNan::new(avg_len)
        .map_err(|_| StoreError::fatal("store.bm25_avg_len is not a number"))?;
    let config = EdgeBm25Config { avg_len, ..Default::default() };
    EdgeBm25::new(config).map_err(|e| StoreError::fatal(format!("BM25: {e}")))
}

pub fn sparse_document(bm25: &EdgeBm25, text: &str) -> Sparse {
    let v = bm25.embed_document(text);
    Sparse { indices: v.indices, values: v.values }
}

/// The terms of a text as BM25 counts them (Qdrant's tokenizer, stemmer and stopwords; ids), for comparing the
/// words of two texts ("lungs" and "lung" are one term, "the" none).
pub fn terms(text: &str) -> Vec<u32> {
    static ENCODER: std::sync::OnceLock<Option<EdgeBm25>> = std::sync::OnceLock::new();
    ENCODER.get_or_init(|| encoder(256.0).ok()).as_ref().map(|b| b.embed_query(text).indices).unwrap_or_default()
}

pub fn sparse_query(bm25: &EdgeBm25, text: &str) -> Sparse {
    let v = bm25.embed_query(text);
    Sparse { indices: v.indices, values: v.values }
}
