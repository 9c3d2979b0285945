//! A plain HTTP/1.1 upstream on loopback that keeps each request's first
//! line (or whole head) and answers it with a body of the test's choosing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

/// The request lines an upstream received, in order.
pub type Lines = Arc<Mutex<Vec<String>>>;

/// An upstream on a free port of 127.0.0.1, answering each request with
/// `body(request line)` (`Connection: close`), served by a thread of its
/// own; its address and what it received.
pub fn request_lines(body: impl Fn(&str) -> String + Send + 'static) -> (SocketAddr, Lines) {
    serve(false, body)
}

/// [`request_lines`] keeping each request's whole head (request line and
/// headers), answered with `body(request line)`.
pub fn request_heads(body: impl Fn(&str) -> String + Send + 'static) -> (SocketAddr, Lines) {
    serve(true, body)
}

fn serve(whole_head: bool, body: impl Fn(&str) -> String + Send + 'static) -> (SocketAddr, Lines) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let addr = l.local_addr().expect("the bound address");
    let seen = Lines::default();
    let s = seen.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let head = String::from_utf8_lossy(&req);
            let first = head.lines().next().unwrap_or("").trim().to_string();
            let body = body(&first);
            let kept = if whole_head { head.to_string() } else { first };
            s.lock().unwrap_or_else(|e| e.into_inner()).push(kept);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (addr, seen)
}
