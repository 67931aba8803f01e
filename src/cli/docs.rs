//! `clinstream errors` and `clinstream openapi`: operator-facing tables generated from the code, so documentation cannot drift (a test compares them with
//! the files in docs/).

use std::process::ExitCode;

use crate::error::ErrorCode;

/// `clinstream errors`: the error codes with their dispositions.
#[derive(clap::Args)]
pub struct ErrorsArgs {
    /// Print as a Markdown table (docs/errors.md).
    #[arg(long)]
    markdown: bool,
}

pub fn errors(args: ErrorsArgs) -> ExitCode {
    print!("{}", errors_table(args.markdown));
    ExitCode::SUCCESS
}

/// `clinstream openapi`: the query service's OpenAPI document (docs/openapi.json), generated from the code.
pub fn openapi() -> anyhow::Result<ExitCode> {
    println!("{}", serde_json::to_string_pretty(&crate::serve::api::openapi())?);
    Ok(ExitCode::SUCCESS)
}

/// The error codes with disposition and meaning; Markdown for docs/errors.md, or plain text.
pub fn errors_table(markdown: bool) -> String {
    let mut out = String::new();
    if markdown {
        out.push_str("| code | disposition | meaning |\n|---|---|---|\n");
    }
    for code in ErrorCode::ALL {
        let disposition = match code.disposition() {
            crate::error::Disposition::DeadLetter => "dead_letter",
            crate::error::Disposition::Retry => "retry",
            crate::error::Disposition::Halt => "halt",
        };
        if markdown {
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                code.as_str(),
                disposition,
                code.description().replace('|', "\\|")
            ));
        } else {
            out.push_str(&format!("{:<26} {:<12} {}\n", code.as_str(), disposition, code.description()));
        }
    }
    out
}
