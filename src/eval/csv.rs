//! CSV rows of the evaluation sets as maps from header name to field (RFC 4180 through the `csv` crate: quoted
//! fields, doubled quotes, line breaks inside quotes; a byte-order mark before the header is dropped).

use std::collections::HashMap;

/// Rows as maps from header name to field; short rows are padded with empty fields, blank lines skipped.
/// A malformed row (invalid UTF-8, a broken quote at the end) ends the rows read.
pub fn records(text: &str) -> Vec<HashMap<String, String>> {
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(text.as_bytes());
    let Ok(header) = reader.headers() else { return Vec::new() };
    let header: Vec<String> = header.iter().map(|h| h.trim_start_matches('\u{feff}').to_string()).collect();
    reader
        .records()
        .map_while(Result::ok)
        .filter(|r| !(r.len() == 1 && r[0].is_empty()))
        .map(|r| {
            header.iter().cloned().zip(r.iter().map(str::to_string).chain(std::iter::repeat(String::new()))).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn quoted_fields_and_padding() {
        let rows = super::records("\u{feff}a,b\n\"x, y\",\"he said \"\"hi\"\"\nnext line\"\n1\n");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["a"], "x, y");
        assert_eq!(rows[0]["b"], "he said \"hi\"\nnext line");
        assert_eq!(rows[1]["a"], "1");
        assert_eq!(rows[1]["b"], "", "a short row is padded");
    }
}
