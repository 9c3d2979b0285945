//! Interception: for a sandbox with secrets delivered by the proxy, the
//! doors read its HTTP (terminating TLS with the session CA), substitute a
//! token for its placeholder only where the secret is bound, and refuse the
//! placeholder anywhere else as an exfiltration attempt.
//!
//! One intercepted connection: the first bytes from the tool decide what it
//! speaks. A TLS ClientHello is answered with a leaf of the session CA for
//! the destination (the SNI, when given, must name it), and the door opens
//! its own verified TLS connection to the real upstream (ALPN `h2` offered
//! upstream only when the tool negotiated it); an HTTP request line is read
//! as plain HTTP/1.1; anything else (or an upstream that speaks first) is a
//! byte stream, tunnelled with the tool's bytes scanned. Each request's
//! authority must be the connection's destination; its target, headers and
//! body are scanned (see [`crate::scan`]); a WebSocket (or other HTTP/1.1)
//! upgrade is passed on and its tool-side bytes scanned too: a WebSocket's
//! frames unmasked (see [`ws`]), with no extension offered upstream.

mod body;
mod conn;
mod report;
mod response;
mod stream;
mod substitute;
mod tls;
mod ws;

use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;

use crate::engine::Engine;
use crate::event::Decision;
use crate::interception::Interception;
use crate::io::{Meter, Metered};

pub(crate) use body::ScanBody;
pub(crate) use report::{Dest, exfil};
pub(crate) use response::{ask_identity, guard};
pub(crate) use substitute::apply;

use report::stopped;
use stream::{Prefixed, Speaks, scanned_splice};
use tls::Ended;

/// Serve one allowed connection of a sandbox with interception on (see the
/// module docs). `upstream` is the vetted connection to `dest`.
pub(crate) async fn serve<C>(
    engine: Arc<Engine>,
    icpt: Arc<Interception>,
    dest: Dest,
    mut client: C,
    upstream: TcpStream,
    t0: (Instant, String),
) where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let idle = engine.policy.idle_timeout;
    let meter = Meter::new();
    let mut first = vec![0u8; 16 * 1024];
    let n = tokio::select! {
        r = client.read(&mut first) => r.unwrap_or(0),
        _ = upstream.readable() => usize::MAX,
        () = tokio::time::sleep(idle) => 0,
    };
    if n == 0 {
        close_event(&engine, &dest, &meter, None, t0);
        return;
    }
    let (tls, http) = if n == usize::MAX {
        (false, false)
    } else {
        first.truncate(n);
        (first[0] == 0x16, first[0].is_ascii_uppercase())
    };
    if n == usize::MAX {
        first.clear();
    }
    if !tls && !http {
        // Neither TLS nor HTTP: a byte stream, scanned.
        let up = Metered::new(upstream, meter.clone());
        let hit = scanned_splice(
            Prefixed::new(first, client),
            up,
            icpt.needles().clone(),
            Speaks::Bytes,
            meter.clone(),
            idle,
        )
        .await;
        match hit {
            Some(stop) => {
                let r = stopped(stop, "the tunnelled bytes", &icpt);
                let _ = r.respond(&engine, &dest, &t0);
            }
            None => close_event(&engine, &dest, &meter, None, t0),
        }
        return;
    }
    let client = Prefixed::new(first, client);
    if !tls {
        conn::run_http(
            engine, icpt, dest, client, upstream, false, false, meter, t0,
        )
        .await;
        return;
    }
    match tls::terminate(&engine, &icpt, &dest, client).await {
        Ok((stream, h2)) => {
            conn::run_http(engine, icpt, dest, stream, upstream, true, h2, meter, t0).await;
        }
        Err(Ended::Closed(note)) => close_event(&engine, &dest, &meter, Some(note), t0),
        Err(Ended::Refused(msg)) => {
            dest.event(&engine, Decision::Refused, msg, Vec::new(), None, &t0);
        }
    }
}

/// The connection's closing event: allowed, with its byte counts and `note`.
fn close_event(
    engine: &Engine,
    dest: &Dest,
    meter: &Meter,
    note: Option<String>,
    t0: (Instant, String),
) {
    let reason = match note {
        Some(n) => format!("{}; {n}", dest.allowed_why),
        None => dest.allowed_why.clone(),
    };
    let e = engine.event(
        dest.door,
        &dest.label,
        dest.port,
        Some(dest.addr),
        Decision::Allowed,
        reason,
        (meter.written_bytes(), meter.read_bytes()),
        t0,
    );
    engine.events.emit(e);
}
