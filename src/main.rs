//! The `clinstream` binary: parses the command line and dispatches (`cli`).

fn main() -> std::process::ExitCode {
    clinstream::cli::main()
}
