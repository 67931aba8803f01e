//! Event bytes → `Note`: JSON, FHIR R4 DocumentReference rules, attachment choice and decoding.
//!
//! In: the raw bytes of one event (one DocumentReference as JSON). Out: a `Note` with its plain text, or a
//! `DocError` with a dead-letter code. Pure and synchronous; never panics on any input (fuzzed).
//!
//! Rules, in order: size limit → JSON → top-level object → `resourceType` → FHIR shape → `id` → `status` →
//! attachment choice (by `decode.content_type_preference`) → base64 → size/hash → charset → markup → non-empty.

use serde::de::IgnoredAny;

use crate::config::Settings;
use crate::error::{DocError, ErrorCode};
use crate::model::fhir::{Attachment, DocumentReference, Probe};
use crate::model::{AttachmentInfo, Note, RelatesTo};
use crate::stages::attachment::{self, MediaType};

/// The FHIR statuses a DocumentReference may have.
const STATUSES: &[&str] = &["current", "superseded", "entered-in-error"];

/// Limits and preferences for decoding, taken from `Settings` once.
#[derive(Debug, Clone)]
pub struct DecodeParams {
    pub max_message_bytes: usize,
    pub max_attachment_bytes: usize,
    pub content_type_preference: Vec<String>,
    pub verify_hash: bool,
    /// Choose attachments that have only a `url` (`fhir.base_url` or `fhir.allowed_hosts` set).
    pub fetch_references: bool,
}

impl DecodeParams {
    pub fn from_settings(s: &Settings) -> Self {
        Self {
            max_message_bytes: s.input.max_message_bytes,
            max_attachment_bytes: s.decode.max_attachment_bytes,
            content_type_preference: s.decode.content_type_preference.iter().map(|c| c.to_ascii_lowercase()).collect(),
            verify_hash: s.decode.verify_hash,
            fetch_references: s.fhir.fetching(),
        }
    }
}

/// Parses and checks one event. `Err` carries the code and a PHI-free detail.
pub fn decode(bytes: &[u8], p: &DecodeParams) -> Result<Note, DocError> {
    let doc = parse(bytes, p)?;
    note_from(doc, p)
}

/// JSON → DocumentReference, with a code for each way the JSON can be wrong.
pub fn parse(bytes: &[u8], p: &DecodeParams) -> Result<DocumentReference, DocError> {
    if bytes.len() > p.max_message_bytes {
        return Err(DocError::decode(
            ErrorCode::MessageTooLarge,
            format!("event is {} bytes; the limit is {}", bytes.len(), p.max_message_bytes),
        ));
    }
    // RFC 8259 lets a parser ignore a UTF-8 byte-order mark; some exporters write one.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(match serde_json::from_slice::<IgnoredAny>(bytes) {
            Ok(_) => DocError::decode(ErrorCode::NotAnObject, "the event is JSON but not an object"),
            Err(e) => json_error(&e),
        });
    }
    // The common case in one pass without path tracking: a well-formed DocumentReference. Anything else (another
    // resource type, every error) takes the path below, which names what is wrong as if this had not been tried:
    // a document this parse accepts, the probe and the tracked parse accept alike.
    if let Ok(doc) = serde_json::from_slice::<DocumentReference>(bytes)
        && doc.resource_type.as_deref() == Some("DocumentReference")
    {
        return Ok(doc);
    }
    let probe: Probe<'_> = serde_json::from_slice(bytes).map_err(|e| {
        if e.is_data() && !e.to_string().starts_with("duplicate field") {
            DocError::decode(ErrorCode::InvalidFhir, "resourceType: wrong type, expected a string")
        } else {
            json_error(&e)
        }
    })?;
    match probe.resource_type.as_deref() {
        None => return Err(DocError::decode(ErrorCode::MissingResourceType, "the object has no resourceType")),
        Some("DocumentReference") => {}
        Some("Bundle") => {
            return Err(DocError::decode(
                ErrorCode::BundleWithoutDocuments,
                "the event is a Bundle with no readable DocumentReference entry",
            ));
        }
        Some(_) => {
            return Err(DocError::decode(ErrorCode::WrongResourceType, "resourceType is not DocumentReference"));
        }
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize::<_, DocumentReference>(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let msg = inner.to_string();
        if msg.starts_with("duplicate field") {
            DocError::decode(ErrorCode::DuplicateKey, format!("{path}: duplicate key"))
        } else if inner.is_syntax() || inner.is_eof() {
            json_error(&inner)
        } else {
            // serde's "invalid type: <the value>, expected <what>" names the value; keep only what was expected.
            let expected = msg.split_once(", expected ").map(|(_, e)| e).unwrap_or("another shape");
            let expected = expected.split(" at line ").next().unwrap_or(expected);
            DocError::decode(ErrorCode::InvalidFhir, format!("{path}: wrong type or shape, expected {expected}"))
        }
    })
}

