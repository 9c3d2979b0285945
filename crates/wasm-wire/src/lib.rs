//! The protocol between the broker and a warm Wasm worker (`cordon-wasm
//! serve`, `module: {worker: true}`), over the worker sandbox's one byte
//! stream (its stdin and stdout).
//!
//! - a **request** is one call's stdin: its length (u64, little-endian)
//!   and its bytes; the end of the stream ends the worker;
//! - a **reply** is how the call ended and what it wrote: eight u64
//!   (little-endian) — the end's tag (0 exit, 1 trap, 2 set-up failure),
//!   the exit code, the text's length, stdout's length, whether stdout
//!   went past its cap, stderr's length, stderr's total, the run's
//!   microseconds — then the text (a trap's kind, a newline and
//!   wasmtime's words; a set-up failure's reason), stdout and stderr,
//!   and a newline (the jail relays a sandbox's output a line at a time:
//!   a reply ends one).
//!
//! The worker runs inside the jail, where a module that broke out of
//! wasmtime would be: the broker reads its replies as untrusted, with
//! every length bounded ([`Bounds`]); a reply past them is an error, and
//! the broker then kills the worker.
#![forbid(unsafe_code)]

use std::io::{self, Read, Write};
use std::time::Duration;

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The module exited with this code (0 when `_start` returned).
    Exit(i32),
    /// The module trapped: the kind (as the runner names it) and
    /// wasmtime's words.
    Trap { kind: String, detail: String },
    /// Nothing of the module ran: why.
    Setup(String),
}

/// One call's reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub end: End,
    /// Stdout, at most its cap.
    pub stdout: Vec<u8>,
    /// The module wrote past the cap (it was stopped there).
    pub stdout_over: bool,
    /// Stderr, at most its cap.
    pub stderr: Vec<u8>,
    /// Every stderr byte written (kept or dropped).
    pub stderr_total: u64,
    /// From the fresh instance's creation to the call's end.
    pub run: Duration,
}

/// The most a reader takes of each part of a reply.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub stdout: u64,
    pub stderr: u64,
    pub text: u64,
}

/// The longest text a reply carries (a trap's words, a set-up failure).
pub const TEXT_MAX: u64 = 64 << 10;

/// The longest reply with stdout and stderr within these caps.
pub fn reply_max(stdout: u64, stderr: u64) -> u64 {
    64 + TEXT_MAX + stdout + stderr + 1
}

/// Write one request: `input`, the call's stdin.
pub fn write_request(w: &mut impl Write, input: &[u8]) -> io::Result<()> {
    w.write_all(&(input.len() as u64).to_le_bytes())?;
    w.write_all(input)?;
    w.flush()
}

/// Read one request (`None`: the stream ended between requests). `max`
/// bounds its length.
pub fn read_request(r: &mut impl Read, max: u64) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 8];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u64::from_le_bytes(len);
    if len > max {
        return Err(bad(format!("a request of {len} bytes, past {max}")));
    }
    read_n(r, len).map(Some)
}

/// Write one reply.
pub fn write_reply(w: &mut impl Write, reply: &Reply) -> io::Result<()> {
    let (tag, code, text) = match &reply.end {
        End::Exit(c) => (0u64, *c, String::new()),
        End::Trap { kind, detail } => (1, 0, format!("{kind}\n{detail}")),
        End::Setup(why) => (2, 0, why.clone()),
    };
    let mut text = text.into_bytes();
    text.truncate(TEXT_MAX as usize);
    let head = [
        tag,
        code as i64 as u64,
        text.len() as u64,
        reply.stdout.len() as u64,
        u64::from(reply.stdout_over),
        reply.stderr.len() as u64,
        reply.stderr_total,
        reply.run.as_micros().min(u64::MAX as u128) as u64,
    ];
    let mut out = Vec::with_capacity(64 + text.len() + reply.stdout.len() + reply.stderr.len());
    for h in head {
        out.extend_from_slice(&h.to_le_bytes());
    }
    out.extend_from_slice(&text);
    out.extend_from_slice(&reply.stdout);
    out.extend_from_slice(&reply.stderr);
    out.push(b'\n');
    w.write_all(&out)?;
    w.flush()
}

