//! Attachment bytes → note text: base64, size and hash checks, charsets, and markup removal.
//!
//! In: one FHIR `Attachment` (already chosen by `decode`). Out: the note's plain text, with line endings
//! normalised to `\n`, and what was used to decode it. Fails with a dead-letter code per rule; messages carry
//! limits and field names only.
//!
//! Charsets: `charset` (shared with the RTF converter).

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use sha1::Digest as _;

use crate::error::{DocError, ErrorCode};
pub use crate::stages::charset::{decode_charset, windows_1252};
use crate::stages::{html, pdf, rtf};

/// Content types the worker reads, lower-case, without parameters.
pub const SUPPORTED_CONTENT_TYPES: &[&str] = &[
    "text/plain",
    "text/markdown",
    "text/html",
    "application/xhtml+xml",
    "text/rtf",
    "application/rtf",
    "application/pdf",
];

/// A parsed `contentType`: the essence (`text/plain`) and the charset parameter, both lower-case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaType {
    pub essence: String,
    pub charset: Option<String>,
}

impl MediaType {
    pub fn parse(s: &str) -> MediaType {
        let mut parts = s.split(';');
        let essence = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        // Aliases seen in real feeds (HL7's own US Core example says `application/xhtml`).
        let essence = match essence.as_str() {
            "application/xhtml" | "text/xhtml" => "application/xhtml+xml".to_string(),
            "application/x-rtf" | "text/x-rtf" => "application/rtf".to_string(),
            "text/x-markdown" => "text/markdown".to_string(),
            _ => essence,
        };
        let charset = parts.find_map(|p| {
            let (k, v) = p.split_once('=')?;
            (k.trim().eq_ignore_ascii_case("charset")).then(|| v.trim().trim_matches('"').trim().to_ascii_lowercase())
        });
        MediaType { essence, charset }
    }

    pub fn is_supported(&self) -> bool {
        SUPPORTED_CONTENT_TYPES.contains(&self.essence.as_str())
    }
}

const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Decodes standard-alphabet base64, tolerating ASCII whitespace and line breaks anywhere. The size limit is
/// checked before decoding, from the encoded length.
pub fn decode_base64(data: &str, max_bytes: usize) -> Result<Vec<u8>, DocError> {
    // Most attachments hold no whitespace and fit the limit: decode them as they are, without a pass looking for
    // whitespace first. Whitespace fails this decode (it is no base64 symbol), and every failure takes the path
    // below, which answers as if this one had not been tried.
    if data.len() / 4 * 3 <= max_bytes.saturating_add(3)
        && let Ok(bytes) = BASE64.decode(data.as_bytes())
        && bytes.len() <= max_bytes
    {
        return Ok(bytes);
    }
    let needs_strip = data.bytes().any(|b| b.is_ascii_whitespace());
    let owned;
    let compact: &[u8] = if needs_strip {
        owned = data.bytes().filter(|b| !b.is_ascii_whitespace()).collect::<Vec<u8>>();
        &owned
    } else {
        data.as_bytes()
    };
    let estimated = compact.len() / 4 * 3;
    if estimated > max_bytes.saturating_add(3) {
        return Err(DocError::decode(
            ErrorCode::AttachmentTooLarge,
            format!("attachment decodes to about {estimated} bytes; the limit is {max_bytes}"),
        ));
    }
    let bytes = BASE64.decode(compact).map_err(|e| {
        // The base64 error names a byte offset and the offending symbol; the symbol is not PHI (it is not valid
        // base64, so it carries no decoded text), but keep to the offset and kind anyway.
        let why = match e {
            base64::DecodeError::InvalidByte(offset, _) => format!("invalid base64 symbol at offset {offset}"),
            base64::DecodeError::InvalidLength(_) => "invalid base64 length".to_string(),
            base64::DecodeError::InvalidLastSymbol(offset, _) => {
                format!("invalid last base64 symbol at offset {offset}")
            }
            base64::DecodeError::InvalidPadding => "invalid base64 padding".to_string(),
        };
        DocError::decode(ErrorCode::InvalidBase64, format!("attachment.data: {why}"))
    })?;
    if bytes.len() > max_bytes {
        return Err(DocError::decode(
            ErrorCode::AttachmentTooLarge,
            format!("attachment decodes to {} bytes; the limit is {max_bytes}", bytes.len()),
        ));
    }
    Ok(bytes)
}

/// Checks `size` and (when asked) `hash`. Returns whether a hash was verified.
pub fn verify(bytes: &[u8], size: Option<u64>, hash: Option<&str>, verify_hash: bool) -> Result<bool, DocError> {
    if let Some(size) = size
        && size != bytes.len() as u64
    {
        return Err(DocError::decode(
            ErrorCode::SizeMismatch,
            format!("attachment.size is {size} but the data decodes to {} bytes", bytes.len()),
        ));
    }
    let Some(hash) = hash.filter(|_| verify_hash) else { return Ok(false) };
    let expected = BASE64.decode(hash.trim()).ok().filter(|d| d.len() == 20).ok_or_else(|| {
        DocError::decode(ErrorCode::InvalidHash, "attachment.hash is not a base64 SHA-1 digest (20 bytes)")
    })?;
    let actual = sha1::Sha1::digest(bytes);
    if actual.as_slice() != expected.as_slice() {
        return Err(DocError::decode(ErrorCode::HashMismatch, "attachment.hash does not match the SHA-1 of the data"));
    }
    Ok(true)
}

/// Normalises line endings to `\n` and drops a leading U+FEFF.
pub fn normalize_newlines(text: String) -> String {
    let text = match text.strip_prefix('\u{FEFF}') {
        Some(rest) => rest.to_string(),
        None => text,
    };
    if !text.contains('\r') {
        return text;
    }
    text.replace("\r\n", "\n").replace('\r', "\n")
}

