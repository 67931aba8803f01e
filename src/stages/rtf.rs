//! RTF → plain text.
//!
//! Keeps the text and the paragraph structure (`\par`, `\line`, table rows become line breaks) and drops
//! everything else: font and colour tables, stylesheets, document info, pictures, field instructions, and any
//! `{\* ...}` ignorable destination. `\'hh` escapes are read as windows-1252 (the `\ansicpg1252` that clinical
//! systems emit); `\uN` escapes as Unicode, skipping the `\ucN` fallback characters that follow them.
//! Fails with `invalid_rtf` when the input does not start with `{\rtf` or closes more groups than it opens.

use crate::error::{DocError, ErrorCode};
use crate::stages::charset::windows_1252;

/// Destinations whose content is not document text.
const SKIP_DESTINATIONS: &[&str] = &[
    "fonttbl",
    "colortbl",
    "stylesheet",
    "info",
    "pict",
    "object",
    "datastore",
    "themedata",
    "colorschememapping",
    "latentstyles",
    "rsidtbl",
    "listtable",
    "listoverridetable",
    "generator",
    "xmlnstbl",
    "fldinst",
    "filetbl",
    "revtbl",
    "header",
    "headerl",
    "headerr",
    "headerf",
    "footer",
    "footerl",
    "footerr",
    "footerf",
    "pnseclvl",
    "pntext",
    "pntxta",
    "pntxtb",
    "bkmkstart",
    "bkmkend",
    "shppict",
    "nonshppict",
    "mmathPr",
    "wgrffmtfilter",
    "operator",
    "author",
    "title",
    "company",
];

#[derive(Clone, Copy)]
struct GroupState {
    skip: bool,
    /// Fallback characters to skip after `\uN` (the `\uc` value).
    uc: usize,
}

pub fn to_text(bytes: &[u8]) -> Result<String, DocError> {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(bytes.len());
    if !bytes[start..].starts_with(b"{\\rtf") {
        return Err(DocError::decode(ErrorCode::InvalidRtf, "text/rtf data does not start with {\\rtf"));
    }
    let mut out = String::with_capacity(bytes.len() / 2);
    let mut stack: Vec<GroupState> = Vec::new();
    let mut state = GroupState { skip: false, uc: 1 };
    // Fallback characters still to skip after a \uN.
    let mut to_skip = 0usize;
    // True right after `{` (a destination control word may follow) or `{\*`.
    let mut group_start = false;
    let mut ignorable = false;
    let mut i = start;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'{' => {
                stack.push(state);
                group_start = true;
                ignorable = false;
                i += 1;
                continue;
            }
            b'}' => {
                state = stack.pop().ok_or_else(|| {
                    DocError::decode(ErrorCode::InvalidRtf, "text/rtf closes more groups than it opens")
                })?;
                to_skip = 0;
                i += 1;
                group_start = false;
                continue;
            }
            b'\\' => {
                let Some(&next) = bytes.get(i + 1) else { break };
                if next.is_ascii_alphabetic() {
                    let mut j = i + 1;
                    while j < bytes.len() && bytes[j].is_ascii_alphabetic() {
                        j += 1;
                    }
                    let word = std::str::from_utf8(&bytes[i + 1..j]).unwrap_or("");
                    let param_start = j;
                    if j < bytes.len() && bytes[j] == b'-' {
                        j += 1;
                    }
                    while j < bytes.len() && bytes[j].is_ascii_digit() {
                        j += 1;
                    }
                    let param: Option<i64> =
                        std::str::from_utf8(&bytes[param_start..j]).ok().and_then(|s| s.parse().ok());
                    if j < bytes.len() && bytes[j] == b' ' {
                        j += 1;
                    }
                    i = j;
                    if (group_start && SKIP_DESTINATIONS.contains(&word)) || ignorable {
                        state.skip = true;
                    }
                    group_start = false;
                    ignorable = false;
                    if state.skip {
                        continue;
                    }
                    match word {
                        "par" | "line" | "row" | "sect" | "page" => push_text(&mut out, "\n", &mut to_skip, false),
                        "tab" => push_text(&mut out, "\t", &mut to_skip, false),
                        "cell" => push_text(&mut out, "  ", &mut to_skip, false),
                        "emdash" => push_char(&mut out, '—', &mut to_skip),
                        "endash" => push_char(&mut out, '–', &mut to_skip),
                        "bullet" => push_char(&mut out, '•', &mut to_skip),
                        "lquote" => push_char(&mut out, '‘', &mut to_skip),
                        "rquote" => push_char(&mut out, '’', &mut to_skip),
                        "ldblquote" => push_char(&mut out, '“', &mut to_skip),
                        "rdblquote" => push_char(&mut out, '”', &mut to_skip),
                        "uc" => state.uc = param.unwrap_or(1).clamp(0, 16) as usize,
                        "u" => {
                            if let Some(p) = param {
                                let code = if p < 0 { p + 65536 } else { p } as u32;
                                out.push(char::from_u32(code).unwrap_or('\u{FFFD}'));
                                to_skip = state.uc;
                            }
                        }
                        _ => {}
                    }
                    continue;
                }
                group_start = false;
                match next {
                    b'*' => {
                        ignorable = true;
                        i += 2;
                    }
                    b'\'' => {
                        let hex = bytes.get(i + 2..i + 4).and_then(|h| std::str::from_utf8(h).ok());
                        let byte = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
                        i += if byte.is_some() { 4 } else { 2 };
                        if let (Some(byte), false) = (byte, state.skip) {
                            if to_skip > 0 {
                                to_skip -= 1;
                            } else {
                                out.push_str(&windows_1252(&[byte]));
                            }
                        }
                    }
                    b'\\' | b'{' | b'}' => {
                        if !state.skip {
                            push_char(&mut out, next as char, &mut to_skip);
                        }
                        i += 2;
                    }
                    b'\n' | b'\r' => {
                        if !state.skip {
                            push_text(&mut out, "\n", &mut to_skip, false);
                        }
                        i += 2;
                    }
                    b'~' => {
                        if !state.skip {
                            push_char(&mut out, ' ', &mut to_skip);
                        }
                        i += 2;
                    }
                    b'_' => {
                        if !state.skip {
                            push_char(&mut out, '-', &mut to_skip);
                        }
                        i += 2;
                    }
                    _ => i += 2, // \- optional hyphen, \| and other symbols
                }
                continue;
            }
            b'\r' | b'\n' => {
                i += 1;
                continue;
            }
            _ => {}
        }
        group_start = false;
        // A run of plain text.
        let run_start = i;
        while i < bytes.len() && !matches!(bytes[i], b'{' | b'}' | b'\\' | b'\r' | b'\n') {
            i += 1;
        }
        if !state.skip {
            let run = &bytes[run_start..i];
            let text = match std::str::from_utf8(run) {
                Ok(s) => s.to_string(),
                Err(_) => windows_1252(run),
            };
            push_text(&mut out, &text, &mut to_skip, true);
        }
    }
    Ok(tidy(&out))
}

