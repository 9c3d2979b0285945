//! A small QMP client: QEMU's JSON machine protocol over a unix socket,
//! one command at a time, events kept aside.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum QmpError {
    #[error("qmp: {0}")]
    Io(#[from] std::io::Error),
    #[error("qmp: bad reply {0}")]
    Protocol(String),
    #[error("qmp: {command} failed: {desc}")]
    Command { command: String, desc: String },
    #[error("qmp: no answer in {0:?}")]
    Timeout(Duration),
}

pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// Events read while waiting for a command's answer.
    pub events: Vec<Value>,
    timeout: Duration,
}

impl Qmp {
    /// Reads QEMU's greeting and enters command mode.
    pub fn handshake(stream: UnixStream, timeout: Duration) -> Result<Qmp, QmpError> {
        let writer = stream.try_clone()?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream),
            writer,
            events: Vec::new(),
            timeout,
        };
        let greeting = qmp.read_message(Instant::now() + timeout)?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(greeting.to_string()));
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    fn read_message(&mut self, deadline: Instant) -> Result<Value, QmpError> {
        let mut line = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(QmpError::Timeout(self.timeout));
            }
            self.reader.get_ref().set_read_timeout(Some(left))?;
            match self.reader.read_until(b'\n', &mut line) {
                Ok(0) => return Err(QmpError::Io(ErrorKind::UnexpectedEof.into())),
                Ok(_) if line.ends_with(b"\n") => break,
                Ok(_) => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
        serde_json::from_slice(&line)
            .map_err(|e| QmpError::Protocol(format!("{e}: {}", String::from_utf8_lossy(&line))))
    }

    /// Runs `command` and returns its `return` value.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        let mut text = msg.to_string();
        text.push('\n');
        self.writer.write_all(text.as_bytes())?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let reply = self.read_message(deadline)?;
            if reply.get("event").is_some() {
                self.events.push(reply);
                continue;
            }
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = reply.get("error") {
                return Err(QmpError::Command {
                    command: command.to_owned(),
                    desc: e
                        .get("desc")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown")
                        .to_owned(),
                });
            }
            return Err(QmpError::Protocol(reply.to_string()));
        }
    }

    /// Polls `query-migrate` until the migration is `completed` (or fails),
    /// up to `timeout`.
    pub fn wait_migration(&mut self, timeout: Duration) -> Result<(), QmpError> {
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.execute("query-migrate", None)?;
            match r.get("status").and_then(Value::as_str) {
                Some("completed") => return Ok(()),
                Some("failed") | Some("cancelled") => {
                    return Err(QmpError::Command {
                        command: "migrate".to_owned(),
                        desc: r
                            .get("error-desc")
                            .and_then(Value::as_str)
                            .unwrap_or("failed")
                            .to_owned(),
                    });
                }
                _ => {}
            }
            if Instant::now() > deadline {
                return Err(QmpError::Timeout(timeout));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// After `migrate-incoming`: polls `query-status` until the incoming
    /// state is loaded, resumes the guest (a snapshot taken of a stopped
    /// guest arrives paused), and returns once it runs, up to `timeout`.
    pub fn resume_incoming(&mut self, timeout: Duration) -> Result<(), QmpError> {
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.execute("query-status", None)?;
            if r.get("running").and_then(Value::as_bool) == Some(true) {
                return Ok(());
            }
            match r.get("status").and_then(Value::as_str) {
                Some("inmigrate") | Some("prelaunch") => {}
                Some("paused") => {
                    self.execute("cont", None)?;
                }
                _ => return Err(QmpError::Protocol(r.to_string())),
            }
            if Instant::now() > deadline {
                return Err(QmpError::Timeout(timeout));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
