//! PDF bytes → note text, from the PDF's text layer (lopdf, pure Rust).
//!
//! In: the decoded bytes of an `application/pdf` attachment (inline or fetched). Out: the text of every page in
//! order, pages separated by a blank line (so a heading at the top of a page starts a line, where the section
//! splitter looks for it), or a dead-letter code: `pdf_encrypted` (needs a password), `pdf_malformed` (cannot be
//! parsed, or a page's content stream decompresses past the limit), `pdf_no_text` (no text layer: a scan). OCR is
//! not done. Never panics: lopdf runs under `catch_unwind`, and its decompression is bounded (fuzzed: `fuzz/`).

use std::panic::{AssertUnwindSafe, catch_unwind};

use lopdf::{Document, LoadOptions};

use crate::error::{DocError, ErrorCode};

/// Bound on what any one stream (object streams while loading, a page's content while extracting) may
/// decompress to; a larger one is `pdf_malformed` (a decompression bomb, or not a note).
pub const MAX_DECOMPRESSED_BYTES: usize = 64 << 20;

/// Fewer letters and digits than this in the whole text layer means there is no usable text layer.
const MIN_TEXT_CHARS: usize = 16;

/// The text layer of a PDF, pages in order.
pub fn to_text(bytes: &[u8]) -> Result<String, DocError> {
    match catch_unwind(AssertUnwindSafe(|| extract(bytes))) {
        Ok(result) => result,
        Err(_) => Err(DocError::decode(ErrorCode::PdfMalformed, "the PDF parser failed on this file")),
    }
}

fn extract(bytes: &[u8]) -> Result<String, DocError> {
    let options = LoadOptions { max_decompressed_size: Some(MAX_DECOMPRESSED_BYTES), ..LoadOptions::default() };
    // lopdf opens a PDF encrypted with an empty user password (permissions only) by itself; one that needs a
    // password fails to load, and one it could not decrypt stays encrypted.
    let doc = Document::load_mem_with_options(bytes, options).map_err(|e| match e {
        lopdf::Error::Decryption(_) | lopdf::Error::InvalidPassword | lopdf::Error::UnsupportedSecurityHandler(_) => {
            encrypted()
        }
        other => malformed(&other),
    })?;
    if doc.is_encrypted() {
        return Err(encrypted());
    }
    let pages: Vec<u32> = doc.get_pages().keys().copied().collect();
    if pages.is_empty() {
        return Err(DocError::decode(ErrorCode::PdfMalformed, "the PDF has no pages"));
    }
    let mut text = String::new();
    for page in &pages {
        let page_text = doc.extract_text_with_limit(&[*page], MAX_DECOMPRESSED_BYTES).map_err(|e| malformed(&e))?;
        let page_text = page_text.trim_matches(|c: char| c.is_whitespace());
        if page_text.is_empty() {
            continue;
        }
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(page_text);
    }
    // Some fonts map glyphs to NUL; they carry nothing.
    text.retain(|c| c != '\0');
    if text.chars().filter(|c| c.is_alphanumeric()).count() < MIN_TEXT_CHARS {
        return Err(DocError::decode(
            ErrorCode::PdfNoText,
            format!("the PDF's {} page(s) have no text layer (a scan?); OCR is not done", pages.len()),
        ));
    }
    Ok(text)
}

fn encrypted() -> DocError {
    DocError::decode(ErrorCode::PdfEncrypted, "the PDF is encrypted and needs a password")
}

/// lopdf's error kinds name structures and offsets, never content; the kind alone is kept anyway.
fn malformed(e: &lopdf::Error) -> DocError {
    let kind = format!("{e:?}");
    let kind: String = kind.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
    DocError::decode(ErrorCode::PdfMalformed, format!("the PDF cannot be read ({kind})"))
}

