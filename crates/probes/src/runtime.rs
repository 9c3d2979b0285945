//! A runtime as a probe target: the agent is bound read-only at
//! `/.cordon/agent` and run as the program of a tool's own sandbox
//! specification, through the same runtime (and egress doors) the tool
//! gets.
//!
//! In an image root ([`Root::Image`]) the host's libraries are not there.
//! A static agent runs as it is; a dynamically linked one gets its ELF
//! loader and the shared libraries it needs (found on the host as the
//! loader would find them) bound read-only, one file each, under
//! [`AGENT_LIB_DIR`], and is run through that loader:
//! `/.cordon/lib/ld-linux-x86-64.so.2 --library-path /.cordon/lib
//! /.cordon/agent __probe-agent ...`. Nothing else of the host is added,
//! and the image's own files are not touched. The agent, seeing itself run
//! by a loader, starts its helpers the same way.

use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::thread;

use cordon_runtime::{Context, Mount, Outcome, Root, Runtime, SandboxSpec, Status};

use crate::sandbox::{Capture, LimitKind, ProbeRun, RunResult, RunStatus, Sandbox, SandboxError};
use crate::suite::{Limits, Profile};

/// Where the agent appears inside the sandbox.
pub const AGENT_IN_JAIL: &str = "/.cordon/agent";

/// Where a dynamically linked agent's loader and libraries appear inside
/// an image root.
pub const AGENT_LIB_DIR: &str = "/.cordon/lib";

/// A runtime running the probe agent in sandboxes shaped like `base`.
///
/// The runtime builds the tool's environment from the spec alone, so the
/// harness's environment canary (set on the launcher of other sandboxes)
/// cannot be planted here; the env probe still checks every variable the
/// spec gives the tool.
#[derive(Clone)]
pub struct RuntimeSandbox {
    runtime: Arc<dyn Runtime>,
    base: SandboxSpec,
    /// Mechanisms not fully enforced, for the sandbox's name.
    degraded: Vec<String>,
}

impl std::fmt::Debug for RuntimeSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeSandbox")
            .field("runtime", &self.runtime.name())
            .field("base", &self.base)
            .finish()
    }
}

impl RuntimeSandbox {
    /// Probe `runtime` with sandboxes shaped like `base` (root, limits,
    /// network, seccomp, mounts, environment); argv is replaced by the
    /// agent's.
    pub fn new(runtime: Arc<dyn Runtime>, base: SandboxSpec) -> Self {
        let degraded = runtime
            .check(&base)
            .mechanisms
            .iter()
            .filter(|m| !m.is_enforced())
            .map(|m| m.to_string())
            .collect();
        RuntimeSandbox {
            runtime,
            base,
            degraded,
        }
    }

    /// The profile this sandbox claims: the spec's limits and egress.
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
            mounts: self.base.mounts.iter().map(|m| m.dst.clone()).collect(),
        }
    }

    /// The sandbox for one run of the agent: the base spec running the
    /// agent (through its own loader in an image root, see the module
    /// docs).
    fn spec_for(&self, req: &ProbeRun) -> Result<SandboxSpec, SandboxError> {
        let mut spec = self.base.clone();
        spec.mounts.push(Mount {
            src: req.agent.clone(),
            dst: PathBuf::from(AGENT_IN_JAIL),
            writable: false,
        });
        let mut argv = Vec::new();
        if let Root::Image { .. } = spec.root {
            let c = crate::elf::closure(&req.agent).map_err(|e| {
                SandboxError::Backend(format!("the probe agent in an image root: {e}"))
            })?;
            if let Some(loader) = c.loader {
                let name = loader
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .ok_or_else(|| {
                        SandboxError::Backend(format!(
                            "the probe agent's loader {} has no file name",
                            loader.display()
                        ))
                    })?;
                let inside = format!("{AGENT_LIB_DIR}/{name}");
                spec.mounts.push(Mount {
                    src: loader,
                    dst: PathBuf::from(&inside),
                    writable: false,
                });
                for (lib, host) in c.libs {
                    spec.mounts.push(Mount {
                        src: host,
                        dst: PathBuf::from(format!("{AGENT_LIB_DIR}/{lib}")),
                        writable: false,
                    });
                }
                argv.extend([inside, "--library-path".into(), AGENT_LIB_DIR.into()]);
            }
        }
        argv.push(AGENT_IN_JAIL.to_string());
        argv.extend(req.args.iter().cloned());
        spec.argv = argv;
        Ok(spec)
    }
}

