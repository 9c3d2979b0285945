//! Where audit lines go. Every record is one line handed to a sink in one call, and each sink
//! writes it with one `write` under a lock, so concurrent writers never interleave.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::AuditError;

/// A destination for audit lines.
pub trait Sink: Send + Sync {
    /// Write one complete line (ending in `\n`) in one write.
    fn write_line(&self, line: &[u8]) -> io::Result<()>;
    /// What this sink is, for error messages.
    fn describe(&self) -> String;
}

/// Write all of `line` with as few `write` calls as the kernel allows (one, for a regular
/// file opened with `O_APPEND` or a pipe under `PIPE_BUF`).
fn write_once(w: &mut impl Write, line: &[u8]) -> io::Result<()> {
    w.write_all(line)?;
    w.flush()
}

/// Standard error.
#[derive(Debug, Default, Clone, Copy)]
pub struct StderrSink;

impl Sink for StderrSink {
    fn write_line(&self, line: &[u8]) -> io::Result<()> {
        write_once(&mut io::stderr().lock(), line)
    }
    fn describe(&self) -> String {
        "stderr".to_owned()
    }
}

/// Size-based rotation: when a write would take the file past `max_bytes`, `audit.jsonl`
/// becomes `audit.jsonl.1`, `.1` becomes `.2`, ..., and `.keep` is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    pub max_bytes: u64,
    /// Rotated files kept (at least 1).
    pub keep: u32,
}

impl Default for Rotation {
    fn default() -> Self {
        Rotation {
            max_bytes: 16 * 1024 * 1024,
            keep: 5,
        }
    }
}

struct FileState {
    file: File,
    size: u64,
}

/// An append-only JSON Lines file (mode 0600) with size-based rotation.
///
/// Rotation is coordinated within one process (one broker owns its audit file); several
/// processes appending to the same file never interleave lines (`O_APPEND`, one write per
/// line) but may each rotate.
pub struct FileSink {
    path: PathBuf,
    rotation: Rotation,
    state: Mutex<FileState>,
}

impl std::fmt::Debug for FileSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSink")
            .field("path", &self.path)
            .field("rotation", &self.rotation)
            .finish()
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// `path` with `.n` appended to its file name.
pub(crate) fn rotated_path(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

impl FileSink {
    /// Open (creating it and its directory if needed) `path` for appending.
    pub fn open(path: impl Into<PathBuf>, rotation: Rotation) -> Result<FileSink, AuditError> {
        let path = path.into();
        let io_err = |source| AuditError::Io {
            what: "open audit file",
            path: path.clone(),
            source,
        };
        // The directory is made only when the file cannot be opened for
        // want of it (every run but the first finds it).
        let file = match open_append(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(io_err)?;
                }
                open_append(&path)
            }
            other => other,
        }
        .map_err(io_err)?;
        let size = file.metadata().map_err(io_err)?.len();
        let rotation = Rotation {
            keep: rotation.keep.max(1),
            ..rotation
        };
        Ok(FileSink {
            path,
            rotation,
            state: Mutex::new(FileState { file, size }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn rotate(&self, state: &mut FileState) -> io::Result<()> {
        let keep = self.rotation.keep;
        match std::fs::remove_file(rotated_path(&self.path, keep)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        for n in (1..keep).rev() {
            match std::fs::rename(rotated_path(&self.path, n), rotated_path(&self.path, n + 1)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        std::fs::rename(&self.path, rotated_path(&self.path, 1))?;
        state.file = open_append(&self.path)?;
        state.size = 0;
        Ok(())
    }
}

impl Sink for FileSink {
    fn write_line(&self, line: &[u8]) -> io::Result<()> {
        // A poisoned lock only means another writer panicked mid-call; the file handle is
        // still valid, so keep logging.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Another process may have rotated or truncated the file under us: follow the path.
        let ours = state.file.metadata()?;
        let moved = match std::fs::metadata(&self.path) {
            Ok(on_disk) => on_disk.ino() != ours.ino() || on_disk.dev() != ours.dev(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => return Err(e),
        };
        if moved {
            state.file = open_append(&self.path)?;
            state.size = state.file.metadata()?.len();
        }
        if state.size > 0 && state.size + line.len() as u64 > self.rotation.max_bytes {
            self.rotate(&mut state)?;
        }
        write_once(&mut state.file, line)?;
        state.size += line.len() as u64;
        Ok(())
    }

    fn describe(&self) -> String {
        format!("audit file {}", self.path.display())
    }
}
