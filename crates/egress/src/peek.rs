//! What a connection on a transparent door says it is for, read without consuming a byte: the
//! server name (SNI) of a TLS ClientHello, or the `Host` header of an HTTP/1 request.

use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// Most bytes looked at: a TLS record (16 KiB) and its header, or an HTTP request head.
const PEEK_MAX: usize = 16 * 1024 + 5;

/// What the first bytes of a connection name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Presented {
    /// A TLS ClientHello, with its server name if it has one.
    Tls(Option<String>),
    /// An HTTP/1 request, with its `Host` header (port removed) if it has one.
    Http(Option<String>),
    /// Neither (another protocol, a server that speaks first, or nothing in time).
    Other,
}

/// Peek at `stream` until its first bytes say what they are, for at most `wait`.
pub(crate) async fn presented(stream: &TcpStream, wait: Duration) -> Presented {
    let deadline = Instant::now() + wait;
    let mut buf = vec![0u8; PEEK_MAX];
    let mut seen = 0usize;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, stream.readable()).await.is_err() {
            return classify(&buf[..seen], true).unwrap_or(Presented::Other);
        }
        // Only new bytes count as readiness: with none, `try_io` clears it (unless more
        // arrived meanwhile), so the next wait ends when the client sends more.
        let r = stream.try_io(Interest::READABLE, || {
            match cordon_sys::net::peek(stream.as_fd(), &mut buf) {
                Ok(n) if n == 0 || n > seen => Ok(n),
                Ok(_) => Err(io::ErrorKind::WouldBlock.into()),
                Err(e) => Err(io::Error::from_raw_os_error(e as i32)),
            }
        });
        match r {
            Ok(0) => return classify(&buf[..seen], true).unwrap_or(Presented::Other),
            Ok(n) => {
                seen = n;
                if let Some(p) = classify(&buf[..seen], seen == buf.len()) {
                    return p;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return classify(&buf[..seen], true).unwrap_or(Presented::Other),
        }
    }
}

/// `None` when more bytes are needed to tell (and `full` is false).
pub(crate) fn classify(b: &[u8], full: bool) -> Option<Presented> {
    if b.is_empty() {
        return if full { Some(Presented::Other) } else { None };
    }
    if b[0] == 0x16 {
        return tls(b, full);
    }
    if looks_like_http(b) {
        return http(b, full);
    }
    // A method token still arriving?
    if !full && b.len() < 8 && METHODS.iter().any(|m| m.as_bytes().starts_with(b)) {
        return None;
    }
    Some(Presented::Other)
}

const METHODS: [&str; 9] = [
    "GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "PATCH ", "TRACE ", "CONNECT ",
];

fn looks_like_http(b: &[u8]) -> bool {
    METHODS.iter().any(|m| b.starts_with(m.as_bytes()))
}

fn http(b: &[u8], full: bool) -> Option<Presented> {
    let end = b.windows(4).position(|w| w == b"\r\n\r\n");
    let head = match end {
        Some(e) => &b[..e],
        None if full => b,
        None => return None,
    };
    let text = String::from_utf8_lossy(head);
    let host = text.split("\r\n").skip(1).find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("host")
            .then(|| strip_port(v.trim()).to_string())
    });
    Some(Presented::Http(host))
}

/// `host:port` or `[v6]:port` without the port.
fn strip_port(v: &str) -> &str {
    if v.starts_with('[') {
        return v.split_once(']').map_or(v, |(h, _)| &v[..h.len() + 1]);
    }
    match v.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|c| c.is_ascii_digit()) => h,
        _ => v,
    }
}

/// A TLS record holding a ClientHello: its server name.
fn tls(b: &[u8], full: bool) -> Option<Presented> {
    if b.len() < 5 {
        return if full { Some(Presented::Other) } else { None };
    }
    if b[1] != 3 {
        return Some(Presented::Other);
    }
    let len = usize::from(u16::from_be_bytes([b[3], b[4]]));
    let have = b.len() - 5;
    if have < len && !full {
        return None;
    }
    let rec = &b[5..5 + have.min(len)];
    // Handshake type 1: ClientHello.
    if rec.first() != Some(&1) {
        return Some(Presented::Other);
    }
    Some(Presented::Tls(server_name(rec)))
}

