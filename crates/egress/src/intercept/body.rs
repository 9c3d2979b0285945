//! Request bodies scanned for placeholders on their way upstream.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http_body_util::BodyExt;
use hyper::body::{Body as _, Bytes, Frame, Incoming, SizeHint};

use crate::http::{BoxError, ReqBody};
use crate::scan::{Needles, Scanner};

/// Most of a request body read and scanned before the request is sent:
/// a placeholder within it refuses the request before anything reaches the
/// upstream. The rest of a longer body is scanned as it streams, and a
/// placeholder there fails the body (the upstream never gets the rest).
pub(crate) const PRESCAN_BYTES: usize = 1 << 20;

/// A request body scanned on its way upstream: first what was read ahead
/// (already scanned), then the rest, scanned frame by frame; a placeholder
/// fails the body and is recorded in `hit`.
pub(crate) struct ScanBody {
    ahead: std::collections::VecDeque<Frame<Bytes>>,
    inner: Option<Incoming>,
    scanner: Scanner,
    hit: Arc<Mutex<Option<String>>>,
}

/// A scanned body, or the secret whose placeholder it holds.
pub(crate) type Scanned = Result<(ReqBody, Arc<Mutex<Option<String>>>), String>;

impl ScanBody {
    /// Read up to [`PRESCAN_BYTES`] of `inner`, scanning; then the body to
    /// send (the rest scanned as it streams).
    pub(crate) async fn read(mut inner: Incoming, needles: Arc<Needles>) -> Scanned {
        let mut scanner = Scanner::new(needles);
        let mut ahead = std::collections::VecDeque::new();
        let mut total = 0usize;
        let mut done = inner.is_end_stream();
        while !done && total < PRESCAN_BYTES {
            match inner.frame().await {
                Some(Ok(frame)) => {
                    if let Some(d) = frame.data_ref() {
                        total += d.len();
                        if let Some(s) = scanner.feed(d) {
                            return Err(s);
                        }
                    }
                    ahead.push_back(frame);
                }
                // The tool's body failed: forward what there is; the
                // upstream sees a short body.
                Some(Err(_)) | None => done = true,
            }
        }
        if done && let Some(s) = scanner.finish() {
            return Err(s);
        }
        let hit = Arc::new(Mutex::new(None));
        let b = ScanBody {
            ahead,
            inner: if done { None } else { Some(inner) },
            scanner,
            hit: hit.clone(),
        };
        Ok((b.boxed(), hit))
    }

    fn found(&self, s: String) -> BoxError {
        let msg = format!("placeholder of secret {s} in the request body");
        *self.hit.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
        msg.into()
    }
}

impl hyper::body::Body for ScanBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(f) = self.ahead.pop_front() {
            return Poll::Ready(Some(Ok(f)));
        }
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref()
                    && let Some(s) = self.scanner.feed(d)
                {
                    return Poll::Ready(Some(Err(self.found(s))));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => {
                self.inner = None;
                match self.scanner.finish() {
                    Some(s) => Poll::Ready(Some(Err(self.found(s)))),
                    None => Poll::Ready(None),
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ahead.is_empty() && self.inner.as_ref().is_none_or(|i| i.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let ahead: u64 = self
            .ahead
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        match &self.inner {
            None => SizeHint::with_exact(ahead),
            Some(i) => {
                let h = i.size_hint();
                let mut out = SizeHint::new();
                out.set_lower(h.lower() + ahead);
                if let Some(u) = h.upper() {
                    out.set_upper(u + ahead);
                }
                out
            }
        }
    }
}
