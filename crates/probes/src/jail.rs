//! The native jail as a probe target: the agent is bound read-only at
//! `/.cordon/agent` and run as the tool of a [`JailSpec`].

use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::thread;

use cordon_jail::{Bind, Jail, JailError, JailSpec, Outcome, Status, Stdin};

use crate::sandbox::{Capture, LimitKind, ProbeRun, RunResult, RunStatus, Sandbox, SandboxError};
use crate::suite::{Limits, Profile};

/// Where the agent appears inside the jail.
pub const AGENT_IN_JAIL: &str = "/.cordon/agent";

/// The native P1 jail running the probe agent.
///
/// The jail builds the tool's environment from the spec alone, so the
/// harness's environment canary (set on the launcher of other sandboxes)
/// cannot be planted here; the env probe still checks every variable the
/// spec gives the tool.
#[derive(Debug, Clone)]
pub struct JailSandbox {
    jail: Arc<Jail>,
    base: JailSpec,
}

impl JailSandbox {
    /// Probe `jail` with calls shaped like `base` (limits, network,
    /// seccomp, binds, environment); argv is replaced by the agent's.
    pub fn new(jail: Arc<Jail>, base: JailSpec) -> Self {
        JailSandbox { jail, base }
    }

    /// A fresh jail with the default P1 spec.
    pub fn with_defaults() -> Result<Self, JailError> {
        Ok(JailSandbox::new(
            Arc::new(Jail::new()?),
            JailSpec::new("cordon-probe", [AGENT_IN_JAIL]),
        ))
    }

    /// The profile this sandbox claims: the spec's limits.
    pub fn profile(&self, name: &str) -> Profile {
        let l = &self.base.limits;
        Profile {
            name: name.to_string(),
            limits: Limits {
                memory_bytes: Some(l.memory_bytes),
                tasks: Some(l.tasks),
                wall: Some(l.wall),
                output_bytes: Some(l.output_bytes),
                disk_bytes: Some(l.disk_bytes),
                fds: Some(l.nofile),
            },
            egress_allow: Vec::new(),
        }
    }

    fn spec_for(&self, req: &ProbeRun) -> JailSpec {
        let mut spec = self.base.clone();
        spec.argv = std::iter::once(AGENT_IN_JAIL.to_string())
            .chain(req.args.iter().cloned())
            .collect();
        spec.binds.push(Bind {
            src: req.agent.clone(),
            dst: PathBuf::from(AGENT_IN_JAIL),
        });
        spec
    }
}

/// A jail outcome as a probe run result.
pub fn run_result(o: &Outcome) -> RunResult {
    let status = match o.status {
        Status::Ok | Status::Exited if o.signal.is_some() => RunStatus::Signaled,
        Status::Ok | Status::Exited => RunStatus::Exited,
        Status::TimedOut => RunStatus::Limit(LimitKind::Wall),
        Status::MemoryLimit => RunStatus::Limit(LimitKind::Memory),
        Status::TaskLimit => RunStatus::Limit(LimitKind::Tasks),
        Status::OutputCap => RunStatus::Limit(LimitKind::Output),
    };
    let mut reason = o.reason.clone();
    if !o.warnings.is_empty() {
        reason.push_str(&format!(" [warnings: {}]", o.warnings.join("; ")));
    }
    RunResult {
        exit_code: o.exit_code,
        signal: o.signal,
        status,
        reason: (!reason.is_empty()).then_some(reason),
        duration: o.duration,
        stdout: Capture::from_bytes(&o.stdout, o.output_bytes),
        stderr: Capture::from_bytes(&o.stderr, o.stderr_total),
    }
}

impl Sandbox for JailSandbox {
    fn name(&self) -> String {
        format!(
            "cordon jail ({}, seccomp {:?}, landlock {})",
            if self.jail.uses_cgroups() {
                "cgroups"
            } else {
                "rlimits"
            },
            self.base.seccomp,
            self.base.landlock
        )
    }

    fn run(&self, req: &ProbeRun) -> Result<RunResult, SandboxError> {
        let spec = self.spec_for(req);
        let jail = self.jail.clone();
        let stdin = req.stdin.clone();
        let (tx, rx) = mpsc::channel();
        // The jail enforces its own wall clock; the harness's bound is
        // outside it, for a jail that hangs.
        thread::spawn(move || {
            let _ = tx.send(jail.run(&spec, Stdin::Bytes(stdin)));
        });
        match rx.recv_timeout(req.timeout) {
            Ok(Ok(o)) => Ok(run_result(&o)),
            Ok(Err(e)) => Err(SandboxError::Backend(e.to_string())),
            Err(_) => Ok(RunResult {
                exit_code: None,
                signal: None,
                status: RunStatus::HarnessTimeout,
                reason: Some(format!(
                    "the jail did not return within {:.1} s",
                    req.timeout.as_secs_f64()
                )),
                duration: req.timeout,
                stdout: Capture::default(),
                stderr: Capture::default(),
            }),
        }
    }
}