/// A runtime outcome as a probe run result.
pub fn run_result(o: &Outcome) -> RunResult {
    let status = match o.status {
        Status::Ok | Status::Exited | Status::Killed if o.signal.is_some() => RunStatus::Signaled,
        Status::Ok | Status::Exited | Status::Killed => RunStatus::Exited,
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

impl Sandbox for RuntimeSandbox {
    fn name(&self) -> String {
        format!(
            "cordon {} runtime (seccomp {:?}, network {}{})",
            self.runtime.name(),
            self.base.seccomp,
            if self.base.egress().is_some() {
                "egress doors"
            } else {
                "none"
            },
            if self.degraded.is_empty() {
                String::new()
            } else {
                format!("; not fully enforced: {}", self.degraded.join("; "))
            }
        )
    }

    fn answered_by(&self, probe: &str) -> Option<String> {
        if self.runtime.name() != "gvisor" {
            return None;
        }
        let doors = self.base.egress().is_some();
        Some(match probe {
            // With doors the Sentry's sockets are host sockets in the
            // sandbox's own network namespace; without, gVisor's netstack.
            "network" | "metadata" | "host_loopback" | "private" | "egress" | "dns" if doors => {
                "answered by the host kernel in the sandbox's own network namespace, through gVisor's Sentry (--network=host: only the doors are there)".into()
            }
            "network" | "metadata" | "host_loopback" | "private" | "egress" | "dns" => {
                "answered by gVisor's own network stack (--network=none: a loopback only)".into()
            }
            "io_uring" => "answered inside gVisor: the Sentry applies cordon's filter (EPERM), and gVisor has no io_uring of the host's to reach".into(),
            "host_fs" | "processes" | "uid" | "caps" | "mount" | "userns" | "ptrace"
            | "raw_socket" | "keyctl" | "bpf" | "no_new_privs" | "tty" | "fds" => {
                "answered by gVisor's Sentry, its own kernel: the call never reaches the host's".into()
            }
            "memory" | "fork" | "time" | "output" => {
                "limit of the whole gVisor sandbox (Sentry, gofer and stubs in one cgroup slot, or the broker's clock and caps)".into()
            }
            _ => return None,
        })
    }

    fn run(&self, req: &ProbeRun) -> Result<RunResult, SandboxError> {
        let spec = self.spec_for(req)?;
        let rt = self.runtime.clone();
        let stdin = req.stdin.clone();
        let (tx, rx) = mpsc::channel();
        // The runtime enforces its own wall clock; the harness's bound is
        // outside it, for a sandbox that hangs.
        thread::spawn(move || {
            let _ = tx.send(rt.run(&spec, stdin, &Context::discard("probe")));
        });
        match rx.recv_timeout(req.timeout) {
            Ok(Ok(o)) => Ok(run_result(&o)),
            Ok(Err(e)) => Err(SandboxError::Backend(e.to_string())),
            Err(_) => Ok(RunResult {
                exit_code: None,
                signal: None,
                status: RunStatus::HarnessTimeout,
                reason: Some(format!(
                    "the sandbox did not return within {:.1} s",
                    req.timeout.as_secs_f64()
                )),
                duration: req.timeout,
                stdout: Capture::default(),
                stderr: Capture::default(),
            }),
        }
    }
}