/// A bounds-checked reader over a byte slice.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Some(h)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
}

/// The `host_name` of the server_name extension (RFC 6066) of a ClientHello handshake message.
fn server_name(msg: &[u8]) -> Option<String> {
    let mut c = Cur(msg);
    c.take(4)?; // type, 24-bit length
    c.take(2 + 32)?; // version, random
    let sid = c.u8()?;
    c.take(sid)?;
    let suites = c.u16()?;
    c.take(suites)?;
    let comp = c.u8()?;
    c.take(comp)?;
    let ext_len = c.u16()?;
    let mut exts = Cur(c.take(ext_len.min(c.0.len()))?);
    while !exts.0.is_empty() {
        let ty = exts.u16()?;
        let len = exts.u16()?;
        let body = exts.take(len)?;
        if ty != 0 {
            continue;
        }
        let mut s = Cur(body);
        let list = s.u16()?;
        let mut names = Cur(s.take(list)?);
        while !names.0.is_empty() {
            let kind = names.u8()?;
            let n = names.u16()?;
            let name = names.take(n)?;
            if kind == 0 {
                return Some(String::from_utf8_lossy(name).into_owned());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello record with the given server name (or none).
    pub(crate) fn client_hello(sni: Option<&str>) -> Vec<u8> {
        let mut ext = Vec::new();
        if let Some(n) = sni {
            let n = n.as_bytes();
            let mut list = vec![0u8];
            list.extend_from_slice(&(n.len() as u16).to_be_bytes());
            list.extend_from_slice(n);
            let mut body = (list.len() as u16).to_be_bytes().to_vec();
            body.extend_from_slice(&list);
            ext.extend_from_slice(&0u16.to_be_bytes());
            ext.extend_from_slice(&(body.len() as u16).to_be_bytes());
            ext.extend_from_slice(&body);
        }
        // An unrelated extension first would be skipped; put one after.
        ext.extend_from_slice(&[0x00, 0x0b, 0x00, 0x02, 0x01, 0x00]);
        let mut hello = vec![0x03, 0x03];
        hello.extend_from_slice(&[7u8; 32]);
        hello.push(0); // session id
        hello.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]); // one suite
        hello.extend_from_slice(&[0x01, 0x00]); // null compression
        hello.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        hello.extend_from_slice(&ext);
        let mut hs = vec![1u8];
        hs.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&hello);
        let mut rec = vec![0x16, 0x03, 0x01];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn tls_server_name() {
        let rec = client_hello(Some("api.example.com"));
        assert_eq!(
            classify(&rec, false),
            Some(Presented::Tls(Some("api.example.com".into())))
        );
        assert_eq!(
            classify(&client_hello(None), false),
            Some(Presented::Tls(None))
        );
        // Half a record: wait for the rest, unless nothing more can come.
        assert_eq!(classify(&rec[..rec.len() / 2], false), None);
        assert_eq!(classify(&rec[..3], false), None);
        assert_eq!(
            classify(&rec[..rec.len() / 2], true),
            Some(Presented::Tls(None))
        );
        // Garbage lengths never panic.
        let mut bad = rec.clone();
        bad[5 + 4 + 34] = 0xff;
        let _ = classify(&bad, true);
        for cut in 0..rec.len() {
            let _ = classify(&rec[..cut], true);
        }
    }

    #[test]
    fn http_host() {
        let req = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nhOsT: Api.Example.com:8080\r\n\r\n";
        assert_eq!(
            classify(req, false),
            Some(Presented::Http(Some("Api.Example.com".into())))
        );
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", false),
            Some(Presented::Http(Some("[::1]".into())))
        );
        assert_eq!(
            classify(b"GET / HTTP/1.0\r\n\r\n", false),
            Some(Presented::Http(None))
        );
        assert_eq!(classify(b"GET / HTTP/1.1\r\nHost: a", false), None);
        assert_eq!(classify(b"GE", false), None);
        assert_eq!(
            classify(b"SSH-2.0-OpenSSH\r\n", false),
            Some(Presented::Other)
        );
        assert_eq!(classify(b"", true), Some(Presented::Other));
    }
}
