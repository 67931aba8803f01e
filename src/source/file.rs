//! The file source: DocumentReference events from NDJSON, FHIR Bundles and Bulk-FHIR exports.
//!
//! Inputs are files, directories (read recursively, files in name order) or `-` for stdin:
//! * `*.ndjson`, `*.jsonl` and other non-`.json` files: one event per line (blank lines ignored);
//! * `*.json`: the whole file is one event;
//! * stdin: NDJSON, unless its first line is an incomplete JSON value (a pretty-printed document), in which case
//!   all of stdin is one event;
//! * any event that is a `Bundle` is unpacked: each `entry[].resource` that is a DocumentReference becomes an
//!   event (other resource types are counted as skipped);
//! * a directory holding `DocumentReference*.ndjson` is a Bulk-FHIR export: only those files are read, the other
//!   resource types' files are skipped.
//!
//! Reading runs on its own thread (blocking file I/O) and feeds a bounded channel; a full channel blocks the
//! reader, which is the backpressure. A line longer than `input.max_message_bytes` is not kept in memory: it is
//! reported as `Oversized` and dead-lettered.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::IgnoredAny;
use tokio::sync::mpsc;

use super::{Envelope, IntakeControl, Origin, SourceError, SourceEvent};

/// What one input argument names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Stdin,
    Path(PathBuf),
}

impl Input {
    pub fn parse(arg: &str) -> Input {
        if arg == "-" { Input::Stdin } else { Input::Path(PathBuf::from(arg)) }
    }
}

/// The files to read, decided before reading starts (so the progress bar knows the total).
#[derive(Debug, Default, Clone)]
pub struct Plan {
    pub files: Vec<PathBuf>,
    pub stdin: bool,
    pub skipped_files: Vec<PathBuf>,
    pub total_bytes: u64,
}

/// Resolves inputs to files. Fails when an input does not exist or a directory cannot be listed.
pub fn plan(inputs: &[Input]) -> Result<Plan, SourceError> {
    let mut plan = Plan::default();
    for input in inputs {
        match input {
            Input::Stdin => plan.stdin = true,
            Input::Path(p) => {
                let meta = std::fs::metadata(p).map_err(|e| io_err(p, e))?;
                if meta.is_dir() {
                    walk(p, &mut plan)?;
                } else {
                    plan.total_bytes += meta.len();
                    plan.files.push(p.clone());
                }
            }
        }
    }
    Ok(plan)
}

fn walk(dir: &Path, plan: &mut Plan) -> Result<(), SourceError> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io_err(dir, e))?
        .map(|e| e.map(|e| e.path()).map_err(|err| io_err(dir, err)))
        .collect::<Result<_, _>>()?;
    entries.sort();
    let name = |p: &Path| p.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
    let readable = |p: &Path| {
        let n = name(p).to_ascii_lowercase();
        !n.starts_with('.') && (n.ends_with(".ndjson") || n.ends_with(".jsonl") || n.ends_with(".json"))
    };
    let bulk_export = entries.iter().any(|p| p.is_file() && name(p).starts_with("DocumentReference") && readable(p));
    for path in entries {
        if path.is_dir() {
            walk(&path, plan)?;
        } else if readable(&path) {
            if bulk_export && !name(&path).starts_with("DocumentReference") {
                plan.skipped_files.push(path);
                continue;
            }
            plan.total_bytes += std::fs::metadata(&path).map_err(|e| io_err(&path, e))?.len();
            plan.files.push(path);
        }
    }
    Ok(())
}

fn io_err(path: &Path, source: std::io::Error) -> SourceError {
    SourceError { path: path.display().to_string(), source }
}

/// What the reader sends: events, progress, or a fatal read error (`Intake::Failed`).
pub type Item = SourceEvent;

/// Starts the reader thread. It stops when everything is read, or early when the receiver is dropped.
pub fn spawn(plan: Plan, max_message_bytes: usize, tx: mpsc::Sender<Item>) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("file-source".into())
        .spawn(move || {
            let mut reader = Reader { tx, max: max_message_bytes, consumed: 0, reported: 0 };
            if let Err(Stop) = reader.run(plan) {
                // The runner stopped listening (shutdown or a fatal error); nothing more to do.
            }
        })
        .expect("spawning the file-source thread")
}

