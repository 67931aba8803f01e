//! Every failure the worker can meet, with a bounded code and a disposition.
//!
//! Codes are the contract with operators: they appear in dead-letter records, Kafka headers and metric labels,
//! so they are a closed set (`ErrorCode`), spelled once (`ErrorCode::as_str`) and documented in
//! `docs/errors.md`. The disposition is decided here, where the error is understood, not by callers:
//!
//! * `DeadLetter` — the input itself is bad; retrying cannot help. Record it and move on.
//! * `Retry` — something outside the input is unavailable (broker, store, timeout). Retry with backoff; never
//!   skip the input.
//! * `Halt` — the worker cannot do its job correctly (bad config, unwritable output). Stop without
//!   committing and exit non-zero.
//!
//! Error *messages* never contain note text, names or identifiers: they name the field, the limit or the
//! position, never the offending value.

use std::fmt;

/// What the worker does with an input or a run that met this error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Disposition {
    DeadLetter,
    Retry,
    Halt,
}

/// The pipeline stage where an error was found (a label in dead letters and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Source,
    Decode,
    Fetch,
    Index,
    Sink,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Source => "source",
            Stage::Decode => "decode",
            Stage::Fetch => "fetch",
            Stage::Index => "index",
            Stage::Sink => "sink",
        }
    }
}

macro_rules! error_codes {
    ($( $variant:ident => $code:literal, $disp:ident, $doc:literal; )*) => {
        /// The closed set of error codes. See `docs/errors.md` for the operator-facing table.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ErrorCode {
            $( #[doc = $doc] $variant, )*
        }

        impl ErrorCode {
            /// Every code, in declaration order (used by docs and tests).
            pub const ALL: &'static [ErrorCode] = &[ $( ErrorCode::$variant, )* ];

            /// The stable, snake_case spelling used in outputs, headers and metric labels.
            pub fn as_str(self) -> &'static str {
                match self { $( ErrorCode::$variant => $code, )* }
            }

            pub fn disposition(self) -> Disposition {
                match self { $( ErrorCode::$variant => Disposition::$disp, )* }
            }

            /// One line saying what the code means (for docs and `--help`-style listings).
            pub fn description(self) -> &'static str {
                match self { $( ErrorCode::$variant => $doc, )* }
            }
        }
    };
}

