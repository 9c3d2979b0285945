//! Prometheus metrics of `cordon serve`, in the OpenMetrics text format
//! (`GET /metrics` on the HTTP gateway, or `cordon serve --metrics ADDR`).
//!
//! The counters are fed by the audit log's own events: [`Metrics`] is a
//! [`cordon_audit::RecordObserver`] of the broker's [`cordon_audit::Auditor`],
//! so every call, refusal, egress attempt and credential event is counted
//! where it is recorded, once. The gauges (live sessions) are read when the
//! metrics are rendered.
//!
//! Label values are bounded: tool names the manifest declares (any other
//! name, e.g. an unknown tool a client asked for, is `_other`), profiles and
//! runtimes as recorded, and fixed enums (statuses, verdicts, credential
//! events). Never tool input, output, secrets or client-supplied strings.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;

use cordon_audit::{AuditRecord, RecordObserver, Status};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The path the metrics are served on.
pub const METRICS_PATH: &str = "/metrics";

/// The tool of the records about a session, not a call.
const SESSION: &str = "(session)";

/// The label of a tool the manifest does not declare.
const OTHER: &str = "_other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: String,
    profile: String,
    runtime: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    tool: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EgressLabels {
    tool: String,
    verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CredentialLabels {
    tool: String,
    event: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    tool: String,
    verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    tool: String,
}

fn call_histogram() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The metrics of one gateway.
pub struct Metrics {
    registry: Registry,
    /// Tool names the manifest declares (the only tool label values).
    tools: BTreeSet<String>,
    calls: Family<CallLabels, Counter>,
    durations: Family<DurationLabels, Histogram, fn() -> Histogram>,
    refusals: Family<RefusalLabels, Counter>,
    egress: Family<EgressLabels, Counter>,
    credentials: Family<CredentialLabels, Counter>,
    sessions_ended: Counter,
    sessions: Gauge,
    probes: Family<ProbeLabels, Gauge>,
    last_proved: Family<ToolLabel, Gauge<f64, AtomicU64>>,
    /// Counts the live sessions when the metrics are rendered (set by the
    /// transport).
    live_sessions: std::sync::RwLock<Option<SessionCount>>,
}

/// Counts the live sessions of a transport.
pub(crate) type SessionCount = std::sync::Arc<dyn Fn() -> usize + Send + Sync>;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Metrics of a gateway serving `tools` (the manifest's names).
    pub fn new(tools: impl IntoIterator<Item = String>) -> Metrics {
        let mut registry = Registry::with_prefix("cordon");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "calls",
            "Tool calls by tool, profile, runtime and how they ended (status as in the audit log)",
            calls.clone(),
        );
        let durations =
            Family::<DurationLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                call_histogram,
            );
        registry.register(
            "call_duration_seconds",
            "Duration of tool calls by tool and phase (`call`: the whole call, as audited)",
            durations.clone(),
        );
        let refusals = Family::<RefusalLabels, Counter>::default();
        registry.register(
            "refusals",
            "Calls and requests refused, by the status of their audit record: denied (policy, schema, grants, unknown name, another principal's session), refused (output gate), busy (a cap at the door), limit_hit (a resource limit)",
            refusals.clone(),
        );
        let egress = Family::<EgressLabels, Counter>::default();
        registry.register(
            "egress",
            "Egress attempts of sandboxes by tool and verdict (allowed, denied, exfiltration)",
            egress.clone(),
        );
        let credentials = Family::<CredentialLabels, Counter>::default();
        registry.register(
            "credential_events",
            "Credential broker events by tool: mint, remint, mint_failed, revoke, revoke_not_offered, revoke_failed",
            credentials.clone(),
        );
        let sessions_ended = Counter::default();
        registry.register(
            "sessions_ended",
            "Sessions the gateway ended and audited so (idle for their timeout, client gone, deleted)",
            sessions_ended.clone(),
        );
        let sessions = Gauge::default();
        registry.register("sessions", "Live MCP sessions", sessions.clone());
        let probes = Family::<ProbeLabels, Gauge>::default();
        registry.register(
            "probe_verdicts",
            "The last start probe's verdict of each tool (1 for the verdict it gave)",
            probes.clone(),
        );
        let last_proved = Family::<ToolLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "tool_last_proved_timestamp_seconds",
            "When each tool's start probe last passed (Unix time)",
            last_proved.clone(),
        );
        Metrics {
            registry,
            tools: tools.into_iter().collect(),
            calls,
            durations,
            refusals,
            egress,
            credentials,
            sessions_ended,
            sessions,
            probes,
            last_proved,
            live_sessions: std::sync::RwLock::new(None),
        }
    }

    /// Count the live sessions with `f` when rendering.
    pub(crate) fn count_sessions_with(&self, f: SessionCount) {
        if let Ok(mut s) = self.live_sessions.write() {
            *s = Some(f);
        }
    }

    /// The tool label of `name`: itself when the manifest declares it.
    fn tool(&self, name: &str) -> String {
        if self.tools.contains(name) {
            name.to_owned()
        } else {
            OTHER.to_owned()
        }
    }

    /// A start probe's verdict for `tool`, a name from the manifest (a
    /// tool whose probe failed is one the gateway does not serve):
    /// `held`, `cached` (a proof still fresh) or `not_proved`;
    /// `proved_at`: when it was last proved (Unix time).
    pub fn probed(&self, tool: &str, verdict: &'static str, proved_at: Option<f64>) {
        let tool = tool.to_owned();
        self.probes
            .get_or_create(&ProbeLabels {
                tool: tool.clone(),
                verdict: verdict.to_owned(),
            })
            .set(1);
        if let Some(t) = proved_at {
            self.last_proved.get_or_create(&ToolLabel { tool }).set(t);
        }
    }

    /// The metrics in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let live = self
            .live_sessions
            .read()
            .ok()
            .and_then(|f| f.as_ref().map(|f| f()))
            .unwrap_or(0);
        self.sessions.set(i64::try_from(live).unwrap_or(i64::MAX));
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            // Writing into a String does not fail; say it if it ever does.
            tracing::warn!("rendering the metrics: {e}");
        }
        out
    }
}

