//! HTTP pieces both the proxy door and interception use: the body types,
//! a plain-text answer to the tool, and hop-by-hop header stripping.

use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Response, StatusCode};

/// An upstream-bound body's error.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Request bodies sent upstream by an intercepting door.
pub(crate) type ReqBody = BoxBody<Bytes, BoxError>;
/// Responses given to the tool.
pub(crate) type RespBody = BoxBody<Bytes, hyper::Error>;

/// A plain-text answer to the tool: `msg` and a newline.
pub(crate) fn text(status: StatusCode, msg: &str) -> Response<RespBody> {
    let mut r = Response::new(
        Full::new(Bytes::from(format!("{msg}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// An empty body for the tool.
pub(crate) fn empty() -> RespBody {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

/// A body as sent upstream: scanned when interception is on.
pub(crate) fn plain_body(b: Incoming) -> ReqBody {
    b.map_err(|e| Box::new(e) as BoxError).boxed()
}

/// Drop hop-by-hop headers (RFC 9110 7.6.1): those named in `Connection`, and the fixed set.
pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap) {
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        h.remove(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, X-Secret-Hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("accept", HeaderValue::from_static("*/*"));
        h.insert("user-agent", HeaderValue::from_static("t"));
        strip_hop_by_hop(&mut h);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, vec!["accept", "user-agent"]);
    }
}