/// Turns decoded attachment bytes of a supported media type into the note's plain text.
pub fn to_text(media: &MediaType, bytes: &[u8]) -> Result<(String, &'static str), DocError> {
    let (text, charset) = match media.essence.as_str() {
        // RTF is 7-bit with its own escapes; the charset parameter, if any, is irrelevant.
        "text/rtf" | "application/rtf" => (rtf::to_text(bytes)?, "rtf"),
        // A PDF's text layer is Unicode already (fonts' encodings and ToUnicode maps).
        "application/pdf" => (pdf::to_text(bytes)?, "pdf"),
        _ => decode_charset(bytes, media.charset.as_deref())?,
    };
    if text.contains('\0') {
        return Err(DocError::decode(ErrorCode::BinaryContent, "text attachment holds NUL bytes"));
    }
    let text = match media.essence.as_str() {
        "text/html" | "application/xhtml+xml" => html::to_text(&text),
        _ => text,
    };
    let text = normalize_newlines(text);
    if text.trim().is_empty() {
        return Err(DocError::decode(ErrorCode::EmptyNote, "the attachment holds no text"));
    }
    Ok((text, charset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_type_parsing() {
        assert_eq!(
            MediaType::parse("Text/Plain; charset=\"UTF-8\""),
            MediaType { essence: "text/plain".into(), charset: Some("utf-8".into()) }
        );
        assert_eq!(MediaType::parse("text/html").charset, None);
        assert_eq!(MediaType::parse("application/xhtml").essence, "application/xhtml+xml");
        assert!(MediaType::parse("application/pdf").is_supported());
        assert!(!MediaType::parse("image/png").is_supported());
    }

    #[test]
    fn base64_tolerates_whitespace_and_rejects_other_alphabets() {
        assert_eq!(decode_base64("aGVs\nbG8g\r\nd29y bGQ=", 100).unwrap(), b"hello world");
        assert_eq!(decode_base64("aGVsbG8", 100).unwrap(), b"hello", "missing padding tolerated");
        let e = decode_base64("aGV-bG8_", 100).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidBase64);
        let e = decode_base64("aGVsbG8gd29ybGQ=", 5).unwrap_err();
        assert_eq!(e.code, ErrorCode::AttachmentTooLarge);
        // Whitespace that makes the encoded text look too large for the limit: what counts is what it decodes to.
        assert_eq!(decode_base64(&format!("aGVs{}bG8=", " \n".repeat(40)), 5).unwrap(), b"hello");
        let e = decode_base64(&format!("aGVs{}bG8gd29ybGQ=", "\r\n".repeat(40)), 5).unwrap_err();
        assert_eq!(e.code, ErrorCode::AttachmentTooLarge);
        let e = decode_base64("aGVs\nbG8*", 100).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidBase64);
    }

    #[test]
    fn size_and_hash() {
        // SHA-1("hello") = aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d
        let hash = BASE64.encode([
            0xaa, 0xf4, 0xc6, 0x1d, 0xdc, 0xc5, 0xe8, 0xa2, 0xda, 0xbe, 0xde, 0x0f, 0x3b, 0x48, 0x2c, 0xd9, 0xae, 0xa9,
            0x43, 0x4d,
        ]);
        assert_eq!(verify(b"hello", Some(5), Some(&hash), true), Ok(true));
        assert_eq!(verify(b"hello", None, Some(&hash), false), Ok(false));
        assert_eq!(verify(b"hellO", None, Some(&hash), true).unwrap_err().code, ErrorCode::HashMismatch);
        assert_eq!(verify(b"hello", Some(6), None, true).unwrap_err().code, ErrorCode::SizeMismatch);
        assert_eq!(verify(b"hello", None, Some("abc"), true).unwrap_err().code, ErrorCode::InvalidHash);
    }

    #[test]
    fn charsets() {
        assert_eq!(decode_charset(b"\xEF\xBB\xBFcaf\xC3\xA9", None).unwrap(), ("café".into(), "utf-8"));
        assert_eq!(decode_charset(b"\xFF\xFEc\0a\0f\0\xE9\0", Some("utf-8")).unwrap(), ("café".into(), "utf-16le"));
        assert_eq!(decode_charset(b"\xFE\xFF\0c\0a\0f\0\xE9", None).unwrap(), ("café".into(), "utf-16be"));
        assert_eq!(decode_charset(b"caf\xE9 \x93q\x94", Some("iso-8859-1")).unwrap().0, "café \u{201C}q\u{201D}");
        assert_eq!(decode_charset(b"caf\xE9", None).unwrap_err().code, ErrorCode::InvalidUtf8);
        assert_eq!(decode_charset(b"abc", Some("koi8-r")).unwrap_err().code, ErrorCode::UnsupportedCharset);
        assert_eq!(decode_charset(b"a\0b", Some("utf-16")).unwrap_err().code, ErrorCode::InvalidUtf16);
        assert_eq!(decode_charset(b"\xFF\xFEa", None).unwrap_err().code, ErrorCode::InvalidUtf16);
        assert_eq!(decode_charset(b"\xFF\xFE\x00\xD8", None).unwrap_err().code, ErrorCode::InvalidUtf16);
    }

    #[test]
    fn text_is_normalised() {
        let mt = MediaType::parse("text/plain");
        assert_eq!(to_text(&mt, b"a\r\nb\rc").unwrap().0, "a\nb\nc");
        assert_eq!(to_text(&mt, b"  \n ").unwrap_err().code, ErrorCode::EmptyNote);
        assert_eq!(to_text(&mt, b"a\0b").unwrap_err().code, ErrorCode::BinaryContent);
    }
}
