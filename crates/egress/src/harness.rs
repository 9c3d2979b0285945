//! In-process entry points to the doors' parsers of hostile bytes, for the fuzz targets
//! (`fuzz/`, docs/fuzzing.md) and property tests: the DNS door's answer to one packet, the
//! proxy door serving one connection over an in-memory stream, the transparent doors' peek at
//! a connection's first bytes, the substitution of a request's placeholders, the placeholder
//! scanner and the reflected-token redactor over a stream cut anywhere. Each calls the doors'
//! own code; nothing here re-implements it.

use std::sync::Arc;

use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Uri};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::engine::Engine;
use crate::interception::Interception;
use crate::name::normalize_host;
use crate::scan::{Needles, Scanner};
use crate::{DoorContext, EgressError, EgressPolicy, EventSink};
use cordon_gate::tokens::{Forms, Redactor};

pub use crate::peek::Presented;

/// The state the doors of one sandbox share, without sockets to a sandbox.
pub struct Harness {
    engine: Arc<Engine>,
}

/// A request after substitution ([`Harness::substitute`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Substituted {
    /// The target or a header is not valid HTTP (hyper would not have parsed it).
    NotARequest,
    /// Refused, with the reason the tool is given.
    Refused(String),
    /// What would go upstream: the target, the headers, and the secrets whose tokens were put
    /// in.
    Sent {
        target: String,
        headers: Vec<(String, Vec<u8>)>,
        injected: Vec<String>,
    },
}

impl Harness {
    /// The doors' state for `policy` (validated as [`crate::serve`] does), intercepting as
    /// `interception` says; events go to `events`. Without [`crate::LocalAddresses`], so the
    /// DNS door answers door addresses and never resolves a name.
    pub fn new(
        policy: Arc<EgressPolicy>,
        events: EventSink,
        interception: Option<Interception>,
    ) -> Result<Harness, EgressError> {
        let ctx = DoorContext {
            tool: policy.tool.clone(),
            session: "harness".into(),
        };
        let engine = Engine::with(policy, ctx, events, None, interception)?;
        Ok(Harness { engine })
    }

    /// The DNS door's answer to one UDP payload (`None`: nothing is sent back).
    pub async fn dns(&self, packet: &[u8]) -> Option<Vec<u8>> {
        crate::dns::answer(&self.engine, packet).await
    }

    /// The proxy door serving one connection whose client sends `input` and then waits for
    /// the door to close: everything the door wrote back. The door closes the connection once
    /// the policy's idle timeout passes with nothing to do; on a runtime whose clock is paused
    /// that is as soon as every task waits. Connections the door opens are real (to the
    /// policy's `resolve` pins only, when it has no DNS access).
    pub async fn proxy(&self, input: &[u8]) -> Vec<u8> {
        let Some(permit) = self.engine.try_slot() else {
            return Vec::new();
        };
        let (client, door) = tokio::io::duplex(64 * 1024);
        let served = tokio::spawn(crate::proxy::serve_conn(self.engine.clone(), door, permit));
        let (mut rd, mut wr) = tokio::io::split(client);
        let write = async move {
            // The door may close before it read everything: not an error here.
            let _ = wr.write_all(input).await;
            wr
        };
        let mut out = Vec::new();
        let read = rd.read_to_end(&mut out);
        let (wr, _) = tokio::join!(write, read);
        drop(wr);
        let _ = served.await;
        out
    }

    /// Substitution on one request to `host:port` (interception's step before a request goes
    /// upstream): `target` is the request target, `headers` its
    /// header fields as sent.
    pub fn substitute(
        &self,
        host: &str,
        port: u16,
        target: &[u8],
        headers: &[(&[u8], &[u8])],
    ) -> Substituted {
        let Some(icpt) = &self.engine.icpt else {
            return Substituted::Refused("no interception".into());
        };
        let Ok(host) = normalize_host(host) else {
            return Substituted::NotARequest;
        };
        let Ok(uri) = Uri::try_from(target) else {
            return Substituted::NotARequest;
        };
        let mut b = Request::builder().uri(uri);
        for (k, v) in headers {
            let (Ok(k), Ok(v)) = (HeaderName::from_bytes(k), HeaderValue::from_bytes(v)) else {
                return Substituted::NotARequest;
            };
            b = b.header(k, v);
        }
        let Ok(req) = b.body(()) else {
            return Substituted::NotARequest;
        };
        let (mut parts, ()) = req.into_parts();
        match crate::intercept::apply(icpt, &host, port, &mut parts) {
            Ok(injected) => Substituted::Sent {
                target: parts.uri.to_string(),
                headers: parts
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
                    .collect(),
                injected,
            },
            Err(r) => Substituted::Refused(r.why().to_string()),
        }
    }
}

/// What the transparent doors make of a connection's first bytes (`complete`: no more will
/// come); `None`: not yet decided.
pub fn peek(first: &[u8], complete: bool) -> Option<Presented> {
    crate::peek::classify(first, complete)
}

/// The placeholder scanner over a stream (a request body, tunnelled bytes) cut into
/// `chunks`: the secret of the first placeholder of `placeholders` (secret, placeholder)
/// found, as written or encoded.
pub fn scan_stream(placeholders: &[(&str, &str)], chunks: &[&[u8]]) -> Option<String> {
    let needles = Arc::new(Needles::new(placeholders.iter().copied()));
    let mut s = Scanner::new(needles);
    chunks.iter().find_map(|c| s.feed(c)).or_else(|| s.finish())
}

/// The reflected-token redactor over a response body cut into `chunks`, for the tokens
/// `(secret, token, placeholder)` substituted in a session: what reaches the tool, and the
/// secrets whose tokens were replaced.
pub fn redact_stream(tokens: &[(&str, &str, &str)], chunks: &[&[u8]]) -> (Vec<u8>, Vec<String>) {
    let mut r = Redactor::new(Arc::new(Forms::new(tokens.iter().copied())));
    let mut out = Vec::new();
    for c in chunks {
        out.extend(r.feed(c));
    }
    out.extend(r.finish());
    (out, r.found())
}

/// The redactor on one complete value (a response header, a trailer): the value with every
/// token replaced, when one was found.
pub fn redact_value(tokens: &[(&str, &str, &str)], value: &[u8]) -> Option<Vec<u8>> {
    Forms::new(tokens.iter().copied())
        .replace_all(value)
        .map(|(v, _)| v)
}
