//! Responses of bound endpoints on their way back to the tool: every token
//! substituted in the session is replaced by its placeholder in the
//! headers, the body (as it streams) and the trailers (see
//! [`cordon_gate::tokens`]); a compressed response, which cannot be scanned, is
//! refused.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};

use super::report::{Dest, Refusal};
use crate::engine::Engine;
use crate::event::{Decision, clean};
use crate::http::RespBody;
use crate::interception::Interception;
use crate::name::Host;
use cordon_gate::tokens::{Forms, Redactor};

/// On a request to a bound endpoint: ask for the response unencoded, so
/// that it can be scanned (the tool's own `Accept-Encoding` is replaced).
pub(crate) fn ask_identity(icpt: &Interception, host: &Host, port: u16, headers: &mut HeaderMap) {
    if icpt.is_bound(host, port) {
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
}

/// The response of a request to `dest`, made safe for the tool: with a
/// token substituted in this session and `dest` a bound endpoint, every
/// form of it in the headers, body and trailers is replaced by its
/// placeholder (reported as an event), and a compressed response refused.
/// Anything else goes through as it came.
pub(crate) fn guard(
    engine: &Arc<Engine>,
    icpt: &Interception,
    dest: &Dest,
    resp: Response<Incoming>,
    t0: &(Instant, String),
) -> Result<Response<RespBody>, Refusal> {
    let forms = match icpt.reflected_forms() {
        Some(f) if icpt.is_bound(&dest.host, dest.port) && !f.is_empty() => f,
        _ => return Ok(resp.map(|b| b.boxed())),
    };
    let (mut parts, body) = resp.into_parts();
    if let Some(enc) = compressed(&parts.headers) {
        return Err(Refusal::Other {
            status: StatusCode::BAD_GATEWAY,
            why: format!(
                "the response came encoded (Content-Encoding: {}) although the door asked for identity; it cannot be scanned for the tokens of this session, so it is not passed on",
                clean(&enc)
            ),
        });
    }
    let found = redact_headers(&forms, &mut parts.headers);
    let reporter = Reporter {
        engine: engine.clone(),
        dest: dest.clone(),
        t0: t0.clone(),
    };
    if !found.is_empty() {
        reporter.report(&found, "the response headers");
    }
    if body.is_end_stream() {
        return Ok(Response::from_parts(parts, body.boxed()));
    }
    // The length changes with each replacement.
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = RedactBody {
        inner: body,
        red: Redactor::new(forms.clone()),
        forms,
        trailers: None,
        trailer_found: Vec::new(),
        done: false,
        ended: false,
        reporter: Some(reporter),
    };
    Ok(Response::from_parts(parts, body.boxed()))
}

/// A content coding other than identity, as the header says it.
fn compressed(h: &HeaderMap) -> Option<String> {
    let all: Vec<String> = h
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    let joined = all.join(", ");
    joined
        .split(',')
        .map(str::trim)
        .any(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"))
        .then_some(joined)
}

/// Replace every form of a token in the values of `h`; the secrets found.
/// A value that would no longer be a valid header value is dropped.
fn redact_headers(forms: &Forms, h: &mut HeaderMap) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let old = std::mem::take(h);
    let mut name = None;
    for (k, v) in old {
        if let Some(k) = k {
            name = Some(k);
        }
        let Some(k) = name.clone() else {
            continue;
        };
        match forms.replace_all(v.as_bytes()) {
            None => {
                h.append(k, v);
            }
            Some((nv, secrets)) => {
                for s in secrets {
                    let s = forms.secret(s).to_string();
                    if !found.contains(&s) {
                        found.push(s);
                    }
                }
                if let Ok(nv) = HeaderValue::from_bytes(&nv) {
                    h.append(k, nv);
                }
            }
        }
    }
    found
}

/// Reports tokens found coming back.
struct Reporter {
    engine: Arc<Engine>,
    dest: Dest,
    t0: (Instant, String),
}

impl Reporter {
    fn report(&self, secrets: &[String], place: &str) {
        let why = format!(
            "the token of {} came back from {}:{} in {place}: replaced by its placeholder before the tool saw it",
            secrets.join(", "),
            self.dest.label,
            self.dest.port
        );
        tracing::warn!(
            tool = %self.engine.policy.tool,
            destination = %self.dest.label,
            port = self.dest.port,
            secrets = %secrets.join(", "),
            "{why}"
        );
        let mut e = self.engine.event(
            self.dest.door,
            &self.dest.label,
            self.dest.port,
            Some(self.dest.addr),
            Decision::Allowed,
            format!("{}; {why}", self.dest.allowed_why),
            (0, 0),
            self.t0.clone(),
        );
        e.reflected = secrets.to_vec();
        self.engine.events.emit(e);
    }
}

/// A response body with every form of a token replaced as it streams.
struct RedactBody {
    inner: Incoming,
    red: Redactor,
    forms: Arc<Forms>,
    /// Trailers, passed on after the rest of the data.
    trailers: Option<HeaderMap>,
    trailer_found: Vec<String>,
    /// The upstream's body is done (its held-back bytes flushed).
    done: bool,
    /// The end was returned.
    ended: bool,
    reporter: Option<Reporter>,
}

impl RedactBody {
    /// Report what was found, once (at the end, or when dropped early).
    fn report(&mut self) {
        let Some(r) = self.reporter.take() else {
            return;
        };
        let mut found = self.red.found();
        for s in &self.trailer_found {
            if !found.contains(s) {
                found.push(s.clone());
            }
        }
        if !found.is_empty() {
            r.report(&found, "the response body");
        }
    }
}

impl Drop for RedactBody {
    fn drop(&mut self) {
        self.report();
    }
}

impl Body for RedactBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                if let Some(t) = this.trailers.take() {
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                this.ended = true;
                this.report();
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(d) => {
                        let out = this.red.feed(&d);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                    }
                    Err(frame) => {
                        if let Ok(mut t) = frame.into_trailers() {
                            let found = redact_headers(&this.forms, &mut t);
                            this.trailer_found.extend(found);
                            this.trailers = Some(t);
                        }
                        // Trailers end the body: the held-back bytes first.
                        if this.trailers.is_some() {
                            this.done = true;
                            let rest = this.red.finish();
                            if !rest.is_empty() {
                                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                            }
                        }
                    }
                },
                Poll::Ready(None) => {
                    this.done = true;
                    let rest = this.red.finish();
                    if !rest.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::new()
    }
}
