//! Text bytes → UTF-8 by charset, used by the attachment stage and by the RTF converter (its `\'hh` escapes
//! are windows-1252 by default).
//!
//! Charsets: UTF-8 (with or without BOM), UTF-16 with a BOM (or an explicit `utf-16le`/`utf-16be` label),
//! ISO-8859-1 and windows-1252 (decoded as windows-1252, as browsers do: the two differ only in 0x80–0x9F,
//! where ISO-8859-1 holds unprintable C1 controls). A byte-order mark overrides the declared charset.

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
    match declared.map(str::trim) {
        None | Some("") | Some("utf-8") | Some("utf8") | Some("unicode-1-1-utf-8") => utf8(bytes).map(|s| (s, "utf-8")),
        Some("utf-16le") => utf16(bytes, u16::from_le_bytes).map(|s| (s, "utf-16le")),
        Some("utf-16be") => utf16(bytes, u16::from_be_bytes).map(|s| (s, "utf-16be")),
        Some("utf-16") | Some("ucs-2") | Some("unicode") => Err(DocError::decode(
            ErrorCode::InvalidUtf16,
            "charset utf-16 without a byte-order mark (declare utf-16le or utf-16be, or add a BOM)",
        )),
        Some(
            "iso-8859-1" | "iso8859-1" | "iso_8859-1" | "latin1" | "latin-1" | "l1" | "cp819" | "ibm819"
            | "windows-1252" | "cp1252" | "x-cp1252" | "us-ascii" | "ascii" | "iso-ir-100" | "csisolatin1",
        ) => Ok((windows_1252(bytes), "windows-1252")),
        Some(_) => Err(DocError::decode(
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
    const HIGH: [char; 32] = [
        '\u{20AC}', '\u{0081}', '\u{201A}', '\u{0192}', '\u{201E}', '\u{2026}', '\u{2020}', '\u{2021}', '\u{02C6}',
        '\u{2030}', '\u{0160}', '\u{2039}', '\u{0152}', '\u{008D}', '\u{017D}', '\u{008F}', '\u{0090}', '\u{2018}',
        '\u{2019}', '\u{201C}', '\u{201D}', '\u{2022}', '\u{2013}', '\u{2014}', '\u{02DC}', '\u{2122}', '\u{0161}',
        '\u{203A}', '\u{0153}', '\u{009D}', '\u{017E}', '\u{0178}',
    ];
    bytes
        .iter()
        .map(|&b| match b {
            0x80..=0x9F => HIGH[(b - 0x80) as usize],
            _ => b as char,
        })
        .collect()
}