/// Maps a serde_json error to a code with its position, without the input text.
fn json_error(e: &serde_json::Error) -> DocError {
    let at = format!("line {} column {}", e.line(), e.column());
    let msg = e.to_string();
    if msg.starts_with("recursion limit exceeded") {
        DocError::decode(ErrorCode::JsonTooDeep, format!("JSON nests too deep at {at}"))
    } else if msg.starts_with("duplicate field") {
        DocError::decode(ErrorCode::DuplicateKey, format!("duplicate key at {at}"))
    } else if e.is_eof() {
        DocError::decode(ErrorCode::InvalidJson, format!("JSON ends early at {at}"))
    } else {
        DocError::decode(ErrorCode::InvalidJson, format!("invalid JSON at {at}"))
    }
}

/// FHIR `id`: 1–64 of `[A-Za-z0-9-.]`.
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// What decoding a DocumentReference leads to: its note, or a fetch of the chosen attachment's `url` first.
#[derive(Debug)]
pub enum Decoded {
    Note(Box<Note>),
    Fetch(Box<Pending>),
}

/// A DocumentReference whose chosen attachment is only referenced: what the fetch needs (`url`) and what
/// `complete` needs afterwards. Holds no fetched content.
#[derive(Debug)]
pub struct Pending {
    doc: DocumentReference,
    index: usize,
    attachment: Attachment,
    /// `attachment.url` as written (a FHIR reference such as `Binary/123`, or an absolute URL).
    pub url: String,
}

impl Pending {
    pub fn doc_id(&self) -> &str {
        self.doc.id.as_deref().unwrap_or_default()
    }
}

/// The body a fetch returned: the response's bytes and its `Content-Type` header.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub body: Vec<u8>,
    pub content_type: Option<String>,
}

/// Applies the DocumentReference rules and decodes the chosen attachment (inline data only: a referenced one is
/// `attachment_by_reference`). The worker's path is `start` + `complete`.
pub fn note_from(doc: DocumentReference, p: &DecodeParams) -> Result<Note, DocError> {
    match start(doc, p)? {
        Decoded::Note(note) => Ok(*note),
        Decoded::Fetch(_) => Err(by_reference()),
    }
}

/// Applies the DocumentReference rules and chooses the attachment: decodes it when inline, or says what to fetch
/// (only with `decode.fetch_references`).
pub fn start(mut doc: DocumentReference, p: &DecodeParams) -> Result<Decoded, DocError> {
    let doc_id =
        doc.id.as_deref().ok_or_else(|| DocError::decode(ErrorCode::MissingId, "DocumentReference has no id"))?;
    if !is_valid_id(doc_id) {
        return Err(DocError::decode(ErrorCode::InvalidId, "id does not match [A-Za-z0-9-.]{1,64}"));
    }
    if let Some(status) = doc.status.as_deref()
        && !STATUSES.contains(&status)
    {
        return Err(DocError::decode(
            ErrorCode::InvalidStatus,
            "status is not one of current, superseded, entered-in-error",
        ));
    }
    let (index, by_url) = choose_attachment(&doc.content, p)?;
    let attachment = doc.content[index].attachment.take().expect("the chosen content has an attachment");
    if by_url {
        let url = attachment.url.clone().unwrap_or_default();
        return Ok(Decoded::Fetch(Box::new(Pending { doc, index, attachment, url })));
    }
    let media = MediaType::parse(attachment.content_type.as_deref().unwrap_or(""));
    let bytes = attachment::decode_base64(attachment.data.as_deref().unwrap_or(""), p.max_attachment_bytes)?;
    if bytes.is_empty() {
        return Err(DocError::decode(ErrorCode::EmptyAttachment, format!("content[{index}].attachment.data is empty")));
    }
    finish(doc, index, &attachment, media, &bytes, p).map(|n| Decoded::Note(Box::new(n)))
}

