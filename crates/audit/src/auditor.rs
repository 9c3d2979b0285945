//! The one writer of audit records.
//!
//! Every record (a call, an egress attempt, a credential event, a session's
//! end, a refusal) is written through an [`Auditor`]: the log and the
//! `--audit-fail-open` setting in one place, so that what a record that
//! cannot be written does is decided once, by the kind of record:
//!
//! - a record written *before* what it records takes effect (a call's
//!   result, a credential's mint): [`Auditor::record`]. Fail-closed (the
//!   default), `Err`: the caller fails what the record is about (a call
//!   withholds its output with status 22, a mint is revoked and its session
//!   refused). Fail-open: a warning on stderr, and the record is counted.
//! - a record of something already done (an egress connection that has
//!   closed, a session that has ended, a token re-minted or revoked, a
//!   request already refused): [`Auditor::record_after`]. Nothing is left
//!   to fail, so a record that cannot be written is never dropped silently:
//!   it is said on stderr, counted (one line in the unwritten file that
//!   `cordon doctor` reads) and given to the next call as a warning
//!   ([`Auditor::take_warnings`]).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::{AuditError, AuditLog, AuditRecord, Status};

/// The one writer of audit records (see the module's documentation).
#[derive(Debug)]
pub struct Auditor {
    log: AuditLog,
    fail_open: bool,
    /// One line per record that could not be written (`None`: counted in
    /// this process only).
    unwritten: Option<PathBuf>,
    /// Records that could not be written in this process.
    count: AtomicU64,
    /// Warnings for the next call.
    pending: Mutex<Vec<String>>,
    /// Shown every record as it is written (metrics).
    observers: std::sync::RwLock<Vec<std::sync::Arc<dyn RecordObserver>>>,
}

/// Sees every record the [`Auditor`] writes, whether or not it could be
/// written (what it records happened either way): the metrics of `cordon
/// serve` count the same events the log records.
pub trait RecordObserver: Send + Sync + std::fmt::Debug {
    fn recorded(&self, rec: &AuditRecord);

    /// [`RecordObserver::recorded`], told how long writing the record took
    /// (it has just been written, or failed to be).
    fn recorded_in(&self, rec: &AuditRecord, _write: std::time::Duration) {
        self.recorded(rec)
    }
}

/// One record that could not be written, as counted in the unwritten file:
/// what it was about, never its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnwrittenRecord {
    /// When it was to be written (RFC 3339, UTC).
    pub time: String,
    /// What it recorded (`call`, `egress`, `credential remint`, `session end`, `refusal`).
    pub what: String,
    pub tool: String,
    pub session: String,
    /// Why it could not be written.
    pub error: String,
}

/// What the unwritten file holds: how many records could not be written,
/// the first and the last.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Unwritten {
    pub count: u64,
    pub first: Option<UnwrittenRecord>,
    pub last: Option<UnwrittenRecord>,
}

impl Auditor {
    /// The writer of `log`. `fail_open`: a record written before what it
    /// records takes effect does not fail it when it cannot be written.
    pub fn new(log: AuditLog, fail_open: bool) -> Auditor {
        Auditor {
            log,
            fail_open,
            unwritten: None,
            count: AtomicU64::new(0),
            pending: Mutex::new(Vec::new()),
            observers: std::sync::RwLock::new(Vec::new()),
        }
    }

    /// Show every record written from now on to `o`.
    pub fn observe(&self, o: std::sync::Arc<dyn RecordObserver>) {
        if let Ok(mut v) = self.observers.write() {
            v.push(o);
        }
    }

    /// Show the records to no one from now on.
    pub fn stop_observing(&self) {
        if let Ok(mut v) = self.observers.write() {
            v.clear();
        }
    }

