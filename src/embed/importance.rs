//! The token-importance model of CPTF (the read side's `cptf` filter): the embedding model's graph with a `token_importance`
//! output (`model.importance.onnx`, written by `make model`), the attention each token receives. Loaded on the CPU,
//! beside the embedder: by the query service on the first request that asks for compression, and by a worker at
//! start when `raptor.compress` cuts its summaries (`query::raptor::compress`).
//!
//! In: a passage. Out: its tokens (byte spans, no special tokens) with their importance. A passage longer than the
//! model's input is scored in consecutive pieces (each with its own special tokens).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ort::session::Session;
use ort::value::Tensor;

use super::EmbedError;
use crate::config::EmbedSettings;

/// One token of a passage: its byte span in the passage and its importance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Token {
    pub start: usize,
    pub end: usize,
    pub importance: f32,
}

/// The loaded model and its tokenizer.
pub struct Importance {
    session: Mutex<Session>,
    tokenizer: tokenizers::Tokenizer,
    /// Word pieces per model input (its limit less the two special tokens).
    piece: usize,
    cls: u32,
    sep: u32,
    token_types: bool,
}

impl std::fmt::Debug for Importance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Importance").field("piece", &self.piece).finish_non_exhaustive()
    }
}

/// Where the importance model of `embed.*` lives: `file` inside `embed.model_dir`.
pub fn model_path(s: &EmbedSettings, file: &str) -> PathBuf {
    Path::new(&s.model_dir).join(file)
}

impl Importance {
    /// Loads `file` (inside `embed.model_dir`) and the model's tokenizer. Blocking.
    pub fn load(s: &EmbedSettings, file: &str) -> Result<Importance, EmbedError> {
        let path = model_path(s, file);
        if !path.is_file() {
            return Err(EmbedError::Load(format!(
                "the token-importance model {} is missing (run `make model`)",
                path.display()
            )));
        }
        let env = super::backend::environment(&s.ort_library)?;
        let load = |e: String| EmbedError::Load(format!("could not load {}: {e}", path.display()));
        let session = Session::builder(env)
            .map_err(|e| load(e.to_string()))?
            .with_memory_pattern(false)
            .map_err(|e| load(e.to_string()))?
            .with_intra_threads(s.intra_threads.max(1))
            .map_err(|e| load(e.to_string()))?
            .commit_from_file(&path)
            .map_err(|e| load(e.to_string()))?;
        if !session.outputs().iter().any(|o| o.name() == "token_importance") {
            return Err(EmbedError::Load(format!("{} has no token_importance output", path.display())));
        }
        let token_types = session.inputs().iter().any(|i| i.name() == "token_type_ids");
        let tokenizer_path = Path::new(&s.model_dir).join("tokenizer.json");
        let mut tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| EmbedError::Load(format!("tokenizer {}: {e}", tokenizer_path.display())))?;
        tokenizer.with_truncation(None).map_err(|e| EmbedError::Load(format!("tokenizer: {e}")))?;
        let id = |t: &str| {
            tokenizer.token_to_id(t).ok_or_else(|| EmbedError::Load(format!("the tokenizer has no {t} token")))
        };
        let (cls, sep) = (id("[CLS]")?, id("[SEP]")?);
        let max = super::model_max_tokens(Path::new(&s.model_dir)).unwrap_or(512);
        Ok(Importance {
            session: Mutex::new(session),
            tokenizer,
            piece: max.saturating_sub(2).max(1),
            cls,
            sep,
            token_types,
        })
    }

    /// The tokens of `text` with their importance (blocking: run it off the async threads).
    pub fn score(&self, text: &str) -> Result<Vec<Token>, EmbedError> {
        let encoding =
            self.tokenizer.encode(text, false).map_err(|e| EmbedError::Inference(format!("tokenizer: {e}")))?;
        let (ids, offsets) = (encoding.get_ids(), encoding.get_offsets());
        let mut out = Vec::with_capacity(ids.len());
        for (piece, spans) in ids.chunks(self.piece).zip(offsets.chunks(self.piece)) {
            let scores = self.run(piece)?;
            out.extend(spans.iter().zip(scores).map(|(&(start, end), importance)| Token { start, end, importance }));
        }
        Ok(out)
    }

    /// One piece through the model: the importance of each of its tokens (the special tokens' dropped).
    fn run(&self, piece: &[u32]) -> Result<Vec<f32>, EmbedError> {
        let mut ids: Vec<i64> = Vec::with_capacity(piece.len() + 2);
        ids.push(i64::from(self.cls));
        ids.extend(piece.iter().map(|&t| i64::from(t)));
        ids.push(i64::from(self.sep));
        let n = ids.len();
        let shape = [1i64, n as i64];
        let tensor = |v: Vec<i64>| {
            Tensor::from_array((shape, v)).map_err(|e| EmbedError::Inference(format!("input tensor: {e}")))
        };
        let mut inputs = ort::inputs!["input_ids" => tensor(ids)?, "attention_mask" => tensor(vec![1; n])?];
        if self.token_types {
            inputs.push(("token_type_ids".into(), tensor(vec![0; n])?.into()));
        }
        let mut session = self.session.lock().map_err(|_| EmbedError::Stopped)?;
        let outputs = session.run(inputs).map_err(|e| EmbedError::Inference(format!("inference failed: {e}")))?;
        let value =
            outputs.get("token_importance").ok_or_else(|| EmbedError::Inference("no token_importance".into()))?;
        let (_, data) = value
            .try_extract_tensor::<f32>()
            .map_err(|e| EmbedError::Inference(format!("output token_importance: {e}")))?;
        Ok(data.iter().skip(1).take(piece.len()).copied().collect())
    }
}