/// Decodes a fetched attachment: a FHIR `Binary` resource (base64 `data`, `contentType`) when the server answered
/// with FHIR JSON, the raw bytes otherwise; then the same size, hash and text rules as inline data.
pub fn complete(pending: Pending, fetched: Fetched, p: &DecodeParams) -> Result<Note, DocError> {
    let Pending { doc, index, attachment, .. } = pending;
    let header = fetched.content_type.as_deref().map(MediaType::parse);
    let declared = attachment.content_type.as_deref();
    let is_fhir_json =
        header.as_ref().is_some_and(|h| h.essence == "application/fhir+json" || h.essence == "application/json");
    let (bytes, content_type) = if is_fhir_json {
        binary_resource(&fetched.body, p)?
    } else {
        if fetched.body.len() > p.max_attachment_bytes {
            return Err(too_large(fetched.body.len(), p.max_attachment_bytes));
        }
        // A raw body's own type, unless the server only says "bytes".
        let ct = fetched.content_type.filter(|c| MediaType::parse(c).essence != "application/octet-stream");
        (fetched.body, ct)
    };
    let content_type = content_type.or_else(|| declared.map(str::to_string));
    let media = MediaType::parse(content_type.as_deref().unwrap_or(""));
    if content_type.is_none() {
        return Err(DocError::decode(ErrorCode::MissingContentType, "the fetched attachment has no content type"));
    }
    if !media.is_supported() {
        return Err(DocError::decode(
            ErrorCode::UnsupportedContentType,
            format!("the fetched attachment is {}, which the worker does not read", media.essence),
        ));
    }
    if bytes.is_empty() {
        return Err(DocError::decode(
            ErrorCode::EmptyAttachment,
            format!("content[{index}].attachment.url holds no data"),
        ));
    }
    finish(doc, index, &attachment, media, &bytes, p)
}

/// A FHIR `Binary` resource's bytes and content type.
fn binary_resource(body: &[u8], p: &DecodeParams) -> Result<(Vec<u8>, Option<String>), DocError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Binary {
        resource_type: Option<String>,
        content_type: Option<String>,
        data: Option<String>,
    }
    let refused = |why: &str| DocError::new(ErrorCode::AttachmentFetchRefused, crate::error::Stage::Fetch, why);
    let binary: Binary = serde_json::from_slice(body)
        .map_err(|_| refused("the server answered FHIR JSON that is not a Binary resource"))?;
    if binary.resource_type.as_deref() != Some("Binary") {
        return Err(refused("the server answered a resource other than Binary"));
    }
    let bytes = attachment::decode_base64(binary.data.as_deref().unwrap_or(""), p.max_attachment_bytes)?;
    Ok((bytes, binary.content_type))
}

fn too_large(len: usize, max: usize) -> DocError {
    DocError::decode(ErrorCode::AttachmentTooLarge, format!("attachment is {len} bytes; the limit is {max}"))
}

fn by_reference() -> DocError {
    DocError::decode(
        ErrorCode::AttachmentByReference,
        "the note is only available by attachment.url and fetching is off (fhir.base_url unset)",
    )
}

/// The rules after the bytes are known (inline or fetched): size/hash, text, and the note's fields.
fn finish(
    doc: DocumentReference,
    index: usize,
    att: &Attachment,
    media: MediaType,
    bytes: &[u8],
    p: &DecodeParams,
) -> Result<Note, DocError> {
    let hash_verified = attachment::verify(bytes, att.size, att.hash.as_deref(), p.verify_hash)?;
    let (text, charset) = attachment::to_text(&media, bytes)?;
    let doc_id = doc.id.unwrap_or_default();
    let entered_in_error = doc.status.as_deref() == Some("entered-in-error");
    let (version, last_updated) = match doc.meta {
        Some(m) => (m.version_id, m.last_updated),
        None => (None, None),
    };
    let (encounter, period) = match doc.context {
        Some(c) => (c.encounter.into_iter().find_map(|r| r.reference), c.period),
        None => (None, None),
    };
    Ok(Note {
        doc_id,
        version,
        last_updated,
        status: doc.status,
        doc_status: doc.doc_status,
        patient: doc.subject.and_then(|s| s.reference),
        encounter,
        period,
        date: doc.date,
        doc_type: doc.type_,
        category: doc.category,
        authors: doc.author.into_iter().filter_map(|a| a.reference).collect(),
        relates_to: doc
            .relates_to
            .into_iter()
            .filter_map(|r| Some(RelatesTo { code: r.code?, target: r.target?.reference? }))
            .collect(),
        entered_in_error,
        attachment: AttachmentInfo {
            index,
            content_type: media.essence,
            charset: charset.to_string(),
            language: att.language.clone(),
            title: att.title.clone(),
            bytes: bytes.len(),
            hash_verified,
        },
        text,
    })
}

