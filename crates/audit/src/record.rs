//! The audit record: one per tool call, written by the broker, never by the tool.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::escape::escape_text;

/// Cap on a stored stderr excerpt, in bytes of escaped text.
pub const STDERR_CAP: usize = 8 * 1024;
/// Cap on stored content (only when the policy asks for content), in bytes of escaped text.
pub const CONTENT_CAP: usize = 64 * 1024;

/// How a call ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The tool ran and its result passed the gate.
    #[default]
    Ok,
    /// The tool exited non-zero.
    ToolError,
    /// The tool was killed by a signal (not by a limit).
    Killed,
    /// A resource limit (memory, pids, wall clock, output) ended the call.
    LimitHit,
    /// The broker refused the call before it ran (policy).
    Denied,
    /// The output gate refused the result.
    Refused,
    /// The broker itself failed.
    Error,
    /// A cap at the gateway's door refused the call or session (a tool's
    /// `max_concurrent`, `max_sandboxes`, a principal's rate or sessions);
    /// `limits_hit` names which.
    Busy,
    /// A session-level record: the gateway ended the session (`reason`
    /// says why: idle for its timeout, its client gone) and stopped every
    /// sandbox of it.
    SessionEnded,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::ToolError => "tool_error",
            Status::Killed => "killed",
            Status::LimitHit => "limit_hit",
            Status::Denied => "denied",
            Status::Refused => "refused",
            Status::Error => "error",
            Status::Busy => "busy",
            Status::SessionEnded => "session_ended",
        }
    }
}

/// Size and hash of an input or output; the content itself only when the policy asks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    pub bytes: u64,
    /// Lower-case hex SHA-256 of the raw bytes.
    pub sha256: String,
    /// Lossily decoded, control-escaped, capped at [`CONTENT_CAP`]; `None` unless asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

impl Payload {
    /// Size and SHA-256 of `data`, plus its escaped text when `record_content` is true.
    pub fn of(data: &[u8], record_content: bool) -> Payload {
        Payload {
            bytes: data.len() as u64,
            sha256: hex::encode(Sha256::digest(data)),
            content: record_content.then(|| escape_text(data, CONTENT_CAP)),
        }
    }
}

/// Allowed or denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allow,
    Deny,
}

/// One network attempt by the tool, as seen by the egress door.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressEvent {
    /// Host name asked for (SNI, CONNECT target or DNS name).
    pub name: String,
    pub port: u16,
    /// Resolved address, when it got that far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    pub decision: Decision,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default)]
    pub bytes_up: u64,
    #[serde(default)]
    pub bytes_down: u64,
    #[serde(default)]
    pub duration_ms: u64,
    /// Secrets whose token the egress door substituted into this request
    /// (names, never values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injected: Vec<String>,
    /// Refused as an exfiltration attempt: the secret whose placeholder was
    /// found where it is not bound (its name, never a value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exfiltration: Option<String>,
    /// Secrets whose real token came back in a response of their bound
    /// endpoint and was replaced by the placeholder (names, never values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reflected: Vec<String>,
}

/// What the output gate did to the result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateSummary {
    pub kind: String,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub truncated: bool,
    /// Non-zero strip counts per class.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stripped: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_valid: Option<bool>,
    /// Refusal code (`schema_violation`, `too_large`, ...) when the gate refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// The refusal's message (it never contains output content).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// Secrets whose live token was in the output, replaced by their placeholder (names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens_replaced: Vec<String>,
    /// Well-known secret formats redacted from the output, counted per rule.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets_redacted: BTreeMap<String, u64>,
}

impl From<&cordon_gate::Envelope> for GateSummary {
    fn from(e: &cordon_gate::Envelope) -> Self {
        GateSummary {
            kind: e.kind.as_str().to_owned(),
            bytes_in: e.bytes_in,
            bytes_out: e.bytes_out,
            truncated: e.truncated,
            stripped: e
                .stripped
                .nonzero()
                .map(|(k, n)| (k.to_owned(), n))
                .collect(),
            schema_valid: e.schema_valid,
            refused: None,
            refusal: None,
            tokens_replaced: e.tokens_replaced.clone(),
            secrets_redacted: e.secrets_redacted.clone(),
        }
    }
}

impl GateSummary {
    /// A refused result: `bytes_in` is the raw output size.
    pub fn refused(
        kind: cordon_gate::OutputKind,
        bytes_in: u64,
        refusal: &cordon_gate::GateRefusal,
    ) -> Self {
        GateSummary {
            kind: kind.as_str().to_owned(),
            bytes_in,
            refused: Some(refusal.code().to_owned()),
            refusal: Some(refusal.to_string()),
            schema_valid: matches!(refusal, cordon_gate::GateRefusal::SchemaViolation { .. })
                .then_some(false),
            ..GateSummary::default()
        }
    }
}

