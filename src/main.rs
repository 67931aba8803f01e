//! The `clinstream` binary: parses the command line and dispatches (`cli`).

/// mimalloc: the text stages allocate many small vectors per note; CHANGELOG.md (2026-11-24) has the
/// measurement against glibc malloc.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    clinstream::cli::main()
}