    /// Write `rec` and show it to the observers (whether or not it could be
    /// written: what it records happened either way).
    fn write(&self, rec: &AuditRecord) -> Result<(), AuditError> {
        let t = std::time::Instant::now();
        let written = self.log.record(rec);
        let took = t.elapsed();
        if let Ok(v) = self.observers.read() {
            for o in v.iter() {
                o.recorded_in(rec, took);
            }
        }
        written
    }

    /// Count each record that could not be written in `path` (one JSON
    /// line each; see [`read_unwritten`]).
    pub fn with_unwritten_file(mut self, path: PathBuf) -> Auditor {
        self.unwritten = Some(path);
        self
    }

    /// Whether a record that cannot be written lets what it records go on.
    pub fn fail_open(&self) -> bool {
        self.fail_open
    }

    /// Where records that could not be written are counted.
    pub fn unwritten_file(&self) -> Option<&Path> {
        self.unwritten.as_deref()
    }

    /// Records that could not be written by this writer.
    pub fn unwritten_count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Write a record made before what it records takes effect. `Err`: it
    /// could not be written and the log is fail-closed; the caller must
    /// fail what it records. Fail-open, a record not written is said on
    /// stderr, counted, and `Ok`.
    pub fn record(&self, rec: &AuditRecord) -> Result<(), AuditError> {
        match self.write(rec) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.count_unwritten(rec, false, &e);
                if self.fail_open {
                    eprintln!("cordon: warning: audit record not written: {e}");
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Write the record of something already done. One that cannot be
    /// written is said on stderr, counted, and kept as a warning for the
    /// next call; the error is returned for the caller's own log.
    pub fn record_after(&self, rec: &AuditRecord) -> Result<(), AuditError> {
        let Err(e) = self.write(rec) else {
            return Ok(());
        };
        let counted = self.count_unwritten(rec, true, &e);
        let warning = format!(
            "the audit record of {} ({}, session {}) could not be written: {e}; {counted}",
            what(rec, true),
            if rec.tool.is_empty() { "-" } else { &rec.tool },
            if rec.session.is_empty() {
                "-"
            } else {
                &rec.session
            },
        );
        eprintln!("cordon: warning: {warning}");
        if let Ok(mut p) = self.pending.lock() {
            // Bounded: a log that stays unwritable says so once per record
            // on stderr and in the count, not in an ever longer warning list.
            if p.len() < 16 {
                p.push(warning);
            }
        }
        Err(e)
    }

    /// The warnings of records not written since the last call (each is
    /// given once).
    pub fn take_warnings(&self) -> Vec<String> {
        self.pending
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }

    /// Count `rec` as not written; says where it was counted.
    fn count_unwritten(&self, rec: &AuditRecord, after: bool, e: &AuditError) -> String {
        self.count.fetch_add(1, Ordering::Relaxed);
        let Some(path) = &self.unwritten else {
            return "counted in this process only".into();
        };
        let line = UnwrittenRecord {
            time: rfc3339_now(),
            what: what(rec, after),
            tool: rec.tool.clone(),
            session: rec.session.clone(),
            error: e.to_string(),
        };
        match append_line(path, &line) {
            Ok(()) => format!("counted in {} (see `cordon doctor`)", path.display()),
            Err(ce) => format!(
                "counted in this process only ({} cannot be written: {ce})",
                path.display()
            ),
        }
    }
}

/// What a record is about, for the count and the warning: before the
/// fact, a call or a credential's mint; after it, an egress connection, a
/// session's end, a credential event or a refusal.
fn what(rec: &AuditRecord, after: bool) -> String {
    if let Some(c) = &rec.credential {
        return format!("credential {}", c.event);
    }
    if !after {
        return "call".into();
    }
    if rec.status == Status::SessionEnded {
        "session end".into()
    } else if !rec.egress.is_empty() {
        "egress".into()
    } else if rec.status == Status::Denied {
        "refusal".into()
    } else {
        "record".into()
    }
}

fn rfc3339_now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn append_line(path: &Path, line: &UnwrittenRecord) -> std::io::Result<()> {
    let mut text = serde_json::to_string(line).map_err(std::io::Error::other)?;
    text.push('\n');
    let open = || {
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
    };
    let mut f = match open() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(d)?;
            }
            open()?
        }
        other => other?,
    };
    f.write_all(text.as_bytes())
}

