//! The manifest's command tools: the MCP tool each is listed as, and a call
//! of one through the broker.

use std::sync::Arc;

use cordon_broker::{Admitted, Broker, CallError, Caller, Status};
use cordon_policy::policy::ToolPolicy;
use rmcp::ErrorData;
use rmcp::model::{CallToolResult, Tool};
use serde_json::json;

use crate::args::{self, ArgError, ArgMapper};
use crate::audit::CallAudit;
use crate::render::{self, Refusal, refusal};

/// A command tool as served: its policy, admitted once at start, how its
/// arguments map onto stdin and argv, and the MCP tool it is listed as.
pub(crate) struct CommandTool {
    pub(crate) policy: Arc<ToolPolicy>,
    /// Admitted once, at start.
    pub(crate) admitted: Admitted,
    pub(crate) args: ArgMapper,
    pub(crate) tool: Tool,
}

impl CommandTool {
    /// A command tool served with the policy `p`, admitted as `admitted`:
    /// its arguments' schema the manifest's `input_schema`, else the one
    /// the program declares (a Wasm component's typed function).
    pub(crate) fn new(p: &ToolPolicy, admitted: Admitted) -> Result<CommandTool, String> {
        let mut p = p.clone();
        if p.input_schema.is_none() {
            p.input_schema = admitted.input_schema.clone();
        }
        Ok(CommandTool {
            args: ArgMapper::new(&p)?,
            tool: command_tool(&p),
            policy: Arc::new(p),
            admitted,
        })
    }
}

/// The MCP tool a command tool is listed as: its name, description and
/// schemas from the manifest, its profile and `untrusted` in `_meta`.
pub(crate) fn command_tool(p: &ToolPolicy) -> Tool {
    let mut t = Tool::new(
        p.name.clone(),
        p.description.clone(),
        Arc::new(args::advertised_schema(p)),
    );
    if let Some(serde_json::Value::Object(o)) = &p.output_schema {
        t = t.with_raw_output_schema(Arc::new(o.clone()));
    }
    let mut meta = rmcp::model::MetaObject::default();
    meta.insert(
        "cordon/profile".into(),
        json!(cordon_broker::profile_name(p.profile)),
    );
    meta.insert("cordon/trust".into(), json!("untrusted"));
    t.with_meta(meta)
}

/// Call a command tool through the broker: its arguments mapped (a refusal audited here),
/// the admitted sandbox run, and its outcome rendered as an MCP result or refusal.
pub(crate) async fn call(
    broker: &Arc<Broker>,
    t: &CommandTool,
    args: Option<&rmcp::model::JsonObject>,
    who: Caller,
    metrics: &crate::metrics::Metrics,
    since: std::time::Instant,
) -> Result<CallToolResult, ErrorData> {
    let prepared = match t.args.prepare(args) {
        Ok(p) => p,
        Err(e) => {
            let path = match &e {
                ArgError::Schema { path, .. } => json!(path),
                _ => serde_json::Value::Null,
            };
            let err = refusal(
                Refusal::InvalidArguments,
                e.to_string(),
                json!({"tool": t.policy.name, "path": path}),
            );
            let profile = cordon_broker::profile_name(t.policy.profile);
            let r = Err(err);
            CallAudit::new(&t.policy.name, profile, "native", args)
                .since(since)
                .finish(broker, &who, &r)?;
            return r;
        }
    };
    let policy = t.policy.clone();
    let mut admitted = t.admitted.clone();
    admitted.spec.argv.extend(prepared.argv);
    let broker = broker.clone();
    let pol = policy.clone();
    let live = metrics.sandbox();
    let ran = tokio::task::spawn_blocking(move || {
        let _live = live;
        broker.call_admitted_since(&who, &pol, Ok(admitted), prepared.stdin, since)
    })
    .await
    .map_err(|e| {
        refusal(
            Refusal::SandboxFailed,
            format!("{}: the call did not complete: {e}", policy.name),
            json!({"tool": policy.name}),
        )
    })?;
    let name = &policy.name;
    let profile = cordon_broker::profile_name(policy.profile);
    let r = match ran {
        Ok(r) => r,
        Err(CallError::Refused(msg)) => {
            return Err(refusal(Refusal::PolicyRefused, msg, json!({"tool": name})));
        }
        Err(e @ (CallError::Setup(_) | CallError::Audit(_))) => {
            return Err(refusal(
                Refusal::SandboxFailed,
                e.to_string(),
                json!({"tool": name}),
            ));
        }
    };
    let o = &r.outcome;
    let limit = cordon_broker::limit_hit(o.status);
    if let Some(limit) = limit {
        return Err(refusal(
            Refusal::LimitHit,
            o.reason.clone(),
            json!({"tool": name, "limit": limit}),
        ));
    }
    if matches!(o.status, Status::Exited | Status::Killed) {
        let mut msg = o.reason.clone().into_bytes();
        // A typed function's error is a value of its own (its `result`'s
        // error, as JSON on stdout): the answer, through the same gate
        // path as the message.
        if policy.input.json && o.status == Status::Exited && !o.stdout.is_empty() {
            msg.extend_from_slice(b"\n");
            msg.extend_from_slice(o.stdout.trim_ascii_end());
        }
        let stderr = String::from_utf8_lossy(&o.stderr);
        if !stderr.trim().is_empty() {
            msg.extend_from_slice(b"\n");
            msg.extend_from_slice(stderr.trim_end().as_bytes());
        }
        return Ok(render::with_warnings(
            render::tool_error(name, profile, &msg),
            &o.warnings,
        ));
    }
    match &r.gated {
        Some(Ok(g)) => Ok(render::with_warnings(render::success(g), &o.warnings)),
        Some(Err(refused)) => Err(refusal(
            Refusal::GateRefused,
            format!("{name}: {refused}"),
            json!({"tool": name, "code": refused.code()}),
        )),
        None => Err(refusal(
            Refusal::GateRefused,
            format!("{name}: no gated output"),
            json!({"tool": name}),
        )),
    }
}