/// Picks the attachment to read: for each preferred content type in order, an attachment with inline data, then
/// (when fetching) one with only a `url`; then a `url`-only attachment without a content type (its type is known
/// once fetched). Returns the index and whether it must be fetched. When none qualifies, says why, most specific
/// reason first.
fn choose_attachment(content: &[crate::model::fhir::Content], p: &DecodeParams) -> Result<(usize, bool), DocError> {
    let attachments: Vec<(usize, &Attachment)> =
        content.iter().enumerate().filter_map(|(i, c)| c.attachment.as_ref().map(|a| (i, a))).collect();
    if attachments.is_empty() {
        return Err(DocError::decode(ErrorCode::NoContent, "content is missing or holds no attachment"));
    }
    let has_data = |a: &Attachment| a.data.as_deref().is_some_and(|d| !d.trim().is_empty());
    let by_url = |a: &Attachment| !has_data(a) && a.url.as_deref().is_some_and(|u| !u.trim().is_empty());
    let is = |a: &Attachment, preferred: &str| {
        a.content_type.as_deref().is_some_and(|ct| MediaType::parse(ct).essence == *preferred)
    };
    for preferred in &p.content_type_preference {
        if let Some((i, _)) = attachments.iter().find(|(_, a)| has_data(a) && is(a, preferred)) {
            return Ok((*i, false));
        }
        if p.fetch_references
            && let Some((i, _)) = attachments.iter().find(|(_, a)| by_url(a) && is(a, preferred))
        {
            return Ok((*i, true));
        }
    }
    if p.fetch_references
        && let Some((i, _)) = attachments.iter().find(|(_, a)| by_url(a) && a.content_type.is_none())
    {
        return Ok((*i, true));
    }
    if attachments.iter().any(|(_, a)| has_data(a) && a.content_type.is_none()) {
        return Err(DocError::decode(ErrorCode::MissingContentType, "an attachment has data but no contentType"));
    }
    if !p.fetch_references && attachments.iter().any(|(_, a)| by_url(a)) {
        return Err(by_reference());
    }
    if attachments.iter().any(|(_, a)| has_data(a) || by_url(a)) {
        return Err(DocError::decode(
            ErrorCode::UnsupportedContentType,
            format!("no attachment has a readable content type (reads: {})", p.content_type_preference.join(", ")),
        ));
    }
    Err(DocError::decode(ErrorCode::EmptyAttachment, "no attachment has data or a url"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> DecodeParams {
        DecodeParams::from_settings(&Settings::load_from(None, Some(Default::default())).unwrap())
    }

    #[test]
    fn type_errors_name_the_path_but_not_the_value() {
        let json =
            br#"{"resourceType":"DocumentReference","id":"a","content":[{"attachment":{"size":"SECRET-VALUE"}}]}"#;
        let e = decode(json, &params()).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidFhir);
        assert!(e.detail.contains("content[0].attachment.size"), "{}", e.detail);
        assert!(!e.detail.contains("SECRET"), "{}", e.detail);
        let json = br#"{"resourceType":"DocumentReference","id":"a","status":{"x":"John Doe"},"content":[]}"#;
        let e = decode(json, &params()).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidFhir);
        assert!(!e.detail.contains("John"), "{}", e.detail);
    }

    /// Other resources — also ones a DocumentReference parse would accept — and duplicate keys get the codes
    /// that say so; a DocumentReference parses to itself.
    #[test]
    fn resource_types_and_duplicates_are_told_apart() {
        let code = |json: &str| parse(json.as_bytes(), &params()).map(|d| d.id).map_err(|e| e.code);
        assert_eq!(code(r#"{"resourceType":"DocumentReference","id":"a"}"#), Ok(Some("a".into())));
        assert_eq!(code(r#"{"resourceType":"Patient","id":"a","status":"x"}"#), Err(ErrorCode::WrongResourceType));
        assert_eq!(code(r#"{"resourceType":"Bundle","type":"collection"}"#), Err(ErrorCode::BundleWithoutDocuments));
        assert_eq!(code(r#"{"resourceType":"Bundle","id":"b"}"#), Err(ErrorCode::BundleWithoutDocuments));
        assert_eq!(code(r#"{"id":"a","status":"current"}"#), Err(ErrorCode::MissingResourceType));
        assert_eq!(code(r#"{"resourceType":7,"id":"a"}"#), Err(ErrorCode::InvalidFhir));
        assert_eq!(code(r#"{"resourceType":"DocumentReference","id":"a","id":"b"}"#), Err(ErrorCode::DuplicateKey));
        assert!(code(r#"{"resourceType":"DocumentReference","resourceType":"DocumentReference"}"#).is_err());
        assert_eq!(code(r#"{"resourceType":"DocumentReference","id":"a"} x"#), Err(ErrorCode::InvalidJson));
    }

    #[test]
    fn ids() {
        assert!(is_valid_id("abc-1.2"));
        assert!(!is_valid_id(""));
        assert!(!is_valid_id("a b"));
        assert!(!is_valid_id(&"a".repeat(65)));
    }
}
