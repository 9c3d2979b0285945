//! Reading the log back: `query`, `tail`, the one-line rendering and the duration parser the
//! CLI uses for `--since`.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use time::OffsetDateTime;

use crate::AuditError;
use crate::escape::escape_inline;
use crate::record::{AuditRecord, Decision};
use crate::sink::rotated_path;

/// Which records `query` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this tool.
    pub tool: Option<String>,
    /// Only records newer than now minus this.
    pub since: Option<Duration>,
    /// Only records where something was denied or refused ([`AuditRecord::is_denied`]).
    pub denied_only: bool,
    /// Only records of this principal (its subject).
    pub principal: Option<String>,
    /// Only records of this tenant.
    pub tenant: Option<String>,
}

impl Filter {
    fn cutoff(&self) -> Option<OffsetDateTime> {
        let since = self.since?;
        let since = time::Duration::try_from(since).unwrap_or(time::Duration::MAX);
        Some(
            OffsetDateTime::now_utc()
                .checked_sub(since)
                .unwrap_or(OffsetDateTime::UNIX_EPOCH),
        )
    }

    fn accepts(&self, r: &AuditRecord, cutoff: Option<OffsetDateTime>) -> bool {
        self.tool.as_ref().is_none_or(|t| *t == r.tool)
            && cutoff.is_none_or(|c| r.time >= c)
            && (!self.denied_only || r.is_denied())
            && self
                .principal
                .as_ref()
                .is_none_or(|p| r.principal.as_ref() == Some(p))
            && self
                .tenant
                .as_ref()
                .is_none_or(|t| r.tenant.as_ref() == Some(t))
    }
}

/// The log's files, oldest first: `path.N`, ..., `path.1`, `path`. Missing ones are skipped.
pub fn log_files(path: &Path) -> Vec<PathBuf> {
    let mut rotated: Vec<(u32, PathBuf)> = Vec::new();
    if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let prefix = format!("{}.", name.to_string_lossy());
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let fname = e.file_name();
                let fname = fname.to_string_lossy();
                if let Some(n) = fname
                    .strip_prefix(&prefix)
                    .and_then(|n| n.parse::<u32>().ok())
                {
                    rotated.push((n, rotated_path(path, n)));
                }
            }
        }
    }
    rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut files: Vec<PathBuf> = rotated.into_iter().map(|(_, p)| p).collect();
    if path.exists() {
        files.push(path.to_path_buf());
    }
    files
}

struct Open {
    path: PathBuf,
    reader: BufReader<File>,
    line: usize,
}

/// Iterator returned by [`query`].
pub struct Query {
    files: VecDeque<PathBuf>,
    current: Option<Open>,
    filter: Filter,
    cutoff: Option<OffsetDateTime>,
    buf: Vec<u8>,
}

impl Iterator for Query {
    type Item = Result<AuditRecord, AuditError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.current.is_none() {
                let path = self.files.pop_front()?;
                match File::open(&path) {
                    Ok(f) => {
                        self.current = Some(Open {
                            path,
                            reader: BufReader::new(f),
                            line: 0,
                        })
                    }
                    // Rotated away between listing and opening: its records moved to the next
                    // file name, which comes later in the list or was already read.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(source) => {
                        return Some(Err(AuditError::Io {
                            what: "open audit file",
                            path,
                            source,
                        }));
                    }
                }
            }
            let cur = self.current.as_mut()?;
            self.buf.clear();
            match cur.reader.read_until(b'\n', &mut self.buf) {
                Ok(0) => {
                    self.current = None;
                    continue;
                }
                Ok(_) => {
                    cur.line += 1;
                    let line = self.buf.strip_suffix(b"\n").unwrap_or(&self.buf);
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    match serde_json::from_slice::<AuditRecord>(line) {
                        Ok(r) if self.filter.accepts(&r, self.cutoff) => return Some(Ok(r)),
                        Ok(_) => continue,
                        Err(source) => {
                            return Some(Err(AuditError::Parse {
                                path: cur.path.clone(),
                                line: cur.line,
                                source,
                            }));
                        }
                    }
                }
                Err(source) => {
                    let path = cur.path.clone();
                    self.current = None;
                    return Some(Err(AuditError::Io {
                        what: "read audit file",
                        path,
                        source,
                    }));
                }
            }
        }
    }
}

/// Records matching `filter` across the rotated files, oldest first. A line that does not
/// parse yields an error naming the file and line, and iteration goes on.
pub fn query(path: impl AsRef<Path>, filter: &Filter) -> Query {
    Query {
        files: log_files(path.as_ref()).into(),
        current: None,
        filter: filter.clone(),
        cutoff: filter.cutoff(),
        buf: Vec::new(),
    }
}

