//! Tailing container logs on the node: the kubelet's `/var/log/containers/*.log` (symlinks into
//! `/var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log`), in the CRI log format
//! (`<time> <stream> <P|F> <content>`, `P` = a partial line continued by the next) or Docker's json-file
//! format (`{"log":"…\n","stream":…,"time":…}`).
//!
//! [`Tailer::poll`] reads what was appended to every matching file since the last poll:
//! - **rotation** (the kubelet renames `0.log` and starts a new file under the same name): the old file,
//!   still open, is read to its end, then the new one from its start;
//! - **truncation** (a file shorter than what was read): read again from its start;
//! - **positions** survive agent restarts in a small JSON state file (path → device, inode, offset of the
//!   first line not yet delivered whole); the tailer's user decides when to [`Tailer::save`] which
//!   positions (the ztunnel reader saves only what the controller acknowledged). A file the agent has no
//!   position for is read from its end when the agent starts (no replay of old history) and from its
//!   start when it appears later (a new pod, a rotation); a file whose saved position names another
//!   inode was rotated since that save, so it is read from its start too;
//! - an incomplete last line is kept until its newline arrives; it is never delivered twice.
//!
//! Polling (not inotify) keeps this portable and bounded; the poll interval is the latency.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Longest line kept (a longer one is cut at this size and reported as malformed by the parser).
pub const MAX_LINE: usize = 1 << 20;

/// Why a framed line could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Neither CRI nor Docker json-file framing.
    #[error("not a CRI or json-file log line")]
    Framing,
}

/// Reassembles one file's log lines from their container-runtime framing.
#[derive(Debug, Default)]
pub struct Assembler {
    partial: String,
    /// A partial (`P`, or json-file without a newline) part came and its line is not complete yet.
    open: bool,
}

#[derive(Deserialize)]
struct DockerLine {
    log: String,
}

impl Assembler {
    /// Takes one raw line of the file (without its newline); returns the application's line once complete.
    pub fn push(&mut self, raw: &str) -> Result<Option<String>, FrameError> {
        if raw.starts_with('{') {
            let line: DockerLine = serde_json::from_str(raw).map_err(|_| FrameError::Framing)?;
            self.append(line.log.trim_end_matches('\n'));
            self.open = !line.log.ends_with('\n');
            return Ok((!self.open).then(|| std::mem::take(&mut self.partial)));
        }
        // <time> <stream> <tag> <content>; the tag's first flag is P (partial) or F (full).
        let mut parts = raw.splitn(4, ' ');
        let (Some(time), Some(stream), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(FrameError::Framing);
        };
        if !time.contains('T') || !matches!(stream, "stdout" | "stderr") {
            return Err(FrameError::Framing);
        }
        let content = parts.next().unwrap_or_default();
        match tag.split(':').next() {
            Some("P") => {
                self.append(content);
                self.open = true;
                Ok(None)
            }
            Some("F") => {
                self.append(content);
                self.open = false;
                Ok(Some(std::mem::take(&mut self.partial)))
            }
            _ => Err(FrameError::Framing),
        }
    }

    /// Whether a line has begun and not ended: its raw lines must be read again to get it whole.
    pub fn in_line(&self) -> bool {
        self.open
    }

    fn append(&mut self, s: &str) {
        let room = MAX_LINE.saturating_sub(self.partial.len());
        let mut end = s.len().min(room);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.partial.push_str(&s[..end]);
    }
}

/// Whether `name` matches `pattern` (`*` any run of characters, `?` one character).
pub fn wildcard(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The files matching an absolute glob whose components may hold `*` and `?`, sorted.
pub fn glob(pattern: &str) -> Vec<PathBuf> {
    let mut found = vec![PathBuf::from("/")];
    for component in Path::new(pattern).components().skip(1) {
        let part = component.as_os_str().to_string_lossy();
        let mut next = Vec::new();
        for dir in &found {
            if part.contains(['*', '?']) {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    if wildcard(&part, &entry.file_name().to_string_lossy()) {
                        next.push(entry.path());
                    }
                }
            } else {
                let path = dir.join(&*part);
                if path.exists() {
                    next.push(path);
                }
            }
        }
        found = next;
    }
    found.retain(|p| p.is_file());
    found.sort();
    found
}

