//! Compiles the built-in lexicon's phrase trie (data/lexicon/terms.tsv, 92k terms) once, at build time, into
//! `$OUT_DIR/lexicon-terms.trie`; `Lexicon::builtin()` loads it at start instead of building it. The compiled form
//! is described in src/lexicon/compile.rs.

#[path = "src/lexicon/compile.rs"]
#[allow(dead_code)]
mod compile;

fn main() {
    println!("cargo:rerun-if-changed=data/lexicon/terms.tsv");
    println!("cargo:rerun-if-changed=src/lexicon/compile.rs");
    let tsv = std::fs::read_to_string("data/lexicon/terms.tsv").expect("data/lexicon/terms.tsv");
    let terms: Vec<&str> = compile::tsv_terms(&tsv).collect();
    let compiled = compile::compile(&terms).expect("compiling the lexicon's trie");
    let out = std::path::Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("lexicon-terms.trie");
    std::fs::write(&out, compiled.to_bytes()).expect("writing the lexicon's trie");
}
