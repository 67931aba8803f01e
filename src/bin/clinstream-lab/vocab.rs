//! `clinstream-lab vocab …`: rebuilding the shipped vocabulary data (`make vocab`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use clinstream::cli::runtime;
use clinstream::config::Settings;

#[derive(Subcommand)]
pub enum VocabCommand {
    /// The variables' embedding expansion: for each CLEAR variable, the lexicon concepts of its kind nearest to its
    /// labels by the configured model (cosine ≥ --min, at most --max each), as TSV (data/variables/expansion.tsv).
    Expand {
        #[arg(long, default_value_t = 0.7)]
        min: f32,
        #[arg(long, default_value_t = 50)]
        max: usize,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
}

/// Runs one `vocab` command.
pub fn exec(command: VocabCommand) -> anyhow::Result<ExitCode> {
    match command {
        VocabCommand::Expand { min, max, config } => {
            let mut settings = Settings::load(config.as_deref()).context("loading configuration")?;
            settings.log.level = "warn".into();
            settings.clear.expansion_min_score = 0.0; // expand from the variables as defined
            clinstream::telemetry::init_logging(&settings.log)?;
            let pipeline = clinstream::stages::Pipeline::new(&settings)?;
            let rt = runtime(&settings)?;
            let lines = rt.block_on(async {
                let embedder = clinstream::embed::Embedder::start_async(&settings.embed).await?;
                let index = clinstream::query::labels::label_index(
                    &pipeline,
                    &embedder,
                    std::path::Path::new(&settings.serve.cache_dir),
                )
                .await?;
                let (lexicon, variables) = (pipeline.lexicon(), pipeline.variables());
                let mut out = format!(
                    "# clinstream-lab vocab expand --min {min} --max {max}: model {}, lexicon {}\n",
                    embedder.info().name,
                    lexicon.version()
                );
                for (v, c, score) in index.expansions(lexicon, variables, min, max) {
                    let concept = lexicon.concept(c);
                    out.push_str(&format!(
                        "{}\t{}\t{score:.4}\t{}\n",
                        variables[v].name(),
                        concept.id,
                        concept.preferred
                    ));
                }
                Ok::<_, anyhow::Error>(out)
            })?;
            print!("{lines}");
            Ok(ExitCode::SUCCESS)
        }
    }
}
