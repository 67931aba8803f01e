//! Where an event came from, and the record of an event that produced no document. Positions only, never content.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{DocError, ErrorCode, Stage};

/// A topic-partition of a source that acknowledges (Kafka).
pub type Partition = (Arc<str>, i32);

/// Where an event came from, for dead letters and logs. Holds positions, never content.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Origin {
    /// A line of an NDJSON file, or (for a `.json` file) line 1; `entry` is the Bundle entry index when the event
    /// was unpacked from a Bundle.
    File {
        path: Arc<PathBuf>,
        line: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        entry: Option<usize>,
    },
    Stdin {
        line: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        entry: Option<usize>,
    },
    /// A Kafka record; `entry` is the Bundle entry index when the record held a Bundle.
    Kafka {
        topic: Arc<str>,
        partition: i32,
        offset: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        entry: Option<usize>,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (place, line, entry) = match self {
            Origin::File { path, line, entry } => (path.display().to_string(), line, entry),
            Origin::Stdin { line, entry } => ("<stdin>".to_string(), line, entry),
            Origin::Kafka { topic, partition, offset, entry: None } => {
                return write!(f, "{topic}[{partition}]@{offset}");
            }
            Origin::Kafka { topic, partition, offset, entry: Some(e) } => {
                return write!(f, "{topic}[{partition}]@{offset} entry {e}");
            }
        };
        write!(f, "{place}:{line}")?;
        if let Some(e) = entry {
            write!(f, " entry {e}")?;
        }
        Ok(())
    }
}

/// An event that produced no document: why, and where it came from. Never holds note text.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub error: DocError,
    pub origin: Origin,
    pub doc_id: Option<String>,
}

impl DeadLetter {
    pub fn code(&self) -> ErrorCode {
        self.error.code
    }
    pub fn stage(&self) -> Stage {
        self.error.stage
    }
}
