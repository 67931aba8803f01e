//! A small RFC 4180 CSV reader (quoted fields, doubled quotes, line breaks inside quotes) for the evaluation
//! sets; enough for their files without another dependency.

/// Parses CSV text into rows of fields.
pub fn parse(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    let mut any = false;
    while let Some(c) = chars.next() {
        any = true;
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    field.push('"');
                    chars.next();
                }
                '"' => quoted = false,
                _ => field.push(c),
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            ',' => row.push(std::mem::take(&mut field)),
            '\r' => {}
            '\n' => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
                any = false;
            }
            _ => field.push(c),
        }
    }
    if any {
        row.push(field);
        rows.push(row);
    }
    rows
}

/// Rows as maps from header name to field.
pub fn records(text: &str) -> Vec<std::collections::HashMap<String, String>> {
    let mut rows = parse(text).into_iter();
    let Some(header) = rows.next() else { return Vec::new() };
    let header: Vec<String> = header.into_iter().map(|h| h.trim_start_matches('\u{feff}').to_string()).collect();
    rows.filter(|r| !(r.len() == 1 && r[0].is_empty()))
        .map(|r| header.iter().cloned().zip(r.into_iter().chain(std::iter::repeat(String::new()))).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn quoted_fields() {
        let rows = super::parse("a,b\n\"x, y\",\"he said \"\"hi\"\"\nnext line\"\n1,2");
        assert_eq!(rows, vec![vec!["a", "b"], vec!["x, y", "he said \"hi\"\nnext line"], vec!["1", "2"]]);
    }
}
