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
struct PoolLabels {
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
    // 100 µs .. ~52 s: a phase (the gate, an admission) takes well under
    // a millisecond.
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

/// The metrics of one gateway.
pub struct Metrics {
    registry: Registry,
    /// Tool names the manifest declares (the only tool label values; a
    /// reload adds the tools it adds).
    tools: std::sync::RwLock<BTreeSet<String>>,
    calls: Family<CallLabels, Counter>,
    durations: Family<DurationLabels, Histogram, fn() -> Histogram>,
    refusals: Family<RefusalLabels, Counter>,
    egress: Family<EgressLabels, Counter>,
    credentials: Family<CredentialLabels, Counter>,
    pools: Family<PoolLabels, Counter>,
    sessions_ended: Counter,
    sessions: Gauge,
    sandboxes: Gauge,
    probes: Family<ProbeLabels, Gauge>,
    last_proved: Family<ToolLabel, Gauge<f64, AtomicU64>>,
    in_service: Family<ToolLabel, Gauge>,
    /// Counts the live sessions when the metrics are rendered (set by the
    /// transport).
    live_sessions: std::sync::RwLock<Option<SessionCount>>,
    /// Each tool's last proof: its verdict and when it was proved (for
    /// the console).
    proofs: std::sync::RwLock<std::collections::BTreeMap<String, Proof>>,
}

/// A tool's last proof: its verdict and when it last passed (Unix time).
pub(crate) type Proof = (String, Option<f64>);

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
            "Duration of tool calls by tool and phase: `call` (the whole call, as audited), and where measured `admission` (checks before a sandbox is asked for), `start` (getting a sandbox), `run` (the tool until its result), `gate` (the output gate)",
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
        let pools = Family::<PoolLabels, Counter>::default();
        registry.register(
            "pool_events",
            "Warm servers by tool and event: ready, handed_over, discarded, failed",
            pools.clone(),
        );
        let sessions_ended = Counter::default();
        registry.register(
            "sessions_ended",
            "Sessions the gateway ended and audited so (idle for their timeout, client gone, deleted)",
            sessions_ended.clone(),
        );
        let sessions = Gauge::default();
        registry.register("sessions", "Live MCP sessions", sessions.clone());
        let sandboxes = Gauge::default();
        registry.register(
            "sandboxes",
            "Live sandboxes in use: MCP servers running and command calls running in theirs",
            sandboxes.clone(),
        );
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
        let in_service = Family::<ToolLabel, Gauge>::default();
        registry.register(
            "tool_in_service",
            "1 while a served tool is in service, 0 once a probe run of it did not hold (until one holds again)",
            in_service.clone(),
        );
        Metrics {
            in_service,
            registry,
            tools: std::sync::RwLock::new(tools.into_iter().collect()),
            calls,
            durations,
            refusals,
            egress,
            credentials,
            pools,
            sessions_ended,
            sessions,
            sandboxes,
            probes,
            last_proved,
            live_sessions: std::sync::RwLock::new(None),
            proofs: std::sync::RwLock::new(std::collections::BTreeMap::new()),
        }
    }

    /// Count the live sessions with `f` when rendering.
    pub(crate) fn count_sessions_with(&self, f: SessionCount) {
        if let Ok(mut s) = self.live_sessions.write() {
            *s = Some(f);
        }
    }

    /// One live sandbox, counted until the guard is dropped.
    pub(crate) fn sandbox(&self) -> LiveSandbox {
        self.sandboxes.inc();
        LiveSandbox(self.sandboxes.clone())
    }

    /// The tool label of `name`: itself when the manifest declares it.
    fn tool(&self, name: &str) -> String {
        if self.tools.read().is_ok_and(|t| t.contains(name)) {
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
        if let Ok(mut p) = self.proofs.write() {
            let at = proved_at.or_else(|| p.get(tool).and_then(|(_, at)| *at));
            p.insert(tool.to_owned(), (verdict.to_owned(), at));
        }
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

    /// Tools a reload of the manifest added: label values from now on.
    pub(crate) fn add_tools(&self, names: impl IntoIterator<Item = String>) {
        if let Ok(mut t) = self.tools.write() {
            t.extend(names);
        }
    }

    /// Whether `tool` (a served tool) is in service.
    pub fn in_service(&self, tool: &str, yes: bool) {
        self.in_service
            .get_or_create(&ToolLabel {
                tool: tool.to_owned(),
            })
            .set(i64::from(yes));
    }

    /// Each tool's last proof.
    pub(crate) fn proofs(&self) -> std::collections::BTreeMap<String, Proof> {
        self.proofs.read().map(|p| p.clone()).unwrap_or_default()
    }

    /// The live sessions now.
    pub(crate) fn live_sessions(&self) -> usize {
        self.live_sessions
            .read()
            .ok()
            .and_then(|f| f.as_ref().map(|f| f()))
            .unwrap_or(0)
    }

    /// The live sandboxes now.
    pub(crate) fn live_sandboxes(&self) -> i64 {
        self.sandboxes.get()
    }

    /// The metrics in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let live = self.live_sessions();
        self.sessions.set(i64::try_from(live).unwrap_or(i64::MAX));
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            // Writing into a String does not fail; say it if it ever does.
            tracing::warn!("rendering the metrics: {e}");
        }
        out
    }
}

