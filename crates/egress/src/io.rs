//! Byte counting and idle detection for upstream connections, and the tunnels: a CONNECT
//! tunnel or a transparent connection is spliced socket to socket through a pipe
//! (`splice(2)`, the bytes never copied through the broker's memory), with a plain copy when
//! the client is not a bare socket or no pipe can be had.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::TcpStream;
// Tokio's clock: the same as the system's, except where a runtime pauses it (the fuzz
// harness does, so that an idle limit passes as soon as everything waits).
use tokio::time::Instant;

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

    fn add_read(&self, n: u64) {
        self.read.fetch_add(n, Ordering::Relaxed);
        self.touch();
    }

    fn add_written(&self, n: u64) {
        self.written.fetch_add(n, Ordering::Relaxed);
        self.touch();
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

    fn into_inner(self) -> S {
        self.inner
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

/// Buffer per direction for copied connections: 8 KiB (tokio's default) costs most of the
/// throughput of a bulk download on loopback.
const COPY_BUF: usize = 64 * 1024;

/// Pipe per direction for spliced connections (the default pipe is 64 KiB; a larger one means
/// fewer system calls per byte, when the system allows it).
const PIPE_SIZE: usize = 1024 * 1024;

/// Copy between `client` and a metered `upstream` until both sides close, an error, or `idle`
/// without traffic. Returns a short note when the copy ended on the idle timeout or an error.
pub(crate) async fn copy<A, B>(
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
        r = tokio::io::copy_bidirectional_with_sizes(client, upstream, COPY_BUF, COPY_BUF) => match r {
            Ok(_) => None,
            Err(e) => Some(format!("connection ended with an error: {e}")),
        },
        () = meter.idle(idle) => Some(format!("closed after {} s idle", idle.as_secs())),
    }
}

/// The tunnel of a CONNECT request: the client connection hyper handed over, and the
/// upstream. Spliced when the client is the bare socket of the proxy door (bytes the client
/// sent after its request go first); `meter` counts the upstream side.
pub(crate) async fn tunnel_upgraded(
    upgraded: Upgraded,
    upstream: TcpStream,
    meter: Arc<Meter>,
    idle: Duration,
) -> Option<String> {
    match upgraded.downcast::<TokioIo<Metered<TcpStream>>>() {
        Ok(parts) => {
            let client = parts.io.into_inner().into_inner();
            let mut upstream = upstream;
            if !parts.read_buf.is_empty() {
                if let Err(e) = upstream.write_all(&parts.read_buf).await {
                    return Some(format!("connection ended with an error: {e}"));
                }
                meter.add_written(parts.read_buf.len() as u64);
            }
            tunnel(&client, &upstream, meter, idle).await
        }
        Err(upgraded) => {
            let mut client = TokioIo::new(upgraded);
            let mut up = Metered::new(upstream, meter);
            copy(&mut client, &mut up, idle).await
        }
    }
}

/// Splice `client` and `upstream` until both sides close, an error, or `idle` without traffic
/// (a plain copy if no pipe can be made); `meter` counts the upstream side. Returns a short
/// note when the tunnel ended on the idle timeout or an error.
pub(crate) async fn tunnel(
    client: &TcpStream,
    upstream: &TcpStream,
    meter: Arc<Meter>,
    idle: Duration,
) -> Option<String> {
    let (Ok(up_pipe), Ok(down_pipe)) = (pipe(), pipe()) else {
        // No pipes (descriptor limit): copy through the broker instead.
        return copy_refs(client, upstream, meter, idle).await;
    };
    let m_up = meter.clone();
    let m_down = meter.clone();
    let both = async {
        tokio::try_join!(
            pump(client, upstream, &up_pipe, |n| m_up.add_written(n)),
            pump(upstream, client, &down_pipe, |n| m_down.add_read(n)),
        )
    };
    tokio::select! {
        r = both => match r {
            Ok(_) => None,
            Err(e) => Some(format!("connection ended with an error: {e}")),
        },
        () = meter.idle(idle) => Some(format!("closed after {} s idle", idle.as_secs())),
    }
}

/// The copy fallback of [`tunnel`], on borrowed sockets.
async fn copy_refs(
    client: &TcpStream,
    upstream: &TcpStream,
    meter: Arc<Meter>,
    idle: Duration,
) -> Option<String> {
    let mut c = RefStream(client);
    let mut up = Metered::new(RefStream(upstream), meter);
    copy(&mut c, &mut up, idle).await
}

/// A pipe for one direction: (read end, write end), non-blocking, as large as allowed.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = cordon_sys::net::splice_pipe().map_err(errno)?;
    // The default size still works; a larger one only saves system calls.
    let _ = cordon_sys::io::set_pipe_size(w.as_fd(), PIPE_SIZE);
    Ok((r, w))
}

fn errno(e: cordon_sys::Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// One direction: `from` into the pipe, the pipe into `to`, until end of file on `from`
/// (then `to` is shut down for writing).
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &(OwnedFd, OwnedFd),
    count: impl Fn(u64),
) -> io::Result<()> {
    let (pr, pw) = pipe;
    loop {
        // The pipe is empty here, so EAGAIN means the socket has nothing to read.
        let n = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || {
                cordon_sys::net::splice(from.as_fd(), pw.as_fd(), PIPE_SIZE).map_err(errno)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            // Half-close: the other direction may still be talking.
            return match cordon_sys::net::shutdown_write(to.as_fd()) {
                Ok(()) | Err(cordon_sys::Errno::ENOTCONN) => Ok(()),
                Err(e) => Err(errno(e)),
            };
        }
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                cordon_sys::net::splice(pr.as_fd(), to.as_fd(), left).map_err(errno)
            }) {
                Ok(m) => left -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        count(n as u64);
    }
}

/// `&TcpStream` as a stream to copy on (tokio implements reads and writes on `&TcpStream`
/// through its readiness API).
struct RefStream<'a>(&'a TcpStream);

impl AsyncRead for RefStream<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            match self.0.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
            let unfilled = buf.initialize_unfilled();
            match self.0.try_read(unfilled) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for RefStream<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            match self.0.poll_write_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
            match self.0.try_write(buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(
            cordon_sys::net::shutdown_write(self.0.as_fd()).or_else(|e| match e {
                cordon_sys::Errno::ENOTCONN => Ok(()),
                e => Err(errno(e)),
            }),
        )
    }
}
