//! HTML / XHTML → plain text that keeps block structure.
//!
//! Block elements (p, div, headings, list items, table rows, ...) become their own lines, separated by a blank
//! line, so section headers and paragraphs survive for the sections and sentences stages; `<br>` is a single line
//! break; list items get a `- ` marker; `script`, `style`, `head` and comments are dropped; character references
//! are decoded; runs of whitespace collapse as a browser would (except inside `<pre>`).
//!
//! This is a tolerant scanner, not a validating parser: malformed markup degrades to text, never to an error.

/// Elements whose content is not text.
const SKIP_CONTENT: &[&str] = &["script", "style", "head", "title", "noscript", "template", "object", "svg"];

/// Elements that start and end a paragraph-level block.
const BLOCKS: &[&str] = &[
    "p",
    "div",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "ul",
    "ol",
    "li",
    "dl",
    "dt",
    "dd",
    "table",
    "thead",
    "tbody",
    "tfoot",
    "tr",
    "section",
    "article",
    "header",
    "footer",
    "aside",
    "nav",
    "main",
    "blockquote",
    "pre",
    "hr",
    "address",
    "figure",
    "figcaption",
    "caption",
    "body",
    "html",
    "form",
    "fieldset",
    "legend",
    "details",
    "summary",
];

pub fn to_text(html: &str) -> String {
    let mut out = Writer::default();
    let bytes = html.as_bytes();
    let mut i = 0;
    let mut text_start = 0;
    let mut pre_depth = 0usize;
    while i < bytes.len() {
        if bytes[i] != b'<' {
            i += 1;
            continue;
        }
        let rest = &html[i..];
        // Flush the text before this '<'.
        let flush = |out: &mut Writer, end: usize, pre: bool| out.text(&html[text_start..end], pre);
        if rest.starts_with("<!--") {
            flush(&mut out, i, pre_depth > 0);
            i = find_from(html, i + 4, "-->").map_or(bytes.len(), |e| e + 3);
            text_start = i;
            continue;
        }
        if rest.starts_with("<![CDATA[") {
            flush(&mut out, i, pre_depth > 0);
            let end = find_from(html, i + 9, "]]>").unwrap_or(bytes.len());
            out.raw_text(&html[i + 9..end], pre_depth > 0);
            i = (end + 3).min(bytes.len());
            text_start = i;
            continue;
        }
        let Some(tag) = parse_tag(html, i) else {
            i += 1; // a literal '<'
            continue;
        };
        flush(&mut out, i, pre_depth > 0);
        i = tag.end;
        text_start = i;
        let Some(name) = tag.name else { continue };
        if !tag.closing && !tag.self_closing && SKIP_CONTENT.contains(&name.as_str()) {
            i = skip_element(html, i, &name);
            text_start = i;
            continue;
        }
        match name.as_str() {
            "br" => out.line_break(),
            "td" | "th" if !tag.closing => out.cell_gap(),
            "pre" => {
                out.block_break();
                if tag.closing {
                    pre_depth = pre_depth.saturating_sub(1);
                } else if !tag.self_closing {
                    pre_depth += 1;
                }
            }
            "li" if !tag.closing => {
                out.block_break();
                out.push_str("- ");
            }
            n if BLOCKS.contains(&n) => out.block_break(),
            _ => {}
        }
    }
    out.text(&html[text_start..], pre_depth > 0);
    out.finish()
}

struct Tag {
    name: Option<String>,
    closing: bool,
    self_closing: bool,
    end: usize,
}

/// Parses the tag starting at `start` (which holds '<'). `None` if this '<' does not open a tag.
fn parse_tag(html: &str, start: usize) -> Option<Tag> {
    let bytes = html.as_bytes();
    let mut j = start + 1;
    let first = *bytes.get(j)?;
    if first == b'!' || first == b'?' {
        // Doctype, processing instruction: skip to '>'.
        let end = find_from(html, j, ">").map_or(bytes.len(), |e| e + 1);
        return Some(Tag { name: None, closing: false, self_closing: true, end });
    }
    let closing = first == b'/';
    if closing {
        j += 1;
    }
    let name_start = j;
    while j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || bytes[j] == b':' || bytes[j] == b'-') {
        j += 1;
    }
    if j == name_start || !bytes[name_start].is_ascii_alphabetic() {
        return None;
    }
    let raw = html[name_start..j].to_ascii_lowercase();
    let name = raw.rsplit(':').next().unwrap_or(&raw).to_string();
    // Find the closing '>' outside quoted attribute values.
    let mut quote: Option<u8> = None;
    while j < bytes.len() {
        let b = bytes[j];
        match quote {
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'"' || b == b'\'' => quote = Some(b),
            None if b == b'>' => break,
            None => {}
        }
        j += 1;
    }
    let self_closing = j > 0 && j < bytes.len() && bytes[j - 1] == b'/';
    Some(Tag { name: Some(name), closing, self_closing, end: (j + 1).min(bytes.len()) })
}