/// A live sandbox, counted in `cordon_sandboxes` until dropped.
#[derive(Debug)]
pub(crate) struct LiveSandbox(Gauge);

impl Drop for LiveSandbox {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// `GET /metrics` answered with [`Metrics::render`], with nothing in front
/// of it (the caller adds its authentication layer, if any).
pub(crate) fn router(metrics: std::sync::Arc<Metrics>) -> axum::Router {
    axum::Router::new().route(
        METRICS_PATH,
        axum::routing::get(move || {
            let body = metrics.render();
            async move { ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], body) }
        }),
    )
}

/// A [`ServerSandbox`](crate::ServerSandbox) whose servers each count as
/// a live sandbox until stopped or gone.
pub(crate) struct MeteredServers {
    pub(crate) inner: std::sync::Arc<dyn crate::ServerSandbox>,
    pub(crate) metrics: std::sync::Arc<Metrics>,
}

impl crate::ServerSandbox for MeteredServers {
    fn start(
        &self,
        who: &cordon_broker::Caller,
        policy: &cordon_policy::ToolPolicy,
        argv: &[String],
    ) -> Result<crate::ServerProcess, String> {
        let mut p = self.inner.start(who, policy, argv)?;
        p.handle = std::sync::Arc::new(MeteredHandle {
            inner: p.handle,
            live: std::sync::Mutex::new(Some(self.metrics.sandbox())),
        });
        Ok(p)
    }
}

#[derive(Debug)]
struct MeteredHandle {
    inner: std::sync::Arc<dyn crate::ServerHandle>,
    live: std::sync::Mutex<Option<LiveSandbox>>,
}

impl MeteredHandle {
    fn gone(&self) {
        if let Ok(mut l) = self.live.lock() {
            l.take();
        }
    }
}

impl crate::ServerHandle for MeteredHandle {
    fn kill(&self) {
        self.inner.kill();
        self.gone();
    }

    fn exited(&self) -> Option<String> {
        let e = self.inner.exited();
        if e.is_some() {
            self.gone();
        }
        e
    }

    fn live_tokens(&self) -> cordon_gate::LiveTokens {
        self.inner.live_tokens()
    }

    fn refusals(&self) -> Option<&crate::refusals::Refusals> {
        self.inner.refusals()
    }
}

/// A refusal's kind, from the record's status (`None`: not a refusal).
fn refusal_kind(status: Status) -> Option<&'static str> {
    match status {
        Status::Denied | Status::Refused | Status::Busy | Status::LimitHit => Some(status.as_str()),
        _ => None,
    }
}

