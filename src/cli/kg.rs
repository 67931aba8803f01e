//! `clinstream kg materialize`: applies knowledge-graph deltas in order (`kg::Graph`) and writes the graph.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use super::produce;
use crate::config::Settings;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Apply knowledge-graph deltas in order and write the resulting graph (graph.json, graph.graphml).
    Materialize {
        /// kg.ndjson written by `clinstream run` in file mode.
        #[arg(long, required_unless_present = "topic", conflicts_with = "topic")]
        input: Option<PathBuf>,
        /// A Kafka topic of Avro deltas (`clinstream.kg.v1`), read from the beginning to its current end with the
        /// `kafka.*` connection settings.
        #[arg(long)]
        topic: Option<String>,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long, short)]
        out: PathBuf,
    },
}

pub fn exec(command: Command) -> anyhow::Result<ExitCode> {
    let Command::Materialize { input, topic, config, out } = command;
    let deltas: Vec<crate::model::KgDelta> =
        match (input, topic) {
            (Some(input), _) => {
                let text = std::fs::read_to_string(&input).with_context(|| format!("reading {}", input.display()))?;
                let mut deltas = Vec::new();
                for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                    deltas.push(serde_json::from_str(line).with_context(|| {
                        format!("{}: line {} is not a knowledge-graph delta", input.display(), i + 1)
                    })?);
                }
                deltas
            }
            (None, Some(topic)) => {
                let settings = Settings::load(config.as_deref()).context("loading configuration")?;
                produce::read_kg_topic(&settings, &topic)?
            }
            (None, None) => anyhow::bail!("give --input FILE or --topic T"),
        };
    let mut graph = crate::kg::Graph::default();
    let (mut applied, mut ignored) = (0, 0);
    for delta in &deltas {
        if graph.apply(delta) { applied += 1 } else { ignored += 1 }
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(out.join("graph.json"), serde_json::to_string_pretty(&graph.to_json())?)?;
    std::fs::write(out.join("graph.graphml"), graph.to_graphml())?;
    println!(
        "applied {applied} deltas ({ignored} ignored as stale or replaced): {} nodes, {} edges -> {}",
        graph.node_count(),
        graph.edge_count(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}
