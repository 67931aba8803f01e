//! The crate's layer order (docs/architecture.md, `src/lib.rs`): every module imports only from modules in
//! lower layers or its own top-level module, so the import graph has no cycles and no upward arrows. This reads
//! every `crate::…` and `super::…` path in `src/` (tests inside `#[cfg(test)] mod tests` excluded) and fails
//! with the offending file and path.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Lowest first; one module per layer (docs/architecture.md has the same table).
const LAYERS: &[&str] = &[
    "config",
    "error",
    "tls",
    "backoff",
    "model",
    "telemetry",
    "pool",
    "lexicon",
    "stages",
    "codec",
    "embed",
    "store",
    "query",
    "fhir",
    "llm",
    "index",
    "kafka",
    "ack",
    "source",
    "sink",
    "runner",
    "http",
    "serve",
    "app",
    "kg",
    "eval",
    "cli",
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|m| *m == module)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`src/source/kafka.rs` → `source`); `None` for the crate root files.
fn owner(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.trim_end_matches(".rs").to_string();
    // `bin/` holds other binaries of the crate (`clinstream-lab`): they use the library from outside, as
    // `clinstream::…`, never as `crate::…`.
    (name != "lib" && name != "main" && name != "bin").then_some(name)
}

/// Top-level modules named by `crate::` paths in `code`: `crate::a::…` and `crate::{a, b::…}`.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The matching close brace (groups nest: `crate::{a::{B, C}, d}`).
            let mut open = 1;
            let end = group
                .char_indices()
                .find_map(|(j, c)| {
                    open += i32::from(c == '{') - i32::from(c == '}');
                    (open == 0).then_some(j)
                })
                .unwrap_or(group.len());
            // Top-level names inside the braces: those at nesting depth 0, each before `::` or `,`.
            let mut depth = 0;
            let mut start = 0;
            let inner = &group[..end];
            for (j, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        push_head(&inner[start..j], &mut refs);
                        start = j + 1;
                    }
                    _ => {}
                }
            }
            push_head(&inner[start..], &mut refs);
        } else {
            push_head(rest, &mut refs);
        }
    }
    refs
}

fn push_head(path: &str, refs: &mut BTreeSet<String>) {
    let head: String = path.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    if !head.is_empty() && head.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
        refs.insert(head);
    }
}

/// The code of a file without its comments and its unit-test module (tests may reach anywhere).
fn without_tests(code: &str) -> String {
    let code = match code.find("#[cfg(test)]\nmod tests") {
        Some(i) => &code[..i],
        None => code,
    };
    code.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

#[test]
fn no_module_imports_from_a_higher_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    let mut seen_modules = BTreeSet::new();
    for file in &files {
        let Some(module) = owner(&src, file) else { continue };
        seen_modules.insert(module.clone());
        let Some(own) = rank(&module) else {
            problems.push(format!("{}: module `{module}` is not in the layer list", file.display()));
            continue;
        };
        let code = std::fs::read_to_string(file).unwrap();
        for target in crate_refs(&without_tests(&code)) {
            if target == module || target == "WORKER_VERSION" {
                continue;
            }
            match rank(&target) {
                Some(t) if t < own => {}
                Some(_) => {
                    problems.push(format!("{}: `{module}` imports `crate::{target}` (a higher layer)", file.display()))
                }
                None => problems.push(format!("{}: `crate::{target}` is not a known module", file.display())),
            }
        }
    }
    assert!(problems.is_empty(), "layering violations:\n{}", problems.join("\n"));
    for m in LAYERS {
        assert!(seen_modules.contains(*m), "layer `{m}` has no source file (update LAYERS)");
    }
}

#[test]
fn config_imports_nothing_from_the_crate() {
    let code = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config.rs")).unwrap();
    let refs = crate_refs(&without_tests(&code));
    assert!(refs.is_empty(), "config.rs imports {refs:?}");
}

#[test]
fn the_reader_itself_finds_paths() {
    let refs =
        crate_refs("use crate::model::{A, B};\nuse crate::{ack::Acks, error::{E, F}, runner};\nx(crate::stages::f())");
    assert_eq!(refs.into_iter().collect::<Vec<_>>(), ["ack", "error", "model", "runner", "stages"]);
}

/// Inside one module directory, the files' imports form no cycle either (e.g. `stages/rtf.rs` and
/// `stages/attachment.rs` once imported each other; the charset helpers now live in `stages/charset.rs`).
#[test]
fn no_import_cycles_between_the_files_of_a_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut cycles = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let module = dir.file_name().unwrap().to_str().unwrap().to_string();
        let files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| {
                let p = e.ok()?.path();
                let stem = p.file_stem()?.to_str()?.to_string();
                (p.extension()? == "rs" && stem != "mod").then_some(stem)
            })
            .collect();
        // Edges: a file to the sibling files it names as `crate::<module>::x`, `super::x` or in `{…}` groups.
        let mut edges: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
        for f in &files {
            let code = without_tests(&std::fs::read_to_string(dir.join(format!("{f}.rs"))).unwrap());
            let mut targets = BTreeSet::new();
            for prefix in [format!("crate::{module}::"), "super::".to_string()] {
                let mut rest = code.as_str();
                while let Some(i) = rest.find(&prefix) {
                    rest = &rest[i + prefix.len()..];
                    let names = crate_refs(&format!("crate::{}", &rest[..rest.len().min(400)]));
                    if rest.starts_with('{') {
                        targets.extend(names);
                    } else {
                        targets.extend(names.into_iter().take(1));
                    }
                }
            }
            targets.retain(|t| t != f && files.contains(t));
            edges.insert(f.clone(), targets);
        }
        // Depth-first search for a cycle.
        fn visit(
            n: &str,
            edges: &std::collections::BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(i) = path.iter().position(|p| p == n) {
                return Some(path[i..].to_vec());
            }
            if done.contains(n) {
                return None;
            }
            path.push(n.to_string());
            for m in edges.get(n).into_iter().flatten() {
                if let Some(c) = visit(m, edges, path, done) {
                    return Some(c);
                }
            }
            path.pop();
            done.insert(n.to_string());
            None
        }
        let mut done = BTreeSet::new();
        for f in &files {
            if let Some(cycle) = visit(f, &edges, &mut Vec::new(), &mut done) {
                cycles.push(format!("{module}: {}", cycle.join(" -> ")));
                break;
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles between files:\n{}", cycles.join("\n"));
}
