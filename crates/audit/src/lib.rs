//! cordon-audit: the broker's audit log.
//!
//! One JSON line per tool call ([`AuditRecord`]), written by the broker, never by the tool:
//! sizes and SHA-256 hashes of input and output (content only when the policy asks), how the
//! call ended, limits hit, what the output gate stripped or refused, every egress attempt,
//! an escaped and capped stderr excerpt, warnings.
//!
//! - [`Auditor`] is the one writer every record goes through: it holds the log and the
//!   fail-open setting, fails what a record is about when the record cannot be written, and
//!   counts (never drops) the records of what is already done.
//! - [`AuditLog`] writes each record to one or more [`Sink`]s ([`FileSink`] with size-based
//!   rotation, [`StderrSink`]) as one line in one write, after redacting declared secrets.
//! - [`query`] and [`tail`] read it back across rotated files; [`render_line`] is the
//!   one-line human form; [`parse_duration`] parses `--since` values.
//!
//! ```
//! use cordon_audit::{AuditLog, AuditRecord, FileSink, Filter, Rotation, Secret, query};
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("audit.jsonl");
//! let log = AuditLog::new()
//!     .with_sink(FileSink::open(&path, Rotation::default()).unwrap())
//!     .with_redactions(vec![Secret::new("JIRA_TOKEN", "tok-123456")]);
//! let mut rec = AuditRecord::new("jira_search", "P2");
//! rec.set_stderr(b"auth with tok-123456 failed");
//! log.record(&rec).unwrap();
//! let back: Vec<_> = query(&path, &Filter::default()).collect::<Result<_, _>>().unwrap();
//! assert_eq!(back[0].stderr.as_deref(), Some("auth with [REDACTED:JIRA_TOKEN] failed"));
//! ```
#![forbid(unsafe_code)]

mod auditor;
mod escape;
mod read;
mod record;
mod redact;
mod sink;

use std::path::PathBuf;

pub use auditor::{Auditor, RecordObserver, Unwritten, UnwrittenRecord, read_unwritten};
pub use escape::{escape_inline, escape_text};
pub use read::{Filter, Query, log_files, parse_duration, query, render_line, tail, tail_until};
pub use record::{
    AuditRecord, CONTENT_CAP, CredentialEvent, Decision, EgressEvent, GateSummary, Payload,
    PoolEvent, STDERR_CAP, ServiceEvent, Status, Timings, TraceContext,
};
pub use redact::Secret;
pub use sink::{FileSink, Rotation, Sink, StderrSink};

/// What went wrong writing or reading the log.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit: cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("audit: {} line {line} is not a valid record: {source}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("audit: cannot encode a record: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("audit: record not written to {failed} of {total} sink(s): {first}")]
    Sinks {
        failed: usize,
        total: usize,
        first: String,
    },
    #[error("audit: invalid duration {input:?}: {reason}")]
    Duration { input: String, reason: &'static str },
}

/// RFC 3339 in UTC for the record's `time`.
mod rfc3339_utc {
    use serde::{Deserialize, Deserializer, Serializer};
    use time::format_description::well_known::Rfc3339;
    use time::{OffsetDateTime, UtcOffset};

    pub fn serialize<S: Serializer>(t: &OffsetDateTime, s: S) -> Result<S::Ok, S::Error> {
        let text = t
            .to_offset(UtcOffset::UTC)
            .format(&Rfc3339)
            .map_err(serde::ser::Error::custom)?;
        s.serialize_str(&text)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<OffsetDateTime, D::Error> {
        let text = String::deserialize(d)?;
        OffsetDateTime::parse(&text, &Rfc3339).map_err(serde::de::Error::custom)
    }
}

/// The audit log: thread-safe (`Send + Sync`), shareable behind an `Arc`.
#[derive(Default)]
pub struct AuditLog {
    sinks: Vec<Box<dyn Sink>>,
    redactor: redact::Redactor,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sinks: Vec<String> = self.sinks.iter().map(|s| s.describe()).collect();
        f.debug_struct("AuditLog")
            .field("sinks", &sinks)
            .field("redacting", &!self.redactor.is_empty())
            .finish()
    }
}

impl AuditLog {
    /// A log with no sinks (add them with [`AuditLog::with_sink`]).
    pub fn new() -> Self {
        AuditLog::default()
    }

    pub fn with_sink(mut self, sink: impl Sink + 'static) -> Self {
        self.sinks.push(Box::new(sink));
        self
    }

    /// Redact the values of these secrets (and their base64, hex and percent-encoded forms)
    /// from every string of every record, replacing them with `[REDACTED:NAME]`.
    pub fn with_redactions(mut self, secrets: Vec<Secret>) -> Self {
        self.redactor = redact::Redactor::new(&secrets);
        self
    }

    /// The line that would be written for `record`: redacted JSON and a trailing `\n`.
    pub fn to_line(&self, record: &AuditRecord) -> Result<String, AuditError> {
        let mut line = if self.redactor.is_empty() {
            serde_json::to_string(record).map_err(AuditError::Encode)?
        } else {
            let mut v = serde_json::to_value(record).map_err(AuditError::Encode)?;
            self.redactor.redact_value(&mut v);
            serde_json::to_string(&v).map_err(AuditError::Encode)?
        };
        line.push('\n');
        Ok(line)
    }

    /// Write `record` to every sink. All sinks are tried; the error reports how many failed.
    pub fn record(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let line = self.to_line(record)?;
        let mut failed = 0;
        let mut first = None;
        for s in &self.sinks {
            if let Err(e) = s.write_line(line.as_bytes()) {
                failed += 1;
                first.get_or_insert_with(|| format!("{}: {e}", s.describe()));
            }
        }
        match first {
            None => Ok(()),
            Some(first) => Err(AuditError::Sinks {
                failed,
                total: self.sinks.len(),
                first,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn log_is_send_and_sync() {
        assert_send_sync::<AuditLog>();
    }

    #[test]
    fn time_is_rfc3339_utc() {
        let mut r = AuditRecord::new("t", "P1");
        r.time = time::macros::datetime!(2026-11-29 21:30:47.5 +01:00);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["time"], "2026-11-29T20:30:47.5Z");
        let back: AuditRecord = serde_json::from_value(v).unwrap();
        assert_eq!(back.time, r.time);
    }

    /// A record without `timings` (written before phases were measured)
    /// parses; one with some phases keeps exactly those.
    #[test]
    fn timings_are_optional_and_round_trip() {
        let r = AuditRecord::new("t", "P1");
        let mut v = serde_json::to_value(&r).unwrap();
        assert!(v.get("timings").is_none(), "{v}");
        let back: AuditRecord = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back.timings, None);
        v["timings"] = serde_json::json!({"admission_us": 7, "gate_us": 3});
        let back: AuditRecord = serde_json::from_value(v).unwrap();
        let t = back.timings.unwrap();
        assert_eq!(
            t.phases().collect::<Vec<_>>(),
            [("admission", 7), ("gate", 3)]
        );
        assert_eq!(
            serde_json::to_value(t).unwrap(),
            serde_json::json!({"admission_us": 7, "gate_us": 3})
        );
    }
}
