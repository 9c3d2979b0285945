//! Audit records of calls the broker did not run: refused before they
//! reached it, or forwarded to a sandboxed MCP server.

use cordon_broker::{Broker, Caller};
use rmcp::ErrorData;
use rmcp::model::CallToolResult;
use serde_json::json;

use crate::render::{Refusal, refusal};

/// An audit record for a call the broker did not run: refused before it
/// reached the broker, or forwarded to a sandboxed MCP server.
pub(crate) struct CallAudit {
    pub tool: String,
    pub profile: String,
    pub runtime: &'static str,
    pub input: Vec<u8>,
    /// Keep the input's text in the record (a resource read's URI), not
    /// only its size and hash.
    pub record_input: bool,
    pub started: std::time::Instant,
    /// Mechanisms of the sandbox not fully enforced.
    pub warnings: Vec<String>,
    /// What the output gate replaced in the result, when it replaced
    /// something.
    pub gate: Option<cordon_audit::GateSummary>,
    /// The phases of the call measured so far (the admission is counted
    /// from `started` when nothing else measured it).
    pub timings: cordon_audit::Timings,
    /// A tool call: one refused before anything else was measured counts
    /// its time as admission.
    pub(crate) is_call: bool,
}

/// What the secret scans replaced in a gated result, from its `_meta`
/// (`cordon/tokens_replaced`, `cordon/secrets_redacted`); `None` when
/// nothing was.
fn secrets_found(
    meta: &rmcp::model::MetaObject,
) -> Option<(Vec<String>, std::collections::BTreeMap<String, u64>)> {
    let tokens: Vec<String> = meta
        .get("cordon/tokens_replaced")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    let redacted: std::collections::BTreeMap<String, u64> = meta
        .get("cordon/secrets_redacted")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    (!tokens.is_empty() || !redacted.is_empty()).then_some((tokens, redacted))
}

impl CallAudit {
    pub(crate) fn new(
        tool: &str,
        profile: &str,
        runtime: &'static str,
        args: Option<&rmcp::model::JsonObject>,
    ) -> CallAudit {
        CallAudit {
            is_call: true,
            ..CallAudit::with_input(
                tool,
                profile,
                runtime,
                args.map(|a| serde_json::to_vec(a).unwrap_or_default())
                    .unwrap_or_default(),
            )
        }
    }

    pub(crate) fn with_input(
        tool: &str,
        profile: &str,
        runtime: &'static str,
        input: Vec<u8>,
    ) -> CallAudit {
        CallAudit {
            tool: tool.to_owned(),
            profile: profile.to_owned(),
            runtime,
            input,
            record_input: false,
            started: std::time::Instant::now(),
            warnings: Vec::new(),
            gate: None,
            timings: cordon_audit::Timings::default(),
            is_call: false,
        }
    }

    /// The call arrived at `started`, before this record was begun.
    pub(crate) fn since(mut self, started: std::time::Instant) -> CallAudit {
        self.started = started;
        self
    }

    /// Keep the input's text in the record.
    pub(crate) fn recording_input(mut self) -> CallAudit {
        self.record_input = true;
        self
    }

    /// Write the record for `result`; `Err` (the result must then be
    /// withheld) when it could not be written and the log is fail-closed.
    pub(crate) fn finish(
        mut self,
        broker: &Broker,
        who: &Caller,
        result: &Result<CallToolResult, ErrorData>,
    ) -> Result<(), ErrorData> {
        let found = result
            .as_ref()
            .ok()
            .and_then(|r| r.meta.as_ref())
            .and_then(secrets_found);
        if let Some((tokens, redacted)) = &found {
            self.warnings
                .extend(cordon_gate::secret_warnings(tokens, redacted));
        }
        self.gate = found.map(
            |(tokens_replaced, secrets_redacted)| cordon_audit::GateSummary {
                kind: "text".into(),
                tokens_replaced,
                secrets_redacted,
                ..Default::default()
            },
        );
        let outcome = result.as_ref().map(|r| {
            let text: String = r
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
                .collect();
            (text, r.is_error == Some(true))
        });
        self.finish_with(broker, who, outcome)
    }

    /// Write the record for an outcome: the text that went back and
    /// whether it was an error result, or the MCP error.
    pub(crate) fn finish_with(
        self,
        broker: &Broker,
        who: &Caller,
        outcome: Result<(String, bool), &ErrorData>,
    ) -> Result<(), ErrorData> {
        use cordon_audit::{AuditRecord, Payload, Status as A};
        let mut rec = AuditRecord::new(&self.tool, &self.profile);
        rec.runtime = self.runtime.into();
        rec.session = who.session.clone();
        rec.caller = who.client.clone();
        rec.principal = who.principal.clone();
        rec.tenant = Some(who.tenant.clone());
        rec.trace = who.trace.clone();
        rec.input = Payload::of(&self.input, self.record_input);
        rec.warnings = self.warnings;
        rec.gate = self.gate;
        match outcome {
            Ok((text, is_error)) => {
                rec.output = Payload::of(text.as_bytes(), false);
                rec.status = if is_error { A::ToolError } else { A::Ok };
            }
            Err(e) => {
                let status = e
                    .data
                    .as_ref()
                    .and_then(|d| d.get("cordon/status"))
                    .and_then(|s| s.as_str())
                    .unwrap_or("");
                rec.status = match status {
                    "unknown_tool"
                    | "invalid_arguments"
                    | "policy_refused"
                    | "description_changed"
                    | "name_refused"
                    | "unknown_prompt"
                    | "unknown_resource"
                    | "ambiguous_resource"
                    | "not_offered"
                    | "not_granted"
                    | "session_refused"
                    | "out_of_service" => A::Denied,
                    "limit_hit" => A::LimitHit,
                    "busy" | "rate_limited" | "too_many_sessions" => A::Busy,
                    "gate_refused" => A::Refused,
                    "server_error" => A::ToolError,
                    _ => A::Error,
                };
                if let Some(l) = e
                    .data
                    .as_ref()
                    .and_then(|d| d.get("limit"))
                    .and_then(|s| s.as_str())
                {
                    rec.limits_hit.push(l.to_owned());
                }
                rec.reason = Some(e.message.to_string());
            }
        }
        let mut timings = self.timings;
        if self.is_call && timings.is_empty() && rec.status != A::Ok {
            // Ended before anything else was measured: all admission.
            timings.admission_us = Some(cordon_audit::Timings::us(self.started.elapsed()));
        }
        rec.timings = Some(timings).filter(|t| !t.is_empty());
        rec.duration_ms = self.started.elapsed().as_millis() as u64;
        broker.record(&rec).map_err(|e| {
            refusal(
                Refusal::AuditFailed,
                e.to_string(),
                json!({"tool": self.tool}),
            )
        })
    }
}