/// How many records could not be written, as counted in `path` (none when
/// it does not exist).
pub fn read_unwritten(path: &Path) -> std::io::Result<Unwritten> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Unwritten::default()),
        Err(e) => return Err(e),
    };
    let mut u = Unwritten::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        u.count += 1;
        // A line cut short (a full disk) still counts.
        let r = serde_json::from_str::<UnwrittenRecord>(line).ok();
        if u.first.is_none() {
            u.first = r.clone();
        }
        if r.is_some() {
            u.last = r;
        }
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FileSink, Rotation};

    /// A log whose only sink cannot write: /dev/full.
    fn full() -> AuditLog {
        AuditLog::new().with_sink(FileSink::open("/dev/full", Rotation::default()).unwrap())
    }

    #[test]
    fn a_record_before_the_fact_fails_closed_and_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let counted = dir.path().join("state/unwritten.jsonl");
        // Positive control: a writable log.
        let ok = Auditor::new(
            AuditLog::new().with_sink(
                FileSink::open(dir.path().join("a.jsonl"), Rotation::default()).unwrap(),
            ),
            false,
        )
        .with_unwritten_file(counted.clone());
        ok.record(&AuditRecord::new("t", "P1")).unwrap();
        assert_eq!(ok.unwritten_count(), 0);
        assert_eq!(read_unwritten(&counted).unwrap().count, 0);

        let closed = Auditor::new(full(), false).with_unwritten_file(counted.clone());
        let e = closed.record(&AuditRecord::new("t", "P1")).unwrap_err();
        assert!(e.to_string().contains("/dev/full"), "{e}");
        let open = Auditor::new(full(), true).with_unwritten_file(counted.clone());
        open.record(&AuditRecord::new("t", "P1")).unwrap();
        let u = read_unwritten(&counted).unwrap();
        assert_eq!(u.count, 2);
        assert_eq!(u.last.unwrap().what, "call");
        // Before the fact, the caller fails the call: no warning for the next.
        assert!(closed.take_warnings().is_empty());
    }

    #[test]
    fn a_record_after_the_fact_is_counted_and_warned_once() {
        let dir = tempfile::tempdir().unwrap();
        let counted = dir.path().join("unwritten.jsonl");
        let a = Auditor::new(full(), false).with_unwritten_file(counted.clone());
        let mut rec = AuditRecord::new("(session)", "");
        rec.session = "s1".into();
        rec.status = Status::SessionEnded;
        assert!(a.record_after(&rec).is_err());
        let w = a.take_warnings();
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("session end ((session), session s1) could not be written"),
            "{w:?}"
        );
        assert!(w[0].contains("see `cordon doctor`"), "{w:?}");
        assert!(a.take_warnings().is_empty());
        let u = read_unwritten(&counted).unwrap();
        assert_eq!(u.count, 1);
        assert_eq!(u.first.as_ref().unwrap().session, "s1");
        assert_eq!(a.unwritten_count(), 1);
    }

    #[test]
    fn a_count_that_cannot_be_kept_in_a_file_is_kept_in_the_process() {
        let dir = tempfile::tempdir().unwrap();
        // The count's directory is a file.
        std::fs::write(dir.path().join("f"), b"").unwrap();
        let a = Auditor::new(full(), false).with_unwritten_file(dir.path().join("f/unwritten"));
        assert!(a.record_after(&AuditRecord::new("t", "P1")).is_err());
        assert_eq!(a.unwritten_count(), 1);
        let w = a.take_warnings();
        assert!(w[0].contains("counted in this process only"), "{w:?}");
    }
}
