//! The ONNX Runtime side of the embedder: loading the library once per process, the session, and one batch run
//! (padding, masks, pooling, L2 normalisation). Runs only on the model thread.
//!
//! Besides the model, one benchmark-only backend: `synthetic` (`embed.execution_provider = "synthetic"`, refused
//! unless `embed.allow_synthetic = true`) answers every input with a deterministic unit vector of the model's
//! dimension hashed from its token ids, at next to no cost, so that the capacity of everything around the model
//! (tokenizing, SEOS, the store, the outputs) can be measured on any machine. Its vectors mean nothing: the
//! embedder names itself `synthetic` (build info, the points' `model` field) so such a store is never mistaken for
//! a real one.

use std::path::Path;
use std::sync::OnceLock;

use ort::session::Session;
use ort::value::Tensor;

use super::EmbedError;

/// The process's ONNX Runtime environment: the library is loaded and the environment built once.
static ENVIRONMENT: OnceLock<Result<ort::environment::Environment, EmbedError>> = OnceLock::new();

pub(crate) fn environment(library: &str) -> Result<&'static ort::environment::Environment, EmbedError> {
    let env = ENVIRONMENT.get_or_init(|| {
        let library = if library.is_empty() {
            std::env::var("ORT_DYLIB_PATH")
                .map_err(|_| "embed.ort_library is empty and ORT_DYLIB_PATH is not set".to_string())?
        } else {
            library.to_string()
        };
        if !Path::new(&library).is_file() {
            return Err(format!("ONNX Runtime library {library} does not exist (run `make model`)").into());
        }
        let builder = ort::init_from(&library).map_err(|e| format!("could not load ONNX Runtime {library}: {e}"))?;
        builder
            .with_name("clinstream")
            .with_telemetry(false)
            .build()
            .map_err(|e| EmbedError::Load(format!("could not create the ONNX Runtime environment: {e}")))
    });
    env.as_ref().map_err(Clone::clone)
}

/// Where the vector comes from.
#[derive(Debug, Clone, PartialEq)]
enum Pooling {
    /// A `[batch, dim]` output, already pooled by the graph.
    Output(String),
    /// Masked mean over a `[batch, seq, dim]` output.
    Mean(String),
}

pub(crate) struct Backend {
    kind: Kind,
    pub provider: &'static str,
}

enum Kind {
    Onnx {
        session: Session,
        token_types: bool,
        pooling: Pooling,
    },
    /// Benchmark-only vectors hashed from the token ids (module docs).
    Synthetic {
        dim: usize,
    },
}

/// The provider name of the benchmark-only backend.
pub(crate) const SYNTHETIC: &str = "synthetic";

/// The model's width from its `config.json` (`hidden_size`), for the synthetic backend.
fn model_dim(model: &Path) -> Result<usize, EmbedError> {
    let config = model.parent().unwrap_or(Path::new(".")).join("config.json");
    let text = std::fs::read_to_string(&config)
        .map_err(|e| EmbedError::Load(format!("synthetic embedder: could not read {}: {e}", config.display())))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| EmbedError::Load(format!("synthetic embedder: {} is not JSON: {e}", config.display())))?;
    v.get("hidden_size")
        .and_then(|d| d.as_u64())
        .map(|d| d as usize)
        .filter(|&d| d > 0)
        .ok_or_else(|| EmbedError::Load(format!("synthetic embedder: {} has no hidden_size", config.display())))
}

/// A deterministic unit vector of width `dim` from token ids: every token adds ±1 at two hashed places, so inputs
/// that share tokens point alike (SEOS still finds shifts) and the cost is a few operations per token.
pub(crate) fn synthetic_vector(ids: &[u32], dim: usize) -> Vec<f32> {
    let mut v = vec![0f32; dim];
    for &t in ids {
        let h = u64::from(t).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
        v[(h >> 20) as usize % dim] += sign;
        v[(h >> 40) as usize % dim] += 0.5;
    }
    if v.iter().all(|x| *x == 0.0) {
        v[0] = 1.0;
    }
    normalise(v)
}

pub(crate) struct BackendOptions<'a> {
    pub library: &'a str,
    pub model: &'a Path,
    pub provider: &'a str,
    pub cuda_device: i32,
    pub intra_threads: usize,
    pub intra_spinning: bool,
    pub output: &'a str,
}