error_codes! {
    MessageTooLarge => "message_too_large", DeadLetter, "The raw event is larger than `input.max_message_bytes`.";
    InvalidJson => "invalid_json", DeadLetter, "The event is not valid JSON.";
    JsonTooDeep => "json_too_deep", DeadLetter, "The JSON nests deeper than the parser allows (128 levels).";
    NotAnObject => "not_an_object", DeadLetter, "The JSON is valid but its top level is not an object.";
    DuplicateKey => "duplicate_key", DeadLetter, "An object repeats a key the worker reads (FHIR JSON forbids duplicates).";
    MissingResourceType => "missing_resource_type", DeadLetter, "The object has no `resourceType`.";
    WrongResourceType => "wrong_resource_type", DeadLetter, "`resourceType` is not `DocumentReference`.";
    InvalidFhir => "invalid_fhir", DeadLetter, "A field has the wrong JSON type or shape for FHIR R4 DocumentReference.";
    MissingId => "missing_id", DeadLetter, "The DocumentReference has no `id` (needed for idempotent outputs).";
    InvalidId => "invalid_id", DeadLetter, "`id` does not match the FHIR id syntax `[A-Za-z0-9-.]{1,64}`.";
    InvalidStatus => "invalid_status", DeadLetter, "`status` is not one of current, superseded, entered-in-error.";
    NoContent => "no_content", DeadLetter, "`content` is missing or empty.";
    EmptyAttachment => "empty_attachment", DeadLetter, "The chosen attachment has neither data nor url, or its data is empty.";
    AttachmentByReference => "attachment_by_reference", DeadLetter, "The note is only available by `url` and fetching is off (`fhir.base_url` and `fhir.allowed_hosts` unset).";
    AttachmentHostNotAllowed => "attachment_host_not_allowed", DeadLetter, "`attachment.url` is absolute and its host is neither `fhir.base_url`'s nor in `fhir.allowed_hosts`, or it is not an http(s) URL or FHIR reference.";
    AttachmentNotFound => "attachment_not_found", DeadLetter, "The FHIR server answered 404 or 410 for `attachment.url`.";
    AttachmentFetchRefused => "attachment_fetch_refused", DeadLetter, "The FHIR server refused the fetch for a reason retrying cannot fix (another 4xx), or answered with a Binary resource that is not valid.";
    UnsupportedContentType => "unsupported_content_type", DeadLetter, "No attachment has a content type the worker can read (images, ...).";
    PdfNoText => "pdf_no_text", DeadLetter, "A PDF has no text layer (a scan); OCR is not done.";
    PdfEncrypted => "pdf_encrypted", DeadLetter, "A PDF is encrypted.";
    PdfMalformed => "pdf_malformed", DeadLetter, "A PDF cannot be parsed (truncated, broken cross-reference table or page tree).";
    BundleWithoutDocuments => "bundle_without_documents", DeadLetter, "A Kafka message holds a FHIR Bundle with no DocumentReference entry.";
    MissingContentType => "missing_content_type", DeadLetter, "An attachment with inline data has no `contentType`.";
    InvalidBase64 => "invalid_base64", DeadLetter, "`attachment.data` is not standard-alphabet base64.";
    SizeMismatch => "size_mismatch", DeadLetter, "The decoded length differs from `attachment.size`.";
    InvalidHash => "invalid_hash", DeadLetter, "`attachment.hash` is not a base64 SHA-1 digest.";
    HashMismatch => "hash_mismatch", DeadLetter, "The SHA-1 of the decoded bytes differs from `attachment.hash`.";
    AttachmentTooLarge => "attachment_too_large", DeadLetter, "The decoded attachment exceeds `decode.max_attachment_bytes`.";
    UnsupportedCharset => "unsupported_charset", DeadLetter, "The `charset` parameter names an encoding the worker does not read.";
    InvalidUtf8 => "invalid_utf8", DeadLetter, "The bytes are not valid UTF-8 (declared or default charset).";
    InvalidUtf16 => "invalid_utf16", DeadLetter, "UTF-16 text without a byte-order mark, with an odd length or unpaired surrogates.";
    InvalidRtf => "invalid_rtf", DeadLetter, "A text/rtf attachment does not start with `{\\rtf` or is unbalanced.";
    EmptyNote => "empty_note", DeadLetter, "The decoded note holds no text (only whitespace or markup).";
    BinaryContent => "binary_content", DeadLetter, "A text attachment holds NUL bytes or other binary data.";
    OutputTooLarge => "output_too_large", DeadLetter, "An output record of the note (variables or knowledge-graph delta) is larger than the producer's `message.max.bytes`; the event is dead-lettered instead of halting the worker.";
    InternalError => "internal_error", DeadLetter, "A stage failed unexpectedly (a bug); the event is dead-lettered and the run goes on.";
    KafkaUnavailable => "kafka_unavailable", Retry, "The Kafka cluster could not be reached, timed out or refused a request; retried with capped backoff, the partition never advances past the event.";
    DeliveryFailed => "delivery_failed", Halt, "An output record was not delivered within `kafka.halt_after_ms` (or was refused); the worker stops without committing.";
    ConsumerFatal => "consumer_fatal", Halt, "The Kafka consumer hit a fatal error (for example `FencedInstanceId`: another consumer joined the group with the same `kafka.group_instance_id`, or a restarted broker fenced this one); it can neither fetch nor commit again. The worker rebuilds its consumer and producer in-process and resumes from the committed offsets, at most `kafka.rebuilds_max` times within `kafka.rebuilds_window_ms`; past that it stops at once and its restart redelivers the uncommitted events.";
    CommitFailed => "commit_failed", Halt, "Offsets (or a transaction) could not be committed within `kafka.halt_after_ms`; the worker stops and the uncommitted events are redelivered.";
    DeadLetterLimit => "dead_letter_limit", Halt, "Too many events were dead-lettered (`kafka.dead_letters`); the worker stops instead of dead-lettering a whole topic after a bad deploy.";
    SchemaRegistryFailed => "schema_registry_failed", Halt, "The Schema Registry (`kafka.schema_registry.url`) refused an output schema (incompatible with the subject's compatibility rules, or bad credentials) or stayed unreachable for `kafka.halt_after_ms`; the worker does not start consuming.";
    RebalanceDrainTimeout => "rebalance_drain_timeout", Retry, "Revoked partitions' in-flight documents did not finish within `kafka.drain_timeout_ms`; their offsets stay uncommitted and the new owner redelivers them.";
    EmbedFailed => "embed_failed", Halt, "The embedding model failed (tokenizer, ONNX Runtime, GPU); the worker stops without committing.";
    StoreUnavailable => "store_unavailable", Halt, "The vector store stayed unavailable (or overloaded) for `store.halt_after_ms` despite retries; the worker stops without committing.";
    StoreFailed => "store_failed", Halt, "The vector store refused a write for a reason retrying cannot fix (wrong collection, bad request).";
    FhirUnavailable => "fhir_unavailable", Halt, "The FHIR server (or its token endpoint) stayed unreachable, timed out, or answered 429/5xx for `fhir.halt_after_ms` despite retries; the worker stops without committing.";
    FhirUnauthorized => "fhir_unauthorized", Halt, "The FHIR server answered 401/403, or the SMART token endpoint refused the client: a configuration error (token, client id, key, scopes); the worker stops without committing.";
    SourceIo => "source_io", Halt, "The input could not be read (file missing, permission, I/O error).";
    SinkIo => "sink_io", Halt, "An output could not be written.";
    ListenFailed => "listen_failed", Halt, "The metrics and health address (`metrics.addr`) could not be bound.";
    ConfigInvalid => "config_invalid", Halt, "The configuration is invalid (see the message for the key).";
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure to turn one input event into outputs. `detail` is PHI-free by construction: it is built only from
/// field names, limits, positions and codes, never from input values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} at {stage:?}: {detail}")]
pub struct DocError {
    pub code: ErrorCode,
    pub stage: Stage,
    pub detail: String,
}

impl DocError {
    pub fn new(code: ErrorCode, stage: Stage, detail: impl Into<String>) -> Self {
        Self { code, stage, detail: detail.into() }
    }

    pub fn decode(code: ErrorCode, detail: impl Into<String>) -> Self {
        Self::new(code, Stage::Decode, detail)
    }

    pub fn disposition(&self) -> Disposition {
        self.code.disposition()
    }
}

/// The input could not be read. Halts the run (see `ErrorCode::SourceIo`).
#[derive(Debug, thiserror::Error)]
#[error("could not read {path}: {source}")]
pub struct SourceError {
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

/// An output could not be written.
#[derive(Debug, thiserror::Error)]
#[error("could not write {what}: {source}")]
pub struct SinkError {
    pub what: String,
    #[source]
    pub source: std::io::Error,
}

/// A run that had to stop. Every variant has a code (`code()`), which `main` prints and the exit status follows;
/// messages are PHI-free.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("invalid configuration:\n{0}")]
    Config(String),
    #[error("could not listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    /// A failure that stops the worker without committing: Kafka (delivery, commit, dead-letter limit,
    /// registry), the embedder or the vector store.
    #[error("{code}: {detail}")]
    Halt { code: ErrorCode, detail: String },
}

impl RunError {
    pub fn halt(code: ErrorCode, detail: impl Into<String>) -> Self {
        RunError::Halt { code, detail: detail.into() }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            RunError::Source(_) => ErrorCode::SourceIo,
            RunError::Sink(_) => ErrorCode::SinkIo,
            RunError::Config(_) => ErrorCode::ConfigInvalid,
            RunError::Listen { .. } => ErrorCode::ListenFailed,
            RunError::Halt { code, .. } => *code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn codes_are_unique_snake_case() {
        let mut seen = HashSet::new();
        for code in ErrorCode::ALL {
            let s = code.as_str();
            assert!(seen.insert(s), "duplicate code {s}");
            assert!(s.chars().all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit()), "{s}");
            assert!(!code.description().is_empty());
        }
    }

    #[test]
    fn input_errors_dead_letter_and_environment_errors_halt() {
        assert_eq!(ErrorCode::InvalidJson.disposition(), Disposition::DeadLetter);
        assert_eq!(ErrorCode::AttachmentTooLarge.disposition(), Disposition::DeadLetter);
        assert_eq!(ErrorCode::SinkIo.disposition(), Disposition::Halt);
        assert_eq!(ErrorCode::ConfigInvalid.disposition(), Disposition::Halt);
    }
}
