//! Egress events: one per connection attempt or DNS query, allowed or refused.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

/// Which door saw the attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Door {
    /// The HTTP proxy door (CONNECT and absolute-form requests).
    Proxy,
    /// A transparent listener: the tool dialled an address the DNS door handed out.
    Transparent,
    /// The DNS door.
    Dns,
}

/// What the broker did with the attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Allowed by the policy (the upstream may still have failed: see `reason`).
    Allowed,
    /// Refused by the policy, the vetting or a limit.
    Refused,
}

impl fmt::Display for Door {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Door::Proxy => "proxy",
            Door::Transparent => "transparent",
            Door::Dns => "dns",
        })
    }
}

/// One egress attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EgressEvent {
    /// Tool name.
    pub tool: String,
    /// Session id.
    pub session: String,
    /// Destination as the tool named it, normalised when possible (for DNS: the query name).
    pub name: String,
    /// Destination port; 0 for DNS queries.
    pub port: u16,
    /// The upstream address connected to (or the one refused by vetting); for DNS, the address
    /// handed out.
    pub address: Option<IpAddr>,
    /// Which door.
    pub door: Door,
    /// Allowed or refused.
    pub decision: Decision,
    /// Human-readable reason; for refusals the same text the tool was told.
    pub reason: String,
    /// Bytes sent from the tool to the upstream.
    pub bytes_up: u64,
    /// Bytes received from the upstream for the tool.
    pub bytes_down: u64,
    /// Wall time from accept to close, in milliseconds.
    pub duration_ms: u64,
    /// Start time, RFC 3339 UTC.
    pub time: String,
    /// Secrets whose token the door substituted into this request (names,
    /// never values); empty for every other event.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub injected: Vec<String>,
    /// For a refusal as an exfiltration attempt: the secret whose
    /// placeholder was found where it is not bound (its name, never a value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exfiltration: Option<String>,
    /// Secrets whose real token came back in a response of their bound
    /// endpoint (a reflected request) and was replaced by the placeholder
    /// before the tool saw it (names, never values).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reflected: Vec<String>,
}

/// Where events go. Cheap to clone; the function must not block for long (it runs on the
/// broker's network tasks).
#[derive(Clone)]
pub struct EventSink(Arc<dyn Fn(EgressEvent) + Send + Sync>);

impl EventSink {
    /// Deliver every event to `f`.
    pub fn new(f: impl Fn(EgressEvent) + Send + Sync + 'static) -> Self {
        EventSink(Arc::new(f))
    }

    /// Deliver events to an unbounded channel.
    pub fn channel() -> (Self, tokio::sync::mpsc::UnboundedReceiver<EgressEvent>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (
            EventSink::new(move |e| {
                // A closed receiver means nobody is listening any more; dropping is correct.
                let _ = tx.send(e);
            }),
            rx,
        )
    }

    /// Drop every event.
    pub fn discard() -> Self {
        EventSink::new(|_| {})
    }

    /// Deliver one event.
    pub fn emit(&self, e: EgressEvent) {
        (self.0)(e)
    }
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EventSink")
    }
}

pub(crate) fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Start of an attempt, for the event's `duration_ms` and `time`.
pub(crate) fn started() -> (Instant, String) {
    (Instant::now(), now_rfc3339())
}

/// The refusal text: the tool sees it (403 body) and the event carries it.
pub(crate) fn refusal(target: &str, port: u16, why: &str) -> String {
    format!("egress to {}:{port} refused: {why}", clean(target))
}

/// Make tool-supplied text safe for one log line: printable ASCII only, bounded length.
pub(crate) fn clean(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(256)
        .collect();
    if s.chars().count() > 256 {
        out.push_str("...");
    }
    out
}
