//! Text bytes → UTF-8 by charset, used by the attachment stage and by the RTF converter (its `\'hh` escapes
//! are windows-1252 by default).
//!
//! Charsets: UTF-8 (with or without BOM), UTF-16 with a BOM (or an explicit `utf-16le`/`utf-16be` label),
//! ISO-8859-1 and windows-1252 (decoded as windows-1252, as browsers do: the two differ only in 0x80–0x9F,
//! where ISO-8859-1 holds unprintable C1 controls). Charset labels are read by the WHATWG Encoding Standard's
//! table (`encoding_rs`), so every spelling a browser accepts for these is accepted. A byte-order mark overrides the declared charset.

use encoding_rs::{Encoding, UTF_8, UTF_16BE, UTF_16LE, WINDOWS_1252};

use crate::error::{DocError, ErrorCode};

/// Decodes text bytes by BOM, then declared charset, then UTF-8. Returns the text and the charset used.
pub fn decode_charset(bytes: &[u8], declared: Option<&str>) -> Result<(String, &'static str), DocError> {
    if let Some(rest) = bytes.strip_prefix(b"\xEF\xBB\xBF") {
        return utf8(rest).map(|s| (s, "utf-8"));
    }
    if let Some(rest) = bytes.strip_prefix(b"\xFF\xFE") {
        return utf16(rest, u16::from_le_bytes).map(|s| (s, "utf-16le"));
    }
    if let Some(rest) = bytes.strip_prefix(b"\xFE\xFF") {
        return utf16(rest, u16::from_be_bytes).map(|s| (s, "utf-16be"));
    }
    let label = declared.map(str::trim).unwrap_or("");
    if label.is_empty() {
        return utf8(bytes).map(|s| (s, "utf-8"));
    }
    // WHATWG reads a bare `utf-16` as little-endian; without a BOM we refuse to guess.
    if ["utf-16", "ucs-2", "unicode"].iter().any(|l| label.eq_ignore_ascii_case(l)) {
        return Err(DocError::decode(
            ErrorCode::InvalidUtf16,
            "charset utf-16 without a byte-order mark (declare utf-16le or utf-16be, or add a BOM)",
        ));
    }
    // The WHATWG Encoding Standard's labels (encoding_rs), and two spellings seen in the wild that it lacks.
    let encoding = Encoding::for_label(label.as_bytes())
        .or_else(|| ["latin-1", "ascii"].iter().any(|l| label.eq_ignore_ascii_case(l)).then_some(WINDOWS_1252));
    match encoding {
        Some(e) if e == UTF_8 => utf8(bytes).map(|s| (s, "utf-8")),
        Some(e) if e == UTF_16LE => utf16(bytes, u16::from_le_bytes).map(|s| (s, "utf-16le")),
        Some(e) if e == UTF_16BE => utf16(bytes, u16::from_be_bytes).map(|s| (s, "utf-16be")),
        Some(e) if e == WINDOWS_1252 => Ok((windows_1252(bytes), "windows-1252")),
        _ => Err(DocError::decode(
            ErrorCode::UnsupportedCharset,
            "unsupported charset (supported: utf-8, utf-16 with BOM, utf-16le, utf-16be, iso-8859-1, windows-1252)",
        )),
    }
}

fn utf8(bytes: &[u8]) -> Result<String, DocError> {
    String::from_utf8(bytes.to_vec()).map_err(|e| {
        DocError::decode(ErrorCode::InvalidUtf8, format!("invalid UTF-8 at byte {}", e.utf8_error().valid_up_to()))
    })
}

fn utf16(bytes: &[u8], read: fn([u8; 2]) -> u16) -> Result<String, DocError> {
    if !bytes.len().is_multiple_of(2) {
        return Err(DocError::decode(ErrorCode::InvalidUtf16, "UTF-16 data has an odd number of bytes"));
    }
    let units = bytes.chunks_exact(2).map(|c| read([c[0], c[1]]));
    char::decode_utf16(units)
        .collect::<Result<String, _>>()
        .map_err(|_| DocError::decode(ErrorCode::InvalidUtf16, "UTF-16 data holds an unpaired surrogate"))
}

/// windows-1252 → UTF-8 (bytes 0x80–0x9F per the WHATWG index; undefined ones map to the C1 control).
pub fn windows_1252(bytes: &[u8]) -> String {
    WINDOWS_1252.decode_without_bom_handling(bytes).0.into_owned()
}