/// The reader thread as the runner controls it: closing the channel stops it (a blocked send fails), and it is
/// waited for only when the run was not interrupted (an interrupted reader may be blocked reading stdin).
pub struct Reading {
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reading {
    pub fn new(thread: std::thread::JoinHandle<()>) -> Self {
        Reading { thread: Some(thread) }
    }
}

impl IntakeControl for Reading {
    fn request_stop(&mut self) {}

    fn answers_requests(&self) -> bool {
        false
    }

    fn take_thread(&mut self, interrupted: bool) -> Option<std::thread::JoinHandle<()>> {
        if interrupted { None } else { self.thread.take() }
    }
}

/// The receiver is gone: stop reading.
struct Stop;

struct Reader {
    tx: mpsc::Sender<Item>,
    max: usize,
    consumed: u64,
    reported: u64,
}

impl Reader {
    fn run(&mut self, plan: Plan) -> Result<(), Stop> {
        for path in plan.skipped_files {
            self.send(SourceEvent::SkippedFile(path))?;
        }
        for path in plan.files {
            let path = Arc::new(path);
            let file = match File::open(path.as_ref()) {
                Ok(f) => f,
                Err(e) => return self.send(SourceEvent::Failed(io_err(&path, e).into())),
            };
            let whole = path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("json"));
            let mut input = BufReader::with_capacity(256 * 1024, file);
            let origin = |line| Origin::File { path: path.clone(), line, entry: None };
            let result = if whole { self.whole(&mut input, origin(1)) } else { self.lines(&mut input, &origin) };
            if let Err(e) = result {
                return match e {
                    ReadError::Stop => Err(Stop),
                    ReadError::Io(e) => self.send(SourceEvent::Failed(io_err(&path, e).into())),
                };
            }
        }
        if plan.stdin {
            let stdin = std::io::stdin();
            let mut input = stdin.lock();
            let origin = |line| Origin::Stdin { line, entry: None };
            if let Err(e) = self.stdin(&mut input, &origin) {
                return match e {
                    ReadError::Stop => Err(Stop),
                    ReadError::Io(e) => self.send(SourceEvent::Failed(io_err(Path::new("<stdin>"), e).into())),
                };
            }
        }
        self.progress(true)
    }

    fn send(&self, item: Item) -> Result<(), Stop> {
        self.tx.blocking_send(item).map_err(|_| Stop)
    }

    fn progress(&mut self, force: bool) -> Result<(), Stop> {
        if force || self.consumed - self.reported >= 256 * 1024 {
            self.reported = self.consumed;
            self.send(SourceEvent::Progress(self.consumed))?;
        }
        Ok(())
    }

    /// One event per line.
    fn lines(&mut self, input: &mut impl BufRead, origin: &dyn Fn(u64) -> Origin) -> Result<(), ReadError> {
        let mut line_no = 0u64;
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let (n, oversized) = read_line_capped(input, &mut buf, self.max)?;
            if n == 0 {
                return Ok(());
            }
            line_no += 1;
            self.consumed += n as u64;
            if oversized {
                self.send(SourceEvent::Oversized { origin: origin(line_no), bytes: n as u64 })?;
            } else if !buf.iter().all(u8::is_ascii_whitespace) {
                let payload = std::mem::take(&mut buf);
                self.emit(payload, origin(line_no))?;
            }
            self.progress(false)?;
        }
    }

    /// The whole input is one event.
    fn whole(&mut self, input: &mut impl Read, origin: Origin) -> Result<(), ReadError> {
        let mut buf = Vec::new();
        let n = input.take(self.max as u64 + 1).read_to_end(&mut buf)?;
        if n > self.max {
            let rest = std::io::copy(input, &mut std::io::sink())?;
            self.consumed += n as u64 + rest;
            self.send(SourceEvent::Oversized { origin, bytes: n as u64 + rest })?;
        } else {
            self.consumed += n as u64;
            if !buf.iter().all(u8::is_ascii_whitespace) {
                self.emit(buf, origin)?;
            }
        }
        self.progress(false)?;
        Ok(())
    }

    /// NDJSON, or one pretty-printed document when the first line is an incomplete JSON value.
    fn stdin(&mut self, input: &mut impl BufRead, origin: &dyn Fn(u64) -> Origin) -> Result<(), ReadError> {
        let mut first = Vec::new();
        let mut skipped_lines = 0u64;
        loop {
            first.clear();
            let (n, oversized) = read_line_capped(input, &mut first, self.max)?;
            if n == 0 {
                return Ok(());
            }
            if oversized {
                self.consumed += n as u64;
                self.send(SourceEvent::Oversized { origin: origin(skipped_lines + 1), bytes: n as u64 })?;
                return self.lines_after(input, origin, skipped_lines + 1);
            }
            if !first.iter().all(u8::is_ascii_whitespace) {
                break;
            }
            skipped_lines += 1;
        }
        let incomplete = matches!(serde_json::from_slice::<IgnoredAny>(&first), Err(e) if e.is_eof());
        if incomplete {
            let mut rest = first;
            input.read_to_end(&mut rest)?;
            let len = rest.len();
            return self.whole(&mut std::io::Cursor::new(rest), origin(skipped_lines + 1)).map(|_| {
                debug_assert!(len > 0);
            });
        }
        self.consumed += first.len() as u64;
        self.emit(first, origin(skipped_lines + 1))?;
        self.lines_after(input, origin, skipped_lines + 1)
    }

    fn lines_after(
        &mut self,
        input: &mut impl BufRead,
        origin: &dyn Fn(u64) -> Origin,
        offset: u64,
    ) -> Result<(), ReadError> {
        self.lines(input, &|line| origin(line + offset))
    }

    /// Sends one payload, unpacking it when it is a Bundle.
    fn emit(&mut self, payload: Vec<u8>, origin: Origin) -> Result<(), Stop> {
        if let Some(resources) = super::bundle_entries(&payload) {
            for (entry, resource) in resources {
                let origin = with_entry(&origin, entry);
                match resource {
                    Some(bytes) => self.send(SourceEvent::Record(Envelope { payload: bytes, origin }))?,
                    None => self.send(SourceEvent::SkippedResource)?,
                }
            }
            return Ok(());
        }
        self.send(SourceEvent::Record(Envelope { payload, origin }))
    }
}