/// The rendering of a line that is not a record: its size only, never its bytes.
fn render_raw(line: &[u8]) -> String {
    match serde_json::from_slice::<AuditRecord>(line) {
        Ok(r) => render_line(&r),
        Err(_) => format!("<unparseable audit line: {} bytes>", line.len()),
    }
}

/// Print the last `n` records (rendered with [`render_line`]) across the rotated files; with
/// `follow`, keep printing new ones as they are written (following rotation) until an I/O
/// error. See [`tail_until`] for a stoppable follow.
pub fn tail(
    path: impl AsRef<Path>,
    n: usize,
    follow: bool,
    out: &mut dyn Write,
) -> Result<(), AuditError> {
    let never = AtomicBool::new(false);
    tail_until(
        path,
        n,
        follow.then_some(&never),
        Duration::from_millis(250),
        out,
    )
}

/// [`tail`] whose follow loop ends when `stop` becomes true; `poll` is the interval between
/// checks for new lines.
pub fn tail_until(
    path: impl AsRef<Path>,
    n: usize,
    stop: Option<&AtomicBool>,
    poll: Duration,
    out: &mut dyn Write,
) -> Result<(), AuditError> {
    let path = path.as_ref();
    let out_err = |source| AuditError::Io {
        what: "write output",
        path: PathBuf::from("-"),
        source,
    };
    // Last n lines: newest file first, stop once we have enough.
    let mut last: VecDeque<Vec<u8>> = VecDeque::new();
    let mut pos = 0u64;
    let mut ino = None;
    for (i, file) in log_files(path).iter().rev().enumerate() {
        let mut f = match File::open(file) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(AuditError::Io {
                    what: "open audit file",
                    path: file.clone(),
                    source,
                });
            }
        };
        let mut data = Vec::new();
        f.read_to_end(&mut data).map_err(|source| AuditError::Io {
            what: "read audit file",
            path: file.clone(),
            source,
        })?;
        if i == 0 && file == path {
            ino = f.metadata().ok().map(|m| (m.dev(), m.ino()));
        }
        // Only complete lines count; a partial last line of the live file is read on follow.
        let complete = match data.iter().rposition(|&b| b == b'\n') {
            Some(p) => &data[..=p],
            None => &data[..0],
        };
        if i == 0 && file == path {
            pos = complete.len() as u64;
        }
        let mut lines: Vec<Vec<u8>> = complete
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        while let Some(l) = lines.pop() {
            if last.len() >= n {
                break;
            }
            last.push_front(l);
        }
        if last.len() >= n {
            break;
        }
    }
    for l in &last {
        writeln!(out, "{}", render_raw(l)).map_err(out_err)?;
    }
    out.flush().map_err(out_err)?;
    let Some(stop) = stop else {
        return Ok(());
    };

    // Follow the live file; reopen it from the start when it is rotated or truncated.
    let mut partial: Vec<u8> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let meta = std::fs::metadata(path);
        match meta {
            Ok(m) => {
                let id = (m.dev(), m.ino());
                if ino != Some(id) || m.len() < pos {
                    // A new file: read it from the start.
                    ino = Some(id);
                    pos = 0;
                    partial.clear();
                }
                if m.len() > pos {
                    let mut f = File::open(path).map_err(|source| AuditError::Io {
                        what: "open audit file",
                        path: path.to_path_buf(),
                        source,
                    })?;
                    f.seek(SeekFrom::Start(pos))
                        .map_err(|source| AuditError::Io {
                            what: "seek audit file",
                            path: path.to_path_buf(),
                            source,
                        })?;
                    let mut data = Vec::new();
                    f.read_to_end(&mut data).map_err(|source| AuditError::Io {
                        what: "read audit file",
                        path: path.to_path_buf(),
                        source,
                    })?;
                    pos += data.len() as u64;
                    partial.extend_from_slice(&data);
                    while let Some(nl) = partial.iter().position(|&b| b == b'\n') {
                        let line: Vec<u8> = partial.drain(..=nl).collect();
                        let line = &line[..line.len() - 1];
                        if !line.is_empty() {
                            writeln!(out, "{}", render_raw(line)).map_err(out_err)?;
                        }
                    }
                    out.flush().map_err(out_err)?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(AuditError::Io {
                    what: "stat audit file",
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
        std::thread::sleep(poll);
    }
    Ok(())
}

/// One human line per record. Every string the tool or a remote could influence is escaped
/// (`\n`, `\t`, `"`, controls, bidi and invisible characters), so printing the line to a
/// terminal never interprets anything.
pub fn render_line(r: &AuditRecord) -> String {
    use std::fmt::Write as _;
    let q = |s: &str| escape_inline(s);
    let time = r.time.to_offset(time::UtcOffset::UTC);
    let mut s = String::new();
    let _ = write!(
        s,
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z {} tool=\"{}\" profile=\"{}\"",
        time.year(),
        u8::from(time.month()),
        time.day(),
        time.hour(),
        time.minute(),
        time.second(),
        r.status.as_str(),
        q(&r.tool),
        q(&r.profile)
    );
    let none = String::new();
    for (k, v) in [
        ("runtime", &r.runtime),
        ("session", &r.session),
        ("caller", &r.caller),
        ("principal", r.principal.as_ref().unwrap_or(&none)),
        ("tenant", r.tenant.as_ref().unwrap_or(&none)),
    ] {
        if !v.is_empty() {
            let _ = write!(s, " {k}=\"{}\"", q(v));
        }
    }
    if let Some(c) = r.exit_code {
        let _ = write!(s, " exit={c}");
    }
    if let Some(sig) = r.signal {
        let _ = write!(s, " signal={sig}");
    }
    let _ = write!(
        s,
        " {}ms in={}B out={}B",
        r.duration_ms, r.input.bytes, r.output.bytes
    );
    if !r.limits_hit.is_empty() {
        let limits: Vec<String> = r.limits_hit.iter().map(|l| q(l)).collect();
        let _ = write!(s, " limits=\"{}\"", limits.join(","));
    }
    if let Some(g) = &r.gate {
        if let Some(code) = &g.refused {
            let _ = write!(s, " gate=refused:{}", q(code));
        } else {
            let stripped: Vec<String> = g
                .stripped
                .iter()
                .map(|(k, n)| format!("{}={n}", q(k)))
                .collect();
            if !stripped.is_empty() {
                let _ = write!(s, " stripped={}", stripped.join(","));
            }
            if g.truncated {
                let _ = write!(s, " truncated");
            }
        }
    }
    for e in &r.egress {
        let d = match e.decision {
            Decision::Allow => "allow",
            Decision::Deny => "deny",
        };
        let _ = write!(s, " egress={d}:\"{}\":{}", q(&e.name), e.port);
        if !e.injected.is_empty() {
            let names: Vec<String> = e.injected.iter().map(|n| q(n)).collect();
            let _ = write!(s, " injected=\"{}\"", names.join(","));
        }
        if let Some(n) = &e.exfiltration {
            let _ = write!(s, " exfiltration=\"{}\"", q(n));
        }
        if !e.reflected.is_empty() {
            let names: Vec<String> = e.reflected.iter().map(|n| q(n)).collect();
            let _ = write!(s, " reflected=\"{}\"", names.join(","));
        }
    }
    if let Some(c) = &r.credential {
        let _ = write!(
            s,
            " credential={}:\"{}\" provider=\"{}\" scope=\"{}\" ttl={}s deliver={}",
            q(&c.event),
            q(&c.secret),
            q(&c.provider),
            q(&c.scope),
            c.ttl_seconds,
            q(&c.deliver)
        );
    }
    if let Some(reason) = &r.reason {
        let _ = write!(s, " reason=\"{}\"", q(reason));
    }
    if !r.warnings.is_empty() {
        let _ = write!(s, " warnings={}", r.warnings.len());
    }
    s
}

/// Parse `30s`, `10m`, `2h`, `1d`, or a sequence of them (`1h30m`).
pub fn parse_duration(input: &str) -> Result<Duration, AuditError> {
    let err = |reason: &'static str| AuditError::Duration {
        input: input.chars().take(64).collect(),
        reason,
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    let mut total: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(err("expected a number"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| err("number too large"))?;
        rest = &rest[digits..];
        let unit = match rest.bytes().next() {
            Some(b's') => 1,
            Some(b'm') => 60,
            Some(b'h') => 3600,
            Some(b'd') => 86_400,
            Some(_) => return Err(err("unknown unit (use s, m, h or d)")),
            None => return Err(err("missing unit (use s, m, h or d)")),
        };
        rest = &rest[1..];
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| err("too large"))?;
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        for (bad, why) in [
            ("", "empty"),
            ("10", "missing unit (use s, m, h or d)"),
            ("m", "expected a number"),
            ("10x", "unknown unit (use s, m, h or d)"),
            ("-5m", "expected a number"),
            ("99999999999999999999s", "number too large"),
            ("999999999999999999d", "too large"),
        ] {
            match parse_duration(bad) {
                Err(AuditError::Duration { reason, .. }) => assert_eq!(reason, why, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