/// Whether `rec` is a pool's own record (a warm `mcp:` server made
/// ready, handed to a session, discarded or failed; a command tool's
/// pooled sandbox that failed or was discarded), not a call's: the record
/// of a call that took a command tool's pooled sandbox carries `pool:
/// {event: handed_over}` too, under the caller's client.
pub(crate) fn pool_record(rec: &AuditRecord) -> bool {
    rec.pool
        .as_ref()
        .is_some_and(|p| p.event != "handed_over" || rec.caller == crate::warm::CALLER)
}

/// A pool event's name, when it is one of the pools'.
fn pool_event(e: &str) -> &'static str {
    match e {
        "ready" => "ready",
        "handed_over" => "handed_over",
        "discarded" => "discarded",
        "failed" => "failed",
        _ => "other",
    }
}

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
        if rec.service.is_some() {
            // Taken out of service or returned: `cordon_tool_in_service`.
            return;
        }
        if let Some(p) = &rec.pool {
            self.pools
                .get_or_create(&PoolLabels {
                    tool: tool.clone(),
                    event: pool_event(&p.event).to_owned(),
                })
                .inc();
            // A pool's own record is not a call of its tool; the call
            // that took a command tool's pooled sandbox is.
            if pool_record(rec) {
                return;
            }
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
                tool: tool.clone(),
                phase: "call".into(),
            })
            .observe(rec.duration_ms as f64 / 1000.0);
        for (phase, us) in rec.timings.iter().flat_map(|t| t.phases()) {
            self.durations
                .get_or_create(&DurationLabels {
                    tool: tool.clone(),
                    phase: phase.to_owned(),
                })
                .observe(us as f64 / 1_000_000.0);
        }
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
    use crate::ServerSandbox;

    #[derive(Debug, Default)]
    struct Fake(std::sync::atomic::AtomicBool);

    impl crate::ServerHandle for Fake {
        fn kill(&self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        fn exited(&self) -> Option<String> {
            self.0
                .load(std::sync::atomic::Ordering::SeqCst)
                .then(|| "killed".to_string())
        }
        fn live_tokens(&self) -> cordon_gate::LiveTokens {
            cordon_gate::LiveTokens::default()
        }
        fn refusals(&self) -> Option<&crate::refusals::Refusals> {
            None
        }
    }

    struct Fakes;

    impl crate::ServerSandbox for Fakes {
        fn start(
            &self,
            _: &cordon_broker::Caller,
            _: &cordon_policy::ToolPolicy,
            _: &[String],
        ) -> Result<crate::ServerProcess, String> {
            Ok(crate::ServerProcess {
                reader: Box::new(tokio::io::empty()),
                writer: Box::new(tokio::io::sink()),
                handle: std::sync::Arc::new(Fake::default()),
                warnings: Vec::new(),
            })
        }
    }

    fn live(m: &Metrics) -> String {
        m.render()
            .lines()
            .find(|l| l.starts_with("cordon_sandboxes "))
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn a_server_is_a_live_sandbox_until_killed_or_gone() {
        let m = std::sync::Arc::new(Metrics::new(["srv".to_string()]));
        let servers = MeteredServers {
            inner: std::sync::Arc::new(Fakes),
            metrics: m.clone(),
        };
        let l = cordon_policy::load_str(
            std::path::Path::new("m.yaml"),
            "version: 1\ntools:\n  srv:\n    profile: P1\n    command: [/bin/true]\n",
        )
        .unwrap();
        let p = &l.policy.tools["srv"];
        let who = cordon_broker::Caller {
            session: "s".into(),
            client: "mcp".into(),
            principal: None,
            tenant: "default".into(),
            trace: None,
        };
        assert_eq!(live(&m), "cordon_sandboxes 0");
        let a = servers.start(&who, p, &[]).unwrap();
        let b = servers.start(&who, p, &[]).unwrap();
        assert_eq!(live(&m), "cordon_sandboxes 2");
        // Killed twice, and seen gone: counted down once.
        a.handle.kill();
        a.handle.kill();
        assert!(a.handle.exited().is_some());
        assert_eq!(live(&m), "cordon_sandboxes 1");
        // A command call's sandbox: counted while held.
        let call = m.sandbox();
        assert_eq!(live(&m), "cordon_sandboxes 2");
        drop(call);
        b.handle.kill();
        assert_eq!(live(&m), "cordon_sandboxes 0");
    }

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

    /// Each phase of a record's timings goes into the histogram under its
    /// phase; a record without them counts only as `call`.
    #[test]
    fn phases_are_fed_from_the_records_timings() {
        let m = Metrics::new(["echo".to_string()]);
        let mut ran = AuditRecord::new("echo", "P1");
        ran.timings = Some(cordon_audit::Timings {
            admission_us: Some(50),
            start_us: Some(4_000),
            run_us: Some(1_000),
            gate_us: Some(20),
        });
        m.recorded(&ran);
        let mut refused = AuditRecord::new("echo", "P1");
        refused.status = Status::Denied;
        refused.timings = Some(cordon_audit::Timings {
            admission_us: Some(30),
            ..Default::default()
        });
        m.recorded(&refused);
        m.recorded(&AuditRecord::new("echo", "P1"));
        let out = m.render();
        let count = |phase: &str| {
            let l =
                format!("cordon_call_duration_seconds_count{{tool=\"echo\",phase=\"{phase}\"}} ");
            out.lines()
                .find_map(|x| x.strip_prefix(&l))
                .unwrap_or_else(|| panic!("{l} in {out}"))
                .to_string()
        };
        assert_eq!(count("call"), "3");
        assert_eq!(count("admission"), "2");
        for p in ["start", "run", "gate"] {
            assert_eq!(count(p), "1", "{p}");
        }
    }

    /// A warm pool's records count as pool events, never as calls.
    #[test]
    fn pool_records_are_pool_events_not_calls() {
        let m = Metrics::new(["browser".to_string()]);
        let mut handed = AuditRecord::new("browser", "P3");
        handed.runtime = "gvisor".into();
        handed.caller = crate::warm::CALLER.into();
        handed.pool = Some(cordon_audit::PoolEvent {
            event: "handed_over".into(),
            sandbox: "mcp-warm-1-0".into(),
            pooled: true,
            waited_ms: 5,
        });
        m.recorded(&handed);
        let mut call = AuditRecord::new("browser", "P3");
        call.runtime = "gvisor".into();
        m.recorded(&call);
        let out = m.render();
        assert!(
            out.contains(r#"cordon_pool_events_total{tool="browser",event="handed_over"} 1"#),
            "{out}"
        );
        assert!(
            out.contains(
                r#"cordon_calls_total{tool="browser",profile="P3",runtime="gvisor",status="ok"} 1"#
            ),
            "{out}"
        );
    }

    /// The call that took a command tool's pooled sandbox is a call (and
    /// a hand-over); its pool's failed start is neither.
    #[test]
    fn a_pooled_command_call_counts_as_a_call_once() {
        let m = Metrics::new(["wc".to_string()]);
        let pooled = |event: &str, caller: &str| {
            let mut r = AuditRecord::new("wc", "P1");
            r.runtime = "native".into();
            r.caller = caller.into();
            r.pool = Some(cordon_audit::PoolEvent {
                event: event.into(),
                sandbox: "pool-1-0".into(),
                pooled: true,
                waited_ms: 5,
            });
            r
        };
        m.recorded(&pooled("handed_over", "mcp:client"));
        m.recorded(&pooled("failed", cordon_broker::POOL_CALLER));
        let out = m.render();
        assert!(
            out.contains(
                r#"cordon_calls_total{tool="wc",profile="P1",runtime="native",status="ok"} 1"#
            ),
            "{out}"
        );
        assert!(
            out.contains(r#"cordon_pool_events_total{tool="wc",event="handed_over"} 1"#),
            "{out}"
        );
        assert!(
            out.contains(r#"cordon_pool_events_total{tool="wc",event="failed"} 1"#),
            "{out}"
        );
    }
}