/// What the credential broker did with one secret of a session: a mint,
/// re-mint, revocation or failure. Never the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialEvent {
    /// `mint`, `remint`, `mint_failed`, `revoke`, `revoke_not_offered`,
    /// `revoke_failed`.
    pub event: String,
    /// The secret's variable name.
    pub secret: String,
    pub provider: String,
    pub scope: String,
    pub ttl_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// `proxy` or `env`.
    pub deliver: String,
    /// When the minted token expires (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// One tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// RFC 3339, UTC.
    #[serde(with = "crate::rfc3339_utc")]
    pub time: OffsetDateTime,
    pub tool: String,
    pub profile: String,
    /// `native`, `gvisor`, `microvm`, `mcp`, ...
    pub runtime: String,
    pub session: String,
    pub caller: String,
    /// The authenticated principal of the session (`sub`, token name,
    /// `local:<uid>`); absent in records written before principals existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The session's tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The host uid the call's sandbox ran as, when it is its tenant's own
    /// (from a subordinate range).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_uid: Option<u32>,
    /// Why the call's sandbox ran under the host uid every tenant shares,
    /// when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_uid: Option<String>,
    pub input: Payload,
    pub output: Payload,
    pub duration_ms: u64,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub signal: Option<i32>,
    pub status: Status,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits_hit: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateSummary>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<EgressEvent>,
    /// Lossily decoded, control-escaped, capped stderr. Never parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// A credential broker's record (then `tool` and `session` are whose).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<CredentialEvent>,
    /// A warm pool's record (`mcp: {warm: N}`): a server ready, handed to
    /// a session, discarded, or failed to start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolEvent>,
    /// `cordon serve`'s continuous conformance: a tool taken out of
    /// service because a probe run did not hold, or returned to it; or a
    /// reload of the manifest, applied or refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceEvent>,
    /// Where the call's time went, phase by phase, where it was measured
    /// (absent in records written before phases were measured, and in
    /// records that are not calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// The call's place in a distributed trace (W3C trace context): the
    /// trace the agent's `traceparent` named, or one the gateway began
    /// when it exports traces; the span is the call's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
}

/// A call's place in a distributed trace, as lowercase hex (W3C trace
/// context: a 16-byte trace id, 8-byte span ids).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    pub trace_id: String,
    /// The call's own span.
    pub span_id: String,
    /// The agent's span the call was made in, when it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_span_id: Option<String>,
    /// Whether the trace is recorded (the agent's `sampled` flag; a trace
    /// the gateway began always is).
    pub sampled: bool,
}

/// The phases of one call, in microseconds; a phase the call did not
/// reach (or that was not measured) is absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    /// The checks before a sandbox is asked for: grants, in-service state,
    /// the caps at the door, arguments against the input schema, the
    /// tenant's uid and volumes, the credentials minted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission_us: Option<u64>,
    /// Getting a sandbox: made and started (a command tool's, up to the
    /// moment its program is released to run), taken from a pool, or an
    /// MCP server started or reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_us: Option<u64>,
    /// The tool running until its result (or the server answering).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_us: Option<u64>,
    /// The output gate on the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_us: Option<u64>,
}

impl Timings {
    /// Microseconds of `d`, saturated.
    pub fn us(d: std::time::Duration) -> u64 {
        u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
    }

    /// Each measured phase with its name as the metrics label it.
    pub fn phases(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("admission", self.admission_us),
            ("start", self.start_us),
            ("run", self.run_us),
            ("gate", self.gate_us),
        ]
        .into_iter()
        .filter_map(|(n, v)| v.map(|v| (n, v)))
    }

    /// Nothing measured.
    pub fn is_empty(&self) -> bool {
        self.phases().next().is_none()
    }
}

/// A tool taken out of service or returned to it by a probe run of
/// `cordon serve` (docs/probes.md, "Continuous conformance"), or a reload
/// of its manifest on SIGHUP (docs/mcp.md, "Reloading the manifest").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceEvent {
    /// `out_of_service`, `in_service`, `reloaded` or `reload_refused`.
    pub event: String,
    /// The probes that did not hold (`out_of_service`), or none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probes: Vec<String>,
    /// Why: `schedule`, `signal`, `input_changed` or `reload` (a probe
    /// run), `sighup` (a reload).
    pub trigger: String,
}

/// What a warm pool did with one of its sandboxes (`mcp: {warm: N}`; for
/// a command tool's `lifetime: pool`, `handed_over` in the record of the
/// call that took one, `sandbox` its id `pool-<pid>-<n>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolEvent {
    /// `ready` (its server answered `initialize` and `tools/list`; the
    /// record's session is the sandbox's own id), `handed_over` (to the
    /// record's session), `discarded` (it ended while it waited; the
    /// record's session is the one that found it) or `failed` (it did not
    /// start).
    pub event: String,
    /// The pooled sandbox's own id (the session it was started under).
    pub sandbox: String,
    /// Always true: the server was started before any session asked.
    pub pooled: bool,
    /// `handed_over` and `discarded`: how long it waited in the pool,
    /// ready; `ready`: how long it took to start; in milliseconds.
    pub waited_ms: u64,
}

impl AuditRecord {
    /// A record stamped now, everything else empty.
    pub fn new(tool: impl Into<String>, profile: impl Into<String>) -> Self {
        AuditRecord {
            time: OffsetDateTime::now_utc(),
            tool: tool.into(),
            profile: profile.into(),
            runtime: String::new(),
            session: String::new(),
            caller: String::new(),
            principal: None,
            tenant: None,
            tenant_uid: None,
            shared_uid: None,
            input: Payload::of(b"", false),
            output: Payload::of(b"", false),
            duration_ms: 0,
            exit_code: None,
            signal: None,
            status: Status::Ok,
            reason: None,
            limits_hit: Vec::new(),
            gate: None,
            egress: Vec::new(),
            stderr: None,
            warnings: Vec::new(),
            credential: None,
            pool: None,
            service: None,
            timings: None,
            trace: None,
        }
    }

    /// Store a stderr excerpt: lossily decoded, control characters escaped, capped at
    /// [`STDERR_CAP`].
    pub fn set_stderr(&mut self, raw: &[u8]) {
        self.stderr = if raw.is_empty() {
            None
        } else {
            Some(escape_text(raw, STDERR_CAP))
        };
    }

    /// Was something refused or denied in this call: the call itself, the gate, or any
    /// egress attempt?
    pub fn is_denied(&self) -> bool {
        matches!(self.status, Status::Denied | Status::Refused | Status::Busy)
            || self.gate.as_ref().is_some_and(|g| g.refused.is_some())
            || self.egress.iter().any(|e| e.decision == Decision::Deny)
    }
}