/// Read one reply, each part within `bounds`.
pub fn read_reply(r: &mut impl Read, bounds: Bounds) -> io::Result<Reply> {
    let mut head = [0u64; 8];
    for h in head.iter_mut() {
        let mut b = [0u8; 8];
        r.read_exact(&mut b)?;
        *h = u64::from_le_bytes(b);
    }
    let [
        tag,
        code,
        text_len,
        out_len,
        over,
        err_len,
        err_total,
        run_us,
    ] = head;
    for (what, len, max) in [
        ("text", text_len, bounds.text.min(TEXT_MAX)),
        ("stdout", out_len, bounds.stdout),
        ("stderr", err_len, bounds.stderr),
    ] {
        if len > max {
            return Err(bad(format!("a reply's {what} of {len} bytes, past {max}")));
        }
    }
    let text = String::from_utf8_lossy(&read_n(r, text_len)?).into_owned();
    let stdout = read_n(r, out_len)?;
    let stderr = read_n(r, err_len)?;
    if read_n(r, 1)? != b"\n" {
        return Err(bad("a reply that does not end with a newline".into()));
    }
    let end = match tag {
        0 => End::Exit(code as i64 as i32),
        1 => {
            let (kind, detail) = text.split_once('\n').unwrap_or((&text, ""));
            End::Trap {
                kind: kind.to_string(),
                detail: detail.to_string(),
            }
        }
        2 => End::Setup(text),
        t => return Err(bad(format!("a reply's end tag {t}"))),
    };
    Ok(Reply {
        end,
        stdout,
        stdout_over: over != 0,
        stderr,
        stderr_total: err_total.max(err_len),
        run: Duration::from_micros(run_us),
    })
}

fn read_n(r: &mut impl Read, n: u64) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    r.take(n).read_to_end(&mut v)?;
    if v.len() as u64 != n {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the stream ended inside a message",
        ));
    }
    Ok(v)
}

fn bad(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WIDE: Bounds = Bounds {
        stdout: 1 << 20,
        stderr: 1 << 20,
        text: TEXT_MAX,
    };

    #[test]
    fn requests_and_replies_read_back() {
        let mut buf = Vec::new();
        write_request(&mut buf, b"hello").unwrap();
        write_request(&mut buf, b"").unwrap();
        let mut r = &buf[..];
        assert_eq!(read_request(&mut r, 5).unwrap().unwrap(), b"hello");
        assert_eq!(read_request(&mut r, 5).unwrap().unwrap(), b"");
        assert_eq!(read_request(&mut r, 5).unwrap(), None);

        for end in [
            End::Exit(-3),
            End::Trap {
                kind: "time limit".into(),
                detail: "wasm trap: interrupt".into(),
            },
            End::Setup("no code".into()),
        ] {
            let reply = Reply {
                end,
                stdout: b"out".to_vec(),
                stdout_over: true,
                stderr: b"err".to_vec(),
                stderr_total: 10,
                run: Duration::from_micros(1234),
            };
            let mut buf = Vec::new();
            write_reply(&mut buf, &reply).unwrap();
            assert_eq!(read_reply(&mut &buf[..], WIDE).unwrap(), reply);
        }
    }

    #[test]
    fn lengths_past_the_bounds_are_refused() {
        let mut buf = Vec::new();
        write_request(&mut buf, &[0; 9]).unwrap();
        let e = read_request(&mut &buf[..], 8).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);

        let reply = Reply {
            end: End::Exit(0),
            stdout: vec![b'x'; 100],
            stdout_over: false,
            stderr: Vec::new(),
            stderr_total: 0,
            run: Duration::ZERO,
        };
        let mut buf = Vec::new();
        write_reply(&mut buf, &reply).unwrap();
        let tight = Bounds { stdout: 99, ..WIDE };
        let e = read_reply(&mut &buf[..], tight).unwrap_err();
        assert!(
            e.to_string().contains("stdout of 100 bytes, past 99"),
            "{e}"
        );
        // A stream cut inside a reply.
        let e = read_reply(&mut &buf[..buf.len() - 1], WIDE).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
