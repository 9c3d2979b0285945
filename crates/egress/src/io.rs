//! Byte counting and idle detection for upstream connections.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Counters shared between a metered stream and whoever reports on it.
#[derive(Debug)]
pub(crate) struct Meter {
    start: Instant,
    /// Bytes read from the wrapped stream.
    read: AtomicU64,
    /// Bytes written to the wrapped stream.
    written: AtomicU64,
    /// Milliseconds since `start` of the last read or write.
    last_ms: AtomicU64,
}

impl Meter {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Meter {
            start: Instant::now(),
            read: AtomicU64::new(0),
            written: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    pub(crate) fn read_bytes(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    pub(crate) fn written_bytes(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Completes once no byte has moved for `limit`.
    pub(crate) async fn idle(&self, limit: Duration) {
        let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        loop {
            let since = self
                .now_ms()
                .saturating_sub(self.last_ms.load(Ordering::Relaxed));
            if since >= limit_ms {
                return;
            }
            tokio::time::sleep(Duration::from_millis(limit_ms - since)).await;
        }
    }
}

/// A stream wrapper that counts bytes and records activity in a [`Meter`].
pub(crate) struct Metered<S> {
    inner: S,
    meter: Arc<Meter>,
}

impl<S> Metered<S> {
    pub(crate) fn new(inner: S, meter: Arc<Meter>) -> Self {
        Metered { inner, meter }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let n = (buf.filled().len() - before) as u64;
            self.meter.read.fetch_add(n, Ordering::Relaxed);
            self.meter.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.meter.written.fetch_add(n as u64, Ordering::Relaxed);
            self.meter.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.meter.written.fetch_add(n as u64, Ordering::Relaxed);
            self.meter.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Buffer per direction for spliced connections: 8 KiB (tokio's default) costs most of the
/// throughput of a bulk download on loopback.
const SPLICE_BUF: usize = 64 * 1024;

/// Splice `client` and a metered `upstream` until both sides close, an error, or `idle`
/// without traffic. Returns a short note when the splice ended on the idle timeout.
pub(crate) async fn splice<A, B>(
    client: &mut A,
    upstream: &mut Metered<B>,
    idle: Duration,
) -> Option<String>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let meter = upstream.meter.clone();
    tokio::select! {
        r = tokio::io::copy_bidirectional_with_sizes(client, upstream, SPLICE_BUF, SPLICE_BUF) => match r {
            Ok(_) => None,
            Err(e) => Some(format!("connection ended with an error: {e}")),
        },
        () = meter.idle(idle) => Some(format!("closed after {} s idle", idle.as_secs())),
    }
}