/// A refusal's kind, from the record's status (`None`: not a refusal).
fn refusal_kind(status: Status) -> Option<&'static str> {
    match status {
        Status::Denied | Status::Refused | Status::Busy | Status::LimitHit => Some(status.as_str()),
        _ => None,
    }
}

/// A credential event's name, when it is one of the broker's.
fn credential_event(e: &str) -> &'static str {
    match e {
        "mint" => "mint",
        "remint" => "remint",
        "mint_failed" => "mint_failed",
        "revoke" => "revoke",
        "revoke_not_offered" => "revoke_not_offered",
        "revoke_failed" => "revoke_failed",
        _ => "other",
    }
}

impl RecordObserver for Metrics {
    fn recorded(&self, rec: &AuditRecord) {
        let tool = self.tool(&rec.tool);
        if let Some(c) = &rec.credential {
            self.credentials
                .get_or_create(&CredentialLabels {
                    tool,
                    event: credential_event(&c.event).to_owned(),
                })
                .inc();
            return;
        }
        if !rec.egress.is_empty() {
            for e in &rec.egress {
                let verdict = if e.exfiltration.is_some() {
                    "exfiltration"
                } else if e.decision == cordon_audit::Decision::Allow {
                    "allowed"
                } else {
                    "denied"
                };
                self.egress
                    .get_or_create(&EgressLabels {
                        tool: tool.clone(),
                        verdict: verdict.to_owned(),
                    })
                    .inc();
            }
            return;
        }
        if rec.status == Status::SessionEnded {
            self.sessions_ended.inc();
            return;
        }
        if rec.tool.is_empty() || rec.tool == SESSION {
            // Not a call of a tool: a request refused for the session (its
            // caps, another principal's session, an unknown resource).
            if let Some(kind) = refusal_kind(rec.status) {
                self.refusals
                    .get_or_create(&RefusalLabels {
                        reason: kind.to_owned(),
                    })
                    .inc();
            }
            return;
        }
        self.calls
            .get_or_create(&CallLabels {
                tool: tool.clone(),
                profile: if tool == OTHER {
                    String::new()
                } else {
                    rec.profile.clone()
                },
                runtime: rec.runtime.clone(),
                status: rec.status.as_str().to_owned(),
            })
            .inc();
        self.durations
            .get_or_create(&DurationLabels {
                tool,
                phase: "call".into(),
            })
            .observe(rec.duration_ms as f64 / 1000.0);
        if let Some(kind) = refusal_kind(rec.status) {
            self.refusals
                .get_or_create(&RefusalLabels {
                    reason: kind.to_owned(),
                })
                .inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_calls_and_bounds_tool_labels() {
        let m = Metrics::new(["echo".to_string()]);
        let mut ok = AuditRecord::new("echo", "P1");
        ok.runtime = "process".into();
        m.recorded(&ok);
        let mut unknown = AuditRecord::new("$(rm -rf)", "");
        unknown.runtime = "none".into();
        unknown.status = Status::Denied;
        m.recorded(&unknown);
        m.count_sessions_with(std::sync::Arc::new(|| 2));
        let out = m.render();
        assert!(
            out.contains(
                r#"cordon_calls_total{tool="echo",profile="P1",runtime="process",status="ok"} 1"#
            ),
            "{out}"
        );
        assert!(!out.contains("rm -rf"), "{out}");
        assert!(
            out.contains(r#"cordon_refusals_total{reason="denied"} 1"#),
            "{out}"
        );
        assert!(out.contains("cordon_sessions 2"), "{out}");
        assert!(out.ends_with("# EOF\n"), "{out}");
    }
}
