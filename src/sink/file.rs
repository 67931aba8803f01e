//! The file sink: `DIR/notes.ndjson` (one record per document), `DIR/variables.ndjson` (one record per document
//! and CLEAR variable), `DIR/kg.ndjson` (one knowledge-graph delta per document) and `DIR/dead_letters.ndjson`
//! (one record per rejected event), all truncated at the start of a run. Records arrive in input order. Durable
//! once `flush` returns (buffers written and files synced).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::{DeadLetter, Handed, Outputs, SinkError};
use crate::ack::Acks;
use crate::codec::records::{DeadLetterRecord, NoteRecord, VariableRecord};
use crate::error::RunError;
use crate::model::{Document, Origin};
use crate::source::Record;
use crate::stages::Compiled;

pub const NOTES_FILE: &str = "notes.ndjson";
pub const DEAD_LETTERS_FILE: &str = "dead_letters.ndjson";
pub const VARIABLES_FILE: &str = "variables.ndjson";
pub const KG_FILE: &str = "kg.ndjson";

pub struct FileSink {
    dir: PathBuf,
    notes: BufWriter<File>,
    variables: BufWriter<File>,
    kg: BufWriter<File>,
    dead_letters: BufWriter<File>,
    include_text: bool,
    /// Resolves mention concepts to ids and preferred terms.
    compiled: Arc<Compiled>,
}

impl FileSink {
    pub fn create(dir: &Path, include_text: bool, compiled: Arc<Compiled>) -> Result<Self, SinkError> {
        let err = |what: &Path| {
            let what = what.display().to_string();
            move |source| SinkError { what, source }
        };
        std::fs::create_dir_all(dir).map_err(err(dir))?;
        let open = |name: &str| {
            let path = dir.join(name);
            File::create(&path).map(|f| BufWriter::with_capacity(256 * 1024, f)).map_err(err(&path))
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            notes: open(NOTES_FILE)?,
            variables: open(VARIABLES_FILE)?,
            kg: open(KG_FILE)?,
            dead_letters: open(DEAD_LETTERS_FILE)?,
            include_text,
            compiled,
        })
    }

    pub fn paths(&self) -> [PathBuf; 4] {
        [
            self.dir.join(NOTES_FILE),
            self.dir.join(VARIABLES_FILE),
            self.dir.join(KG_FILE),
            self.dir.join(DEAD_LETTERS_FILE),
        ]
    }

    fn write_line(out: &mut BufWriter<File>, what: &str, value: &impl serde::Serialize) -> Result<(), SinkError> {
        serde_json::to_writer(&mut *out, value)
            .map_err(std::io::Error::from)
            .and_then(|_| out.write_all(b"\n"))
            .map_err(|source| SinkError { what: what.to_string(), source })
    }
}

impl FileSink {
    pub fn document(&mut self, doc: &Document, origin: &Origin) -> Result<(), SinkError> {
        let lexicon = &self.compiled.lexicon;
        Self::write_line(&mut self.notes, NOTES_FILE, &NoteRecord::new(doc, origin, lexicon, self.include_text))?;
        for record in VariableRecord::all(doc, lexicon, self.include_text) {
            Self::write_line(&mut self.variables, VARIABLES_FILE, &record)?;
        }
        Self::write_line(&mut self.kg, KG_FILE, &doc.kg)
    }

    pub fn dead_letter(&mut self, letter: &DeadLetter) -> Result<(), SinkError> {
        Self::write_line(&mut self.dead_letters, DEAD_LETTERS_FILE, &DeadLetterRecord::new(letter))
    }

    /// Writes the buffers and syncs the files.
    pub fn flush(&mut self) -> Result<(), SinkError> {
        for (out, what) in [
            (&mut self.notes, NOTES_FILE),
            (&mut self.variables, VARIABLES_FILE),
            (&mut self.kg, KG_FILE),
            (&mut self.dead_letters, DEAD_LETTERS_FILE),
        ] {
            out.flush()
                .and_then(|_| match out.get_ref().sync_data() {
                    // EINVAL: a file that cannot be synced (a pipe, FIFO, /dev/null); what was written went.
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
                    other => other,
                })
                .map_err(|source| SinkError { what: what.to_string(), source })?;
        }
        Ok(())
    }
}

/// File mode's outputs side: nothing to commit, so a checkpoint is a flush.
impl<R: Record> Outputs<R> for FileSink {
    async fn document(&mut self, doc: &Document, record: &R) -> Result<Handed, RunError> {
        FileSink::document(self, doc, &record.origin())?;
        Ok(Handed::Written)
    }

    async fn dead_letter(&mut self, letter: &DeadLetter, _record: Option<&R>) -> Result<(), RunError> {
        Ok(FileSink::dead_letter(self, letter)?)
    }

    async fn checkpoint(&mut self, _acks: &mut Acks) -> Result<(), RunError> {
        Ok(self.flush()?)
    }
}