/// A file's identity: (device, inode) of what the path points to.
type FileId = (u64, u64);

/// A place in a file: where reading must resume so that a line is read (again) whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// Device of the file.
    pub dev: u64,
    /// Inode of the file.
    pub ino: u64,
    /// Byte offset of the line's first raw line.
    pub offset: u64,
}

struct Tracked {
    file: File,
    id: FileId,
    /// Where the next read starts.
    read_pos: u64,
    /// Where the first line not yet delivered whole begins (what a restart resumes from).
    line_start: u64,
    /// Bytes after the last newline.
    pending: Vec<u8>,
    assembler: Assembler,
}

impl Tracked {
    fn new(file: File, id: FileId, start: u64) -> Self {
        Self {
            file,
            id,
            read_pos: start,
            line_start: start,
            pending: Vec::new(),
            assembler: Assembler::default(),
        }
    }

    /// Where the first line not yet delivered whole begins.
    fn position(&self) -> Position {
        Position {
            dev: self.id.0,
            ino: self.id.1,
            offset: self.line_start,
        }
    }
}

/// What one raw line of a file gave.
pub type Framed = Result<String, FrameError>;

/// Receives each line: its file, where it begins, and the line (or why it could not be read).
pub type Deliver<'a> = dyn FnMut(&Path, Position, Framed) + 'a;

/// See the module docs.
pub struct Tailer {
    pattern: String,
    state_file: Option<PathBuf>,
    files: BTreeMap<PathBuf, Tracked>,
    /// Where each file being read was first read from (its start after a rotation).
    opened: BTreeMap<PathBuf, Position>,
    saved: BTreeMap<PathBuf, Position>,
    started: bool,
    /// Warned once that the state file cannot be written.
    state_warned: bool,
}