impl Backend {
    pub fn load(o: &BackendOptions<'_>) -> Result<Backend, EmbedError> {
        if o.provider == SYNTHETIC {
            return Ok(Backend { kind: Kind::Synthetic { dim: model_dim(o.model)? }, provider: SYNTHETIC });
        }
        let env = environment(o.library)?;
        let err = |what: &str| {
            let what = what.to_string();
            move |e: ort::Error<ort::session::builder::SessionBuilder>| format!("{what}: {e}")
        };
        let mut builder = Session::builder(env).map_err(|e| format!("could not create a session builder: {e}"))?;
        // Batch shapes vary with every batch (inputs × longest sequence); ONNX Runtime's memory patterns are planned
        // and cached per input shape, so with them on a long run's memory grows with every new shape it meets.
        builder = builder.with_memory_pattern(false).map_err(err("disabling memory patterns"))?;
        builder = builder.with_intra_op_spinning(o.intra_spinning).map_err(err("embed.intra_spinning"))?;
        if o.intra_threads > 0 {
            builder = builder.with_intra_threads(o.intra_threads).map_err(err("embed.intra_threads"))?;
        }
        let provider = match o.provider {
            "cuda" => {
                #[cfg(feature = "cuda")]
                {
                    let ep = ort::ep::CUDA::default().with_device_id(o.cuda_device).build().error_on_failure();
                    builder = builder
                        .with_execution_providers([ep])
                        .map_err(err("could not register the CUDA execution provider"))?;
                    "cuda"
                }
                #[cfg(not(feature = "cuda"))]
                {
                    let _ = o.cuda_device;
                    return Err("embed.execution_provider = cuda, but this binary was built without the `cuda` \
                                feature (cargo build --features cuda)"
                        .to_string()
                        .into());
                }
            }
            _ => "cpu",
        };
        let session = builder
            .commit_from_file(o.model)
            .map_err(|e| format!("could not load the model {}: {e}", o.model.display()))?;
        let names: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        for required in ["input_ids", "attention_mask"] {
            if !names.contains(&required) {
                return Err(format!("the model has no `{required}` input (inputs: {})", names.join(", ")).into());
            }
        }
        let token_types = names.contains(&"token_type_ids");
        let outputs: Vec<(String, usize)> = session
            .outputs()
            .iter()
            .map(|o| (o.name().to_string(), o.dtype().tensor_shape().map_or(0, |s| s.len())))
            .collect();
        let pooling = if !o.output.is_empty() {
            match outputs.iter().find(|(n, _)| n == o.output) {
                Some((n, 2)) => Pooling::Output(n.clone()),
                Some((n, 3)) => Pooling::Mean(n.clone()),
                Some((n, r)) => return Err(format!("embed.output `{n}` has rank {r}; expected 2 or 3").into()),
                None => return Err(format!("the model has no output `{}`", o.output).into()),
            }
        } else if outputs.iter().any(|(n, r)| n == "sentence_embedding" && *r == 2) {
            Pooling::Output("sentence_embedding".into())
        } else {
            match outputs.iter().find(|(_, r)| *r == 3) {
                Some((n, _)) => Pooling::Mean(n.clone()),
                None => {
                    return Err(EmbedError::Load(
                        "the model has no [batch, seq, dim] or sentence_embedding output".to_string(),
                    ));
                }
            }
        };
        Ok(Backend { kind: Kind::Onnx { session, token_types, pooling }, provider })
    }

    /// Embeds one batch of token-id sequences (special tokens included): pads to the longest, masks the padding,
    /// pools and L2-normalises.
    pub fn run(&mut self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let (session, token_types, pooling) = match &mut self.kind {
            Kind::Synthetic { dim } => return Ok(batch.iter().map(|ids| synthetic_vector(ids, *dim)).collect()),
            Kind::Onnx { session, token_types, pooling } => (session, *token_types, &*pooling),
        };
        let n = batch.len();
        let seq = batch.iter().map(|b| b.len()).max().unwrap_or(0).max(1);
        let mut ids = vec![0i64; n * seq];
        let mut mask = vec![0i64; n * seq];
        for (row, tokens) in batch.iter().enumerate() {
            for (col, &t) in tokens.iter().enumerate() {
                ids[row * seq + col] = i64::from(t);
                mask[row * seq + col] = 1;
            }
        }
        let shape = [n as i64, seq as i64];
        let tensor = |v: Vec<i64>| {
            Tensor::from_array((shape, v)).map_err(|e| EmbedError::Inference(format!("input tensor: {e}")))
        };
        let mut inputs = ort::inputs!["input_ids" => tensor(ids)?, "attention_mask" => tensor(mask.clone())?];
        if token_types {
            inputs.push(("token_type_ids".into(), tensor(vec![0i64; n * seq])?.into()));
        }
        let outputs = session.run(inputs).map_err(|e| EmbedError::Inference(format!("inference failed: {e}")))?;
        let (name, mean) = match pooling {
            Pooling::Output(name) => (name.as_str(), false),
            Pooling::Mean(name) => (name.as_str(), true),
        };
        let value = outputs.get(name).ok_or_else(|| format!("the model did not return `{name}`"))?;
        let (shape, data) =
            value.try_extract_tensor::<f32>().map_err(|e| EmbedError::Inference(format!("output `{name}`: {e}")))?;
        let mut vectors = Vec::with_capacity(n);
        if mean {
            let (s, d) = (shape[1] as usize, shape[2] as usize);
            for row in 0..n {
                let mut acc = vec![0f32; d];
                let mut count = 0f32;
                for col in 0..s.min(seq) {
                    if mask[row * seq + col] == 0 {
                        continue;
                    }
                    count += 1.0;
                    let at = (row * s + col) * d;
                    for (a, x) in acc.iter_mut().zip(&data[at..at + d]) {
                        *a += x;
                    }
                }
                acc.iter_mut().for_each(|a| *a /= count.max(1.0));
                vectors.push(normalise(acc));
            }
        } else {
            let d = shape[1] as usize;
            for row in 0..n {
                vectors.push(normalise(data[row * d..(row + 1) * d].to_vec()));
            }
        }
        Ok(vectors)
    }
}

fn normalise(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}