/// Skips past `</name ...>` (case-insensitive), or to the end.
fn skip_element(html: &str, from: usize, name: &str) -> usize {
    let lower_needle = format!("</{name}");
    let bytes = html.as_bytes();
    let mut k = from;
    while let Some(pos) = find_from(html, k, "</") {
        let candidate = &bytes[pos..(pos + lower_needle.len()).min(bytes.len())];
        if candidate.eq_ignore_ascii_case(lower_needle.as_bytes()) {
            return find_from(html, pos, ">").map_or(bytes.len(), |e| e + 1);
        }
        k = pos + 2;
    }
    bytes.len()
}

fn find_from(haystack: &str, from: usize, needle: &str) -> Option<usize> {
    haystack.get(from..)?.find(needle).map(|p| p + from)
}

/// Accumulates text, collapsing whitespace and block breaks.
#[derive(Default)]
struct Writer {
    out: String,
    /// A space is owed before the next visible character (collapsed whitespace).
    pending_space: bool,
}

impl Writer {
    fn at_line_start(&self) -> bool {
        self.out.is_empty() || self.out.ends_with('\n')
    }

    fn push_str(&mut self, s: &str) {
        self.out.push_str(s);
        self.pending_space = false;
    }

    fn text(&mut self, raw: &str, pre: bool) {
        if raw.is_empty() {
            return;
        }
        let decoded = decode_entities(raw);
        self.raw_text(&decoded, pre);
    }

    fn raw_text(&mut self, s: &str, pre: bool) {
        if pre {
            self.out.push_str(s);
            self.pending_space = false;
            return;
        }
        for c in s.chars() {
            if c.is_whitespace() {
                // U+00A0 (from &nbsp;) is whitespace too: it collapses like a space.
                self.pending_space = true;
            } else {
                if self.pending_space && !self.at_line_start() && !self.out.ends_with(' ') {
                    self.out.push(' ');
                }
                self.pending_space = false;
                self.out.push(c);
            }
        }
    }

    fn trim_trailing_spaces(&mut self) {
        let trimmed = self.out.trim_end_matches([' ', '\t']).len();
        self.out.truncate(trimmed);
        self.pending_space = false;
    }

    fn line_break(&mut self) {
        self.trim_trailing_spaces();
        // A `<br>` right after a block break adds nothing: the block already ended the line.
        if !self.out.is_empty() && !self.out.ends_with("\n\n") {
            self.out.push('\n');
        }
    }

    /// Ends the current block with a blank line (at most one blank line in a row).
    fn block_break(&mut self) {
        self.trim_trailing_spaces();
        if self.out.is_empty() || self.out.ends_with("\n\n") {
            return;
        }
        if self.out.ends_with('\n') {
            self.out.push('\n');
        } else {
            self.out.push_str("\n\n");
        }
    }

    fn cell_gap(&mut self) {
        if !self.at_line_start() {
            self.trim_trailing_spaces();
            self.out.push_str("  ");
        }
    }

    fn finish(mut self) -> String {
        self.trim_trailing_spaces();
        let trimmed = self.out.trim_end_matches('\n').len();
        self.out.truncate(trimmed);
        if !self.out.is_empty() {
            self.out.push('\n');
        }
        self.out
    }
}