impl Tailer {
    /// A tailer of the files matching `pattern`, keeping positions in `state_file` (none: not kept).
    pub fn new(pattern: impl Into<String>, state_file: Option<PathBuf>) -> Self {
        let saved = state_file
            .as_deref()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|bytes| match serde_json::from_slice(&bytes) {
                Ok(saved) => Some(saved),
                Err(error) => {
                    tracing::warn!(%error, "unreadable tail positions; starting at the files' ends");
                    None
                }
            })
            .unwrap_or_default();
        Self {
            pattern: pattern.into(),
            state_file,
            files: BTreeMap::new(),
            opened: BTreeMap::new(),
            saved,
            started: false,
            state_warned: false,
        }
    }

    /// Files being read now.
    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// Where each file's first line not yet delivered whole begins: what to [`Tailer::save`] once
    /// everything delivered so far is safe.
    pub fn positions(&self) -> BTreeMap<PathBuf, Position> {
        self.files
            .iter()
            .map(|(path, t)| (path.clone(), t.position()))
            .collect()
    }

    fn open(&self, path: &Path, fresh: bool) -> io::Result<Tracked> {
        let mut file = File::open(path)?;
        let meta = file.metadata()?;
        let id = (meta.dev(), meta.ino());
        let start = match self.saved.get(path) {
            Some(p) if (p.dev, p.ino) == id && p.offset <= meta.len() => p.offset,
            Some(p) if (p.dev, p.ino) == id => 0, // truncated while the agent was away
            // Rotated since the last save: every line of this file came after what was saved.
            Some(_) => 0,
            _ if fresh => 0,
            _ => meta.len(),
        };
        file.seek(SeekFrom::Start(start))?;
        Ok(Tracked::new(file, id, start))
    }

    /// Reads everything appended since the last poll, calling `deliver(file, start, line)` per line, in
    /// order. I/O errors of single files are logged and the file is retried at the next poll. Saves
    /// nothing: see [`Tailer::save`].
    pub fn poll(&mut self, deliver: &mut Deliver<'_>) {
        let matches = glob(&self.pattern);
        // Files that appear after the start are new: read them whole.
        let fresh = self.started;
        let mut opened = false;
        for path in &matches {
            if !self.files.contains_key(path) {
                match self.open(path, fresh) {
                    Ok(t) => {
                        tracing::info!(file = %path.display(), from = t.read_pos, "tailing");
                        self.opened.insert(path.clone(), t.position());
                        self.files.insert(path.clone(), t);
                        opened = true;
                    }
                    Err(error) => {
                        tracing::debug!(file = %path.display(), %error, "cannot open log file yet")
                    }
                }
            }
        }
        self.started = true;
        if opened {
            // Where new files start reading is known before any of their lines is: saved now, so that
            // a restart before the first acknowledgement reads them from there, not from their end.
            let saved = self.saved.clone();
            self.save(&saved);
        }
        let mut gone = Vec::new();
        for (path, tracked) in &mut self.files {
            if let Err(error) = read_new(tracked, path, deliver) {
                tracing::warn!(file = %path.display(), %error, "reading log file");
            }
            match std::fs::metadata(path) {
                Ok(meta) if (meta.dev(), meta.ino()) != tracked.id => {
                    // Rotated: finish the old file (lines written between our read and the rename),
                    // then go on with the new one from its start.
                    let _ = read_new(tracked, path, deliver);
                    match File::open(path) {
                        Ok(file) => {
                            tracing::info!(file = %path.display(), "log file rotated");
                            *tracked = Tracked::new(file, (meta.dev(), meta.ino()), 0);
                            self.opened.insert(path.clone(), tracked.position());
                            if let Err(error) = read_new(tracked, path, deliver) {
                                tracing::warn!(file = %path.display(), %error, "reading log file");
                            }
                        }
                        Err(_) => gone.push(path.clone()),
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    if !matches.contains(path) {
                        gone.push(path.clone());
                    }
                }
            }
        }
        for path in gone {
            tracing::info!(file = %path.display(), "log file gone");
            self.files.remove(&path);
            self.opened.remove(&path);
        }
    }

    /// Writes `positions` (from [`Tailer::positions`]) to the state file, where the next agent resumes.
    /// A file being read that `positions` does not name (it appeared later) is saved where it was first
    /// read from, so that a restart reads it from there rather than from its end.
    pub fn save(&mut self, positions: &BTreeMap<PathBuf, Position>) {
        let Some(state) = &self.state_file else {
            return;
        };
        let mut positions = positions.clone();
        for (path, opened) in &self.opened {
            positions.entry(path.clone()).or_insert(*opened);
        }
        if positions == self.saved {
            return;
        }
        let write = || -> io::Result<()> {
            if let Some(dir) = state.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = state.with_extension("tmp");
            std::fs::write(
                &tmp,
                serde_json::to_vec(&positions).map_err(io::Error::other)?,
            )?;
            std::fs::rename(&tmp, state)
        };
        match write() {
            Ok(()) => self.saved = positions,
            Err(error) if !self.state_warned => {
                self.state_warned = true;
                tracing::warn!(file = %state.display(), %error,
                    "cannot save log positions; after a restart the agent starts at the files' ends");
            }
            Err(_) => {}
        }
    }
}

