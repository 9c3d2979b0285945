//! The audit records of a command tool's warm pool (`lifetime: pool`) that
//! no call carries: a pooled sandbox that did not start (`failed`) or
//! ended before a task took it (`discarded`), in the shape of a warm
//! `mcp:` server's (`pool: {event, sandbox, pooled: true, waited_ms}`).
//! The record's session is the sandbox's own id; its caller `pool`.

use std::sync::Arc;

use cordon_audit::{AuditRecord, Auditor, PoolEvent, Status};
use cordon_policy::policy::ToolPolicy;
use cordon_runtime::pool::{Lost, Observer};

/// The caller of a pool's own records.
pub const POOL_CALLER: &str = "pool";

/// What writes the records of `tenant`'s pool of `policy` to `audit`.
pub(crate) fn observer(audit: Arc<Auditor>, policy: &ToolPolicy, tenant: &str) -> Observer {
    let tool = policy.name.clone();
    let profile = crate::profile_name(policy.profile).to_string();
    let runtime = cordon_runtime::kind_name(policy.runtime).to_string();
    let tenant = tenant.to_string();
    Arc::new(move |lost: &Lost| {
        let rec = record(&tool, &profile, &runtime, &tenant, lost);
        // Nothing waits on it: one that cannot be written is counted and
        // said (`cordon doctor`, the next call's warnings).
        let _said = audit.record_after(&rec);
    })
}

fn record(tool: &str, profile: &str, runtime: &str, tenant: &str, lost: &Lost) -> AuditRecord {
    let mut rec = AuditRecord::new(tool, profile);
    rec.runtime = runtime.to_string();
    rec.session = lost.sandbox.clone();
    rec.caller = POOL_CALLER.into();
    rec.tenant = Some(tenant.to_string());
    rec.status = Status::ToolError;
    rec.reason = Some(lost.reason.clone());
    rec.pool = Some(PoolEvent {
        event: lost.event.to_string(),
        sandbox: lost.sandbox.clone(),
        pooled: true,
        waited_ms: lost.waited_ms,
    });
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_start_is_a_pool_record_of_its_sandbox() {
        let lost = Lost {
            event: "failed",
            sandbox: "pool-1-0".into(),
            waited_ms: 0,
            reason: "pooled sandbox pool-1-0 did not start: no such file".into(),
        };
        let rec = record("t", "P1", "native", "default", &lost);
        let v = serde_json::to_value(&rec).unwrap();
        assert_eq!(v["pool"]["event"], "failed", "{v}");
        assert_eq!(v["pool"]["sandbox"], "pool-1-0", "{v}");
        assert_eq!(v["pool"]["pooled"], true, "{v}");
        assert_eq!(v["session"], "pool-1-0", "{v}");
        assert_eq!(v["caller"], "pool", "{v}");
        assert!(
            v["reason"].as_str().unwrap().contains("no such file"),
            "{v}"
        );
    }
}