/// Decodes `&name;`, `&#NNN;` and `&#xHH;`. Unknown references are kept as written.
pub fn decode_entities(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains('&') {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        let semi = after.find(';').filter(|&p| p > 0 && p <= 10);
        let decoded = semi.and_then(|p| {
            let name = &after[..p];
            let c = if let Some(num) = name.strip_prefix("#x").or_else(|| name.strip_prefix("#X")) {
                u32::from_str_radix(num, 16).ok().and_then(char::from_u32)
            } else if let Some(num) = name.strip_prefix('#') {
                num.parse::<u32>().ok().and_then(char::from_u32)
            } else {
                named_entity(name)
            };
            c.map(|c| (c, p))
        });
        match decoded {
            Some((c, p)) => {
                out.push(if c == '\0' { '\u{FFFD}' } else { c });
                rest = &after[p + 1..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

fn named_entity(name: &str) -> Option<char> {
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        "nbsp" => '\u{00A0}',
        "ndash" => '–',
        "mdash" => '—',
        "hellip" => '…',
        "lsquo" => '‘',
        "rsquo" => '’',
        "ldquo" => '“',
        "rdquo" => '”',
        "bull" => '•',
        "middot" => '·',
        "deg" => '°',
        "plusmn" => '±',
        "micro" => 'µ',
        "times" => '×',
        "divide" => '÷',
        "frac12" => '½',
        "frac14" => '¼',
        "frac34" => '¾',
        "sup2" => '²',
        "sup3" => '³',
        "le" => '≤',
        "ge" => '≥',
        "ne" => '≠',
        "larr" => '←',
        "rarr" => '→',
        "uarr" => '↑',
        "darr" => '↓',
        "copy" => '©',
        "reg" => '®',
        "trade" => '™',
        "sect" => '§',
        "para" => '¶',
        "eacute" => 'é',
        "egrave" => 'è',
        "ecirc" => 'ê',
        "aacute" => 'á',
        "agrave" => 'à',
        "iacute" => 'í',
        "oacute" => 'ó',
        "uacute" => 'ú',
        "ntilde" => 'ñ',
        "ccedil" => 'ç',
        "auml" => 'ä',
        "ouml" => 'ö',
        "uuml" => 'ü',
        "szlig" => 'ß',
        "alpha" => 'α',
        "beta" => 'β',
        "gamma" => 'γ',
        "delta" => 'δ',
        "mu" => 'μ',
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_become_lines_and_headers_survive() {
        let html = "<html><head><title>T</title><style>p{}</style></head><body>\
            <h2>Assessment and Plan</h2><p>Chest  pain,\n  likely   <b>musculoskeletal</b>.</p>\
            <ul><li>Ibuprofen</li><li>Follow up</li></ul>Tail<br/>line</body></html>";
        assert_eq!(
            to_text(html),
            "Assessment and Plan\n\nChest pain, likely musculoskeletal.\n\n- Ibuprofen\n\n- Follow up\n\nTail\nline\n"
        );
    }

    #[test]
    fn entities_comments_scripts_and_stray_brackets() {
        let html = "<div>BP &lt; 120&#47;80 &amp; HR &#x3e; 60&nbsp;bpm <!-- hidden --> a < b &unknown; x</div>\
            <script>var s = '</div>';</script><p>End</p>";
        assert_eq!(to_text(html), "BP < 120/80 & HR > 60 bpm a < b &unknown; x\n\nEnd\n");
    }

    #[test]
    fn xhtml_namespaces_pre_and_tables() {
        let html = "<xhtml:div xmlns:xhtml=\"http://www.w3.org/1999/xhtml\"><xhtml:p>FINDINGS:</xhtml:p>\
            <pre>a  b\n c</pre><table><tr><td>Na</td><td>140</td></tr><tr><td>K</td><td>4.1</td></tr></table></xhtml:div>";
        assert_eq!(to_text(html), "FINDINGS:\n\na  b\n c\n\nNa  140\n\nK  4.1\n");
    }

    #[test]
    fn attribute_with_gt_and_unclosed_markup() {
        assert_eq!(to_text("<p title=\"a>b\">x</p><p>y"), "x\n\ny\n");
        assert_eq!(to_text("<p>x<"), "x<\n");
        assert_eq!(to_text("<!-- never closed"), "");
        assert_eq!(
            to_text("<p>IMPRESSION:</p>\n  <br/>No acute abnormality.<br/><br/>End"),
            "IMPRESSION:\n\nNo acute abnormality.\n\nEnd\n"
        );
    }
}
