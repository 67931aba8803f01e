//! Fuzzes the PDF text-layer reader (`stages::pdf`, lopdf) on arbitrary bytes, seeded with PDFs the worker's
//! own writer makes (fuzz/corpus/pdf). Checks: no crash, no hang, no unbounded memory; a result is text with
//! letters or one of the three PDF codes.
//!
//! libfuzzer-sys turns any panic into an abort, also one the worker would catch (`catch_unwind` in
//! `stages::pdf`), so a panic inside lopdf is reported here as a finding even though the worker survives it.
#![no_main]

use clinstream::error::ErrorCode;
use clinstream::stages::pdf;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match pdf::to_text(data) {
        Ok(text) => assert!(text.chars().filter(|c| c.is_alphanumeric()).count() >= 16),
        Err(e) => assert!(
            matches!(e.code, ErrorCode::PdfMalformed | ErrorCode::PdfEncrypted | ErrorCode::PdfNoText),
            "{e}"
        ),
    }
});