/// Reads what was appended to one file and delivers its complete lines.
fn read_new(t: &mut Tracked, path: &Path, deliver: &mut Deliver<'_>) -> io::Result<()> {
    let len = t.file.metadata()?.len();
    if len < t.read_pos {
        tracing::info!(file = %path.display(), "log file truncated; reading from its start");
        t.file.seek(SeekFrom::Start(0))?;
        t.read_pos = 0;
        t.line_start = 0;
        t.pending.clear();
        t.assembler = Assembler::default();
    }
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = t.file.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        // The file offset just after the raw line being split off.
        let mut end = t.read_pos;
        t.read_pos += n as u64;
        let mut chunk = &buf[..n];
        while let Some(i) = chunk.iter().position(|b| *b == b'\n') {
            t.pending.extend_from_slice(&chunk[..i]);
            chunk = &chunk[i + 1..];
            end += i as u64 + 1;
            let raw = std::mem::take(&mut t.pending);
            let raw = String::from_utf8_lossy(&raw);
            let at = t.position();
            let framed = t.assembler.push(&raw);
            if !t.assembler.in_line() {
                t.line_start = end;
            }
            match framed {
                Ok(Some(line)) => deliver(path, at, Ok(line)),
                Ok(None) => {}
                Err(e) => deliver(path, at, Err(e)),
            }
        }
        if t.pending.len() + chunk.len() <= MAX_LINE {
            t.pending.extend_from_slice(chunk);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_partial_lines_are_joined() {
        let mut a = Assembler::default();
        assert_eq!(a.push("2026-08-21T10:15:30.1Z stdout P {\"a\":"), Ok(None));
        assert_eq!(
            a.push("2026-08-21T10:15:30.2Z stdout F 1}"),
            Ok(Some("{\"a\":1}".into()))
        );
        assert_eq!(
            a.push("2026-08-21T10:15:30.2Z stderr F x y z"),
            Ok(Some("x y z".into()))
        );
        assert_eq!(a.push("garbage"), Err(FrameError::Framing));
        assert_eq!(
            a.push("2026-08-21T10:15:30.2Z stdout Q x"),
            Err(FrameError::Framing)
        );
    }

    #[test]
    fn docker_json_lines_are_unwrapped() {
        let mut a = Assembler::default();
        assert_eq!(a.push(r#"{"log":"part ","stream":"stdout"}"#), Ok(None));
        assert_eq!(
            a.push(r#"{"log":"two\n","stream":"stdout"}"#),
            Ok(Some("part two".into()))
        );
    }

    #[test]
    fn a_line_begun_but_not_ended_keeps_the_position_at_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("a.log");
        let state = dir.path().join("positions.json");
        let mut tailer = Tailer::new(
            format!("{}/*.log", dir.path().display()),
            Some(state.clone()),
        );
        let mut lines = Vec::new();
        tailer.poll(&mut |_, at, line| lines.push((at.offset, line)));
        let first = "2026-08-21T10:15:30.1Z stdout F one\n";
        let part = "2026-08-21T10:15:30.2Z stdout P tw\n";
        std::fs::write(&log, format!("{first}{part}")).unwrap();
        tailer.poll(&mut |_, at, line| lines.push((at.offset, line)));
        assert_eq!(lines, [(0, Ok("one".to_string()))]);
        // A restart must read the partial part again, or the line would come out cut.
        assert_eq!(tailer.positions()[&log].offset, first.len() as u64);
        let rest = "2026-08-21T10:15:30.3Z stdout F o\n";
        std::fs::write(&log, format!("{first}{part}{rest}")).unwrap();
        tailer.poll(&mut |_, at, line| lines.push((at.offset, line)));
        assert_eq!(lines[1], (first.len() as u64, Ok("two".to_string())));
        let end = (first.len() + part.len() + rest.len()) as u64;
        assert_eq!(tailer.positions()[&log].offset, end);
        // Nothing saved yet but where the file was first read from, which a restart resumes at.
        let saved: BTreeMap<PathBuf, Position> =
            serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
        assert_eq!(saved[&log].offset, 0);
        tailer.save(&tailer.positions());
        let saved: BTreeMap<PathBuf, Position> =
            serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
        assert_eq!(saved[&log].offset, end);
    }

    #[test]
    fn wildcards_match_like_a_shell() {
        assert!(wildcard(
            "*ztunnel*",
            "ztunnel-abc_istio-system_istio-proxy-1.log"
        ));
        assert!(wildcard("*ztunnel*.log", "x-ztunnel-y.log"));
        assert!(!wildcard("*ztunnel*.log", "x-ztunnel-y.log.1"));
        assert!(wildcard("?.log", "0.log"));
        assert!(!wildcard("?.log", "10.log"));
    }
}
