//! Byte streams with the tool's side scanned: a connection that speaks
//! neither TLS nor HTTP, and upgraded streams (WebSocket frames unmasked
//! and scanned by [`super::ws`], any other upgrade as bytes).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::ws::{Frames, Stop};
use crate::io::Meter;
use crate::scan::{Needles, Scanner};

/// How the tool's bytes are read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Speaks {
    /// Bytes, scanned as they are.
    Bytes,
    /// WebSocket frames from a client: each payload unmasked and scanned
    /// (the raw bytes too); a frame that cannot be scanned ends the tunnel.
    WebSocket,
}

/// Bytes already read from a stream, then the stream.
pub(crate) struct Prefixed<S> {
    pre: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub(crate) fn new(pre: Vec<u8>, inner: S) -> Self {
        Prefixed { pre, pos: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.pre.len() {
            let n = (self.pre.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.pre[start..start + n]);
            self.pos += n;
            if self.pos == self.pre.len() {
                self.pre = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Tunnel `client` and `upstream` with the tool's bytes scanned as it
/// `speaks`: a placeholder, or WebSocket frames that cannot be scanned,
/// end the tunnel before the read that holds them is forwarded. Returns
/// why, or `None` when the tunnel ended otherwise.
pub(crate) async fn scanned_splice<A, B>(
    client: A,
    upstream: B,
    needles: Arc<Needles>,
    speaks: Speaks,
    meter: Arc<Meter>,
    idle: std::time::Duration,
) -> Option<Stop>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let mut scanner = Scanner::new(needles.clone());
    let mut frames = (speaks == Speaks::WebSocket).then(|| Frames::new(needles));
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    if let Some(Err(stop)) = frames.as_mut().map(Frames::finish) {
                        return Some(stop);
                    }
                    let _ = uw.shutdown().await;
                    return None;
                }
                Ok(n) => n,
            };
            if let Some(s) = scanner.feed(&buf[..n]) {
                return Some(Stop::Placeholder(s));
            }
            if let Some(Err(stop)) = frames.as_mut().map(|f| f.feed(&buf[..n])) {
                return Some(stop);
            }
            if uw.write_all(&buf[..n]).await.is_err() {
                return None;
            }
        }
    };
    let down = async {
        let _ = tokio::io::copy(&mut ur, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::pin!(up);
    tokio::pin!(down);
    let (mut up_done, mut down_done) = (false, false);
    loop {
        tokio::select! {
            r = &mut up, if !up_done => {
                up_done = true;
                if r.is_some() {
                    return r;
                }
            }
            () = &mut down, if !down_done => { down_done = true; }
            () = meter.idle(idle) => return None,
        }
        if up_done && down_done {
            return None;
        }
    }
}
