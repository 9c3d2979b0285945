//! Which served tools are in service: `cordon serve` proves each tool again
//! while it serves (docs/probes.md, "Continuous conformance"), and a tool
//! whose run does not hold is taken out of service at once: it is left out
//! of `tools/list`, its calls are refused with
//! [`crate::Refusal::OutOfService`] naming the probes and the time, its
//! warm pool's sandboxes are stopped, an audit record is made and
//! `cordon_tool_in_service{tool}` reads 0. It returns to service only when
//! a later run holds (audited too). Each change of what `tools/list`
//! answers (a tool out of service or back, a reload's tools) is told to
//! every live session that was initialized, as
//! `notifications/tools/list_changed` ([`Service::tell_changes`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cordon_broker::Broker;
use serde_json::json;

use crate::render::{Refusal, refusal};

/// Why a tool is out of service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfService {
    /// The probes that did not hold (or what stopped the run).
    pub probes: Vec<String>,
    /// When the run failed (RFC 3339).
    pub at: String,
    /// What the run said, for a person.
    pub why: String,
}

/// The service state of one gateway's tools, shared with whatever runs
/// their probes (obtained with [`crate::Gateway::service`] before the
/// gateway is served).
pub struct Service {
    out: Mutex<BTreeMap<String, OutOfService>>,
    /// Each served tool's profile name (for its audit records); a reload
    /// changes them.
    profiles: std::sync::RwLock<BTreeMap<String, String>>,
    broker: Arc<Broker>,
    metrics: Arc<crate::metrics::Metrics>,
    warm: Arc<crate::warm::WarmPools>,
    /// Counts the changes of the tools listed; each session's watcher
    /// tells its client.
    listing: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("out", &self.out)
            .finish_non_exhaustive()
    }
}

impl Service {
    pub(crate) fn new(
        profiles: BTreeMap<String, String>,
        broker: Arc<Broker>,
        metrics: Arc<crate::metrics::Metrics>,
        warm: Arc<crate::warm::WarmPools>,
    ) -> Service {
        for tool in profiles.keys() {
            metrics.in_service(tool, true);
        }
        Service {
            out: Mutex::new(BTreeMap::new()),
            profiles: std::sync::RwLock::new(profiles),
            broker,
            metrics,
            warm,
            listing: tokio::sync::watch::Sender::new(0),
        }
    }

    /// The tools listed changed (in service or not, a reload's): every
    /// session watching is told.
    pub(crate) fn tools_changed(&self) {
        self.listing.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Tell `peer` `notifications/tools/list_changed` at each change of
    /// the tools listed from now on (changes close together may be told
    /// once), until its transport closes or the task is aborted (the
    /// session ends). Within a tokio runtime.
    pub(crate) fn tell_changes(
        &self,
        peer: rmcp::Peer<rmcp::RoleServer>,
    ) -> tokio::task::AbortHandle {
        let mut changes = self.listing.subscribe();
        changes.mark_unchanged();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                if peer.notify_tool_list_changed().await.is_err() {
                    break;
                }
            }
        })
        .abort_handle()
    }

    /// The tools served (in service or not).
    pub fn tools(&self) -> Vec<String> {
        self.profiles
            .read()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn profile(&self, tool: &str) -> Option<String> {
        self.profiles.read().ok()?.get(tool).cloned()
    }

    /// A reload served `tool` anew (added, or changed and proved): in
    /// service, under `profile`.
    pub(crate) fn serve(&self, tool: &str, profile: &str) {
        if let Ok(mut p) = self.profiles.write() {
            p.insert(tool.to_string(), profile.to_string());
        }
        if let Ok(mut o) = self.out.lock() {
            o.remove(tool);
        }
        self.warm.resume(tool);
        self.metrics.in_service(tool, true);
    }

    /// A reload removed `tool`: no longer served.
    pub(crate) fn remove(&self, tool: &str) {
        if let Ok(mut p) = self.profiles.write() {
            p.remove(tool);
        }
        if let Ok(mut o) = self.out.lock() {
            o.remove(tool);
        }
        self.metrics.in_service(tool, false);
    }

    /// Why `tool` is out of service; `None` while it is in service.
    pub fn out_of_service(&self, tool: &str) -> Option<OutOfService> {
        self.out.lock().ok().and_then(|o| o.get(tool).cloned())
    }

    /// Take `tool` out of service (a probe run of `trigger` did not
    /// hold): its calls are refused from now on, its warm sandboxes are
    /// stopped, and the change is audited and counted. A tool already out
    /// of service is audited once: a later failed run only changes what
    /// its refusals say.
    pub fn take_out(&self, tool: &str, trigger: &str, why: OutOfService) {
        let Some(profile) = self.profile(tool) else {
            return;
        };
        self.metrics.in_service(tool, false);
        // Refused from here on; the record follows (nothing waits on it).
        let first = match self.out.lock() {
            Ok(mut o) => {
                let first = !o.contains_key(tool);
                o.insert(tool.to_string(), why.clone());
                first
            }
            Err(_) => return,
        };
        self.warm.suspend(tool);
        if first {
            let mut rec = cordon_audit::AuditRecord::new(tool, &profile);
            rec.runtime = "probe".into();
            rec.caller = "conformance".into();
            rec.status = cordon_audit::Status::Denied;
            rec.reason = Some(format!(
                "taken out of service: its probe run ({trigger}) at {} did not hold: {}",
                why.at, why.why
            ));
            rec.service = Some(cordon_audit::ServiceEvent {
                event: "out_of_service".into(),
                probes: why.probes,
                trigger: trigger.into(),
            });
            self.broker.record_after(&rec);
            // No longer listed.
            self.tools_changed();
        }
    }

    /// A probe run of `tool` held at `at_unix` (Unix time): it is (back)
    /// in service; a return is audited.
    pub fn held(&self, tool: &str, trigger: &str, at_unix: f64) {
        let Some(profile) = self.profile(tool) else {
            return;
        };
        self.metrics.probed(tool, "held", Some(at_unix));
        // Recorded and counted before its calls are served again.
        let was = self.out_of_service(tool);
        if let Some(was) = &was {
            let mut rec = cordon_audit::AuditRecord::new(tool, &profile);
            rec.runtime = "probe".into();
            rec.caller = "conformance".into();
            rec.status = cordon_audit::Status::Ok;
            rec.reason = Some(format!(
                "returned to service: its probe run ({trigger}) held (out of service since {})",
                was.at
            ));
            rec.service = Some(cordon_audit::ServiceEvent {
                event: "in_service".into(),
                probes: Vec::new(),
                trigger: trigger.into(),
            });
            self.broker.record_after(&rec);
        }
        self.metrics.in_service(tool, true);
        if let Ok(mut o) = self.out.lock() {
            o.remove(tool);
        }
        self.warm.resume(tool);
        if was.is_some() {
            // Listed again.
            self.tools_changed();
        }
    }

    /// The refusal of a call of `tool` while it is out of service.
    pub(crate) fn refusal(&self, tool: &str, called: &str) -> Option<rmcp::ErrorData> {
        let o = self.out_of_service(tool)?;
        Some(refusal(
            Refusal::OutOfService,
            format!(
                "`{called}` is out of service: the probe run of `{tool}` at {} did not hold ({}): {}; it returns to service when a later run holds",
                o.at,
                o.probes.join(", "),
                o.why
            ),
            json!({"tool": tool, "probes": o.probes, "failed_at": o.at}),
        ))
    }
}