enum ReadError {
    Stop,
    Io(std::io::Error),
}

impl From<Stop> for ReadError {
    fn from(_: Stop) -> Self {
        ReadError::Stop
    }
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        ReadError::Io(e)
    }
}

fn with_entry(origin: &Origin, entry: usize) -> Origin {
    match origin {
        Origin::File { path, line, .. } => Origin::File { path: path.clone(), line: *line, entry: Some(entry) },
        Origin::Stdin { line, .. } => Origin::Stdin { line: *line, entry: Some(entry) },
        other => other.clone(),
    }
}

/// Reads one line (without its `\n`) into `buf`, keeping at most `max + 1` bytes. Returns the bytes consumed
/// (including the newline) and whether the line was longer than `max`.
fn read_line_capped(input: &mut impl BufRead, buf: &mut Vec<u8>, max: usize) -> std::io::Result<(usize, bool)> {
    let mut consumed = 0;
    let mut oversized = false;
    loop {
        let chunk = match input.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            break;
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(p) => (p + 1, true),
            None => (chunk.len(), false),
        };
        let content = &chunk[..if done { take - 1 } else { take }];
        if !oversized {
            if buf.len() + content.len() > max {
                oversized = true;
                buf.clear();
            } else {
                buf.extend_from_slice(content);
            }
        }
        input.consume(take);
        consumed += take;
        if done {
            break;
        }
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok((consumed, oversized))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_lines() {
        let mut input = std::io::Cursor::new(b"short\r\nthis line is too long\nok".to_vec());
        let mut buf = Vec::new();
        assert_eq!(read_line_capped(&mut input, &mut buf, 8).unwrap(), (7, false));
        assert_eq!(buf, b"short");
        buf.clear();
        assert_eq!(read_line_capped(&mut input, &mut buf, 8).unwrap(), (22, true));
        assert!(buf.is_empty());
        buf.clear();
        assert_eq!(read_line_capped(&mut input, &mut buf, 8).unwrap(), (2, false));
        assert_eq!(buf, b"ok");
    }

    #[test]
    fn bundles_are_unpacked_and_other_resources_skipped() {
        let bundle = br#"{"resourceType":"Bundle","entry":[{"resource":{"resourceType":"Patient","id":"p"}},{"resource":{"resourceType":"DocumentReference","id":"d"}},{"fullUrl":"x"}]}"#;
        let entries = crate::source::bundle_entries(bundle).unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0], (0, None));
        assert_eq!(entries[1].1.as_deref(), Some(&br#"{"resourceType":"DocumentReference","id":"d"}"#[..]));
        assert_eq!(entries[2], (2, None));
        assert!(crate::source::bundle_entries(br#"{"resourceType":"DocumentReference","id":"Bundle"}"#).is_none());
    }
}
