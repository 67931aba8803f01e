//! `clinstream-lab`: the tools that measure and tune clinstream — benchmarks (`bench`, run by `make bench`),
//! quality on labelled sets (`eval`, `make eval`) and the vocabulary build (`vocab`, `make vocab`). A second binary
//! of the same crate, over the library's public API; it is not shipped in the image, and the worker (`clinstream`)
//! carries none of it.

mod bench;
mod eval;
mod measure;
mod serve_bench;
mod vocab;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The same allocator as the worker, so the benchmarks measure what ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "clinstream-lab", version, about = "clinstream's benchmarks, evaluations and vocabulary tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks (see bench/run.sh and `make bench`).
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
    /// Measure extraction and retrieval quality on a labelled set.
    Eval {
        #[command(subcommand)]
        command: eval::EvalCommand,
    },
    /// Vocabulary tools.
    Vocab {
        #[command(subcommand)]
        command: vocab::VocabCommand,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Bench { command } => bench::exec(command),
        Command::Eval { command } => eval::exec(command),
        Command::Vocab { command } => vocab::exec(command),
    };
    clinstream::cli::exit(result)
}