fn push_char(out: &mut String, c: char, to_skip: &mut usize) {
    if *to_skip > 0 {
        *to_skip -= 1;
    } else {
        out.push(c);
    }
}

fn push_text(out: &mut String, s: &str, to_skip: &mut usize, skippable: bool) {
    if skippable && *to_skip > 0 {
        let mut chars = s.chars();
        while *to_skip > 0 && chars.next().is_some() {
            *to_skip -= 1;
        }
        out.push_str(chars.as_str());
    } else {
        *to_skip = 0;
        out.push_str(s);
    }
}

/// Trims trailing spaces on each line and leading/trailing blank lines.
fn tidy(s: &str) -> String {
    let lines: Vec<&str> = s.split('\n').map(|l| l.trim_end()).collect();
    let joined = lines.join("\n");
    let trimmed = joined.trim_matches('\n');
    if trimmed.is_empty() { String::new() } else { format!("{trimmed}\n") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paragraphs_and_tables_are_kept() {
        let rtf = br"{\rtf1\ansi\ansicpg1252\deff0{\fonttbl{\f0\fswiss Arial;}}{\colortbl;\red0\green0\blue0;}
{\*\generator Riched20;}\viewkind4\uc1\pard\f0\fs20 HISTORY OF PRESENT ILLNESS:\par
The patient has \b chest pain\b0 .\par
{\*\bkmkstart x}Temp 38\'b0C, caf\'e9 \u8805?5 mg\par
\trowd\cellx1000\cellx2000 Na\cell 140\cell\row
}";
        assert_eq!(
            to_text(rtf).unwrap(),
            "HISTORY OF PRESENT ILLNESS:\nThe patient has chest pain.\nTemp 38°C, café ≥5 mg\nNa  140\n"
        );
    }

    #[test]
    fn escapes_and_errors() {
        assert_eq!(to_text(br"{\rtf1 a\{b\}c\\d\~e}").unwrap(), "a{b}c\\d e\n");
        assert_eq!(to_text(b"plain text").unwrap_err().code, ErrorCode::InvalidRtf);
        assert_eq!(to_text(br"{\rtf1 a}}").unwrap_err().code, ErrorCode::InvalidRtf);
        assert_eq!(to_text(br"{\rtf1 {\info{\author Someone}}text}").unwrap(), "text\n");
    }
}