/// Writes a PDF whose pages hold `pages`' lines as a text layer (Helvetica, WinAnsi): for tests, benchmarks and
/// `clinstream produce`-style fixtures. Lines are escaped; characters outside Latin-1 are written as `?`.
pub fn write_text_pdf(pages: &[Vec<String>]) -> Vec<u8> {
    use lopdf::content::{Content, Operation};
    use lopdf::{Object, Stream, dictionary};
    let mut doc = Document::with_version("1.5");
    let pages_id = doc.new_object_id();
    let font_id = doc.add_object(dictionary! {
        "Type" => "Font", "Subtype" => "Type1", "BaseFont" => "Helvetica", "Encoding" => "WinAnsiEncoding",
    });
    let resources_id = doc.add_object(dictionary! { "Font" => dictionary! { "F1" => font_id } });
    let mut kids = Vec::new();
    for lines in pages {
        let mut ops = vec![
            Operation::new("BT", vec![]),
            Operation::new("Tf", vec!["F1".into(), 10.into()]),
            Operation::new("TL", vec![12.into()]),
            Operation::new("Td", vec![50.into(), 760.into()]),
        ];
        for line in lines {
            let latin1: Vec<u8> = line.chars().map(|c| u8::try_from(u32::from(c)).unwrap_or(b'?')).collect();
            ops.push(Operation::new("Tj", vec![Object::string_literal(latin1)]));
            ops.push(Operation::new("T*", vec![]));
        }
        ops.push(Operation::new("ET", vec![]));
        let content = Content { operations: ops }.encode().expect("content encodes");
        let content_id = doc.add_object(Stream::new(dictionary! {}, content));
        kids.push(
            doc.add_object(dictionary! {
                "Type" => "Page", "Parent" => pages_id, "Contents" => content_id,
            })
            .into(),
        );
    }
    let count = kids.len() as i64;
    doc.objects.insert(
        pages_id,
        Object::Dictionary(dictionary! {
            "Type" => "Pages", "Kids" => kids, "Count" => count, "Resources" => resources_id,
            "MediaBox" => vec![0.into(), 0.into(), 595.into(), 842.into()],
        }),
    );
    let catalog_id = doc.add_object(dictionary! { "Type" => "Catalog", "Pages" => pages_id });
    doc.trailer.set("Root", catalog_id);
    let mut out = Vec::new();
    doc.save_to(&mut out).expect("writing to memory");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &[&str]) -> Vec<String> {
        s.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn text_layer_pages_in_order() {
        let pdf = write_text_pdf(&[
            lines(&["HISTORY OF PRESENT ILLNESS:", "Chest pain for two days (no fever)."]),
            lines(&["ASSESSMENT AND PLAN:", "Likely angina. Start aspirin 81 mg."]),
        ]);
        let text = to_text(&pdf).unwrap();
        let hpi = text.find("HISTORY OF PRESENT ILLNESS:").expect("page 1");
        let ap = text.find("ASSESSMENT AND PLAN:").expect("page 2");
        assert!(hpi < ap, "{text}");
        assert!(text.contains("Chest pain for two days (no fever)."), "{text}");
        assert!(text.contains("\n\nASSESSMENT AND PLAN:"), "a page starts after a blank line: {text:?}");
    }

    #[test]
    fn no_text_layer_is_its_own_code() {
        let pdf = write_text_pdf(&[vec![], vec![]]);
        assert_eq!(to_text(&pdf).unwrap_err().code, ErrorCode::PdfNoText);
    }

    #[test]
    fn broken_files_are_malformed_not_panics() {
        let pdf = write_text_pdf(&[lines(&["Some text on a page that is long enough."])]);
        for cut in [0, 8, pdf.len() / 3, pdf.len() / 2, pdf.len() - 10] {
            let e = to_text(&pdf[..cut]);
            // A truncated file may still be repaired by the lenient reader; it must never panic, and when it
            // fails it is pdf_malformed.
            if let Err(e) = e {
                assert!(matches!(e.code, ErrorCode::PdfMalformed | ErrorCode::PdfNoText), "{e}");
            }
        }
        assert_eq!(to_text(b"%PDF-1.7\n garbage").unwrap_err().code, ErrorCode::PdfMalformed);
        assert_eq!(to_text(b"not a pdf").unwrap_err().code, ErrorCode::PdfMalformed);
    }

    fn encrypted_with(user_password: &str) -> Vec<u8> {
        let pdf = write_text_pdf(&[lines(&["Confidential clinic letter with enough text in it."])]);
        let mut doc = Document::load_mem(&pdf).unwrap();
        let id = lopdf::Object::String(b"0123456789abcdef".to_vec(), lopdf::StringFormat::Hexadecimal);
        doc.trailer.set("ID", vec![id.clone(), id]);
        let state = lopdf::EncryptionState::try_from(lopdf::EncryptionVersion::V2 {
            document: &doc,
            owner_password: "owner",
            user_password,
            key_length: 128,
            permissions: lopdf::Permissions::all(),
        })
        .unwrap();
        doc.encrypt(&state).unwrap();
        let mut out = Vec::new();
        doc.save_to(&mut out).unwrap();
        out
    }

    /// Writes the fuzz seeds (`CLINSTREAM_PDF_SEEDS=fuzz/corpus/pdf cargo test --lib write_pdf_seeds -- --ignored`).
    #[test]
    #[ignore]
    fn write_pdf_seeds() {
        let dir = std::path::PathBuf::from(std::env::var("CLINSTREAM_PDF_SEEDS").expect("CLINSTREAM_PDF_SEEDS"));
        std::fs::create_dir_all(&dir).unwrap();
        let seeds = [
            (
                "two-pages",
                write_text_pdf(&[lines(&["HPI:", "Cough (no fever)."]), lines(&["PLAN:", "Rest \\ fluids."])]),
            ),
            ("no-text", write_text_pdf(&[vec![]])),
            ("encrypted", encrypted_with("user")),
            ("permissions-only", encrypted_with("")),
        ];
        for (name, bytes) in seeds {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }

    #[test]
    fn password_protected_is_encrypted() {
        assert_eq!(to_text(&encrypted_with("user")).unwrap_err().code, ErrorCode::PdfEncrypted);
    }

    #[test]
    fn permissions_only_encryption_is_read() {
        // An empty user password: every viewer opens it, and so does the worker.
        let text = to_text(&encrypted_with("")).unwrap();
        assert!(text.contains("Confidential clinic letter"), "{text}");
    }
}
