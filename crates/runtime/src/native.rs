//! The native runtime: cordon's own jail (namespaces, a read-only root of
//! host binds or of an unpacked image, seccomp, Landlock, cgroups) with the
//! egress doors served by the broker. See `cordon-jail` for the mechanism
//! itself.

use std::path::PathBuf;
use std::sync::Arc;

use cordon_egress::{EgressPolicy, Interception};
use cordon_jail::{Bind, Jail, JailError, JailOptions, JailSpec, Stdin};

use crate::mechanism::{Mechanism, MechanismState};
use crate::outcome::{Outcome, RunError};
use crate::spec::SandboxSpec;
pub use crate::supervisor::TRUST_BUNDLE_ENV;
use crate::supervisor::{EgressRuntime, Thread};
use crate::{Check, Context, Facts, Placement, Runtime, Spawned};

/// Options of the native runtime.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The jail's options (cgroup slot sharing for one-shot brokers, ...).
    pub jail: JailOptions,
    /// Check the host (`preflight`: program, interpreter, loader, mount
    /// sources) only when a sandbox fails to set up, to say why, instead of
    /// at every admission: for a one-shot call, whose sandbox setup finds
    /// the same failures (and nothing runs), so the common case does not
    /// pay for the check. The refusal is the same either way.
    pub preflight_on_failure: bool,
}

impl Options {
    /// For a process that makes one call and exits (`cordon run`/`exec`).
    pub fn one_shot() -> Options {
        Options {
            jail: JailOptions {
                share_cgroup_slots: true,
                ..Default::default()
            },
            preflight_on_failure: true,
        }
    }
}

/// The native runtime.
pub struct Native {
    jail: Arc<Jail>,
    preflight_on_failure: bool,
    /// Serves egress doors; started on first use.
    net: EgressRuntime,
}

impl Native {
    /// Detect the host and prepare the jail.
    pub fn new(opts: Options) -> Result<Native, JailError> {
        let mut n = Native::from_jail(Arc::new(Jail::with_options(opts.jail)?));
        n.preflight_on_failure = opts.preflight_on_failure;
        Ok(n)
    }

    /// Over an existing jail.
    pub fn from_jail(jail: Arc<Jail>) -> Native {
        Native {
            jail,
            preflight_on_failure: false,
            net: EgressRuntime::default(),
        }
    }

    /// The jail underneath (host facts, notes).
    pub fn jail(&self) -> &Arc<Jail> {
        &self.jail
    }

    fn preflight(&self, js: &JailSpec) -> Vec<crate::Problem> {
        cordon_jail::preflight::problems_on(js, &self.jail.host().system_dirs)
    }

    /// How each mechanism holds for a sandbox of `spec` here.
    pub fn mechanisms(&self, spec: &SandboxSpec) -> Vec<MechanismState> {
        let f = self.jail.host();
        let mut out = vec![MechanismState::enforced(Mechanism::Namespaces)];
        out.push(if f.mount_setattr {
            MechanismState::enforced(Mechanism::ReadonlyRoot)
        } else {
            MechanismState::partial(
                Mechanism::ReadonlyRoot,
                "no mount_setattr (Linux before 5.12): a read-only bind covers its top mount only, not the mounts below it",
            )
        });
        out.push(if f.close_range {
            MechanismState::enforced(Mechanism::Descriptors)
        } else {
            MechanismState::partial(
                Mechanism::Descriptors,
                "no close_range (Linux before 5.9): descriptors are closed one by one below 4096 only",
            )
        });
        out.push(MechanismState::enforced(Mechanism::Network));
        out.push(if f.seccomp {
            MechanismState::enforced(Mechanism::Seccomp)
        } else {
            MechanismState::missing(Mechanism::Seccomp, "the kernel has no seccomp filter mode")
        });
        let target = cordon_jail::landlock_target_abi();
        out.push(if !spec.landlock {
            MechanismState::missing(Mechanism::Landlock, "turned off for this sandbox")
        } else if f.landlock_abi <= 0 {
            MechanismState::missing(Mechanism::Landlock, "the kernel has no Landlock")
        } else if f.landlock_abi < target {
            MechanismState::partial(
                Mechanism::Landlock,
                format!(
                    "Landlock ABI {} is older than {target}: the newer rights are not enforced",
                    f.landlock_abi
                ),
            )
        } else {
            MechanismState::enforced(Mechanism::Landlock)
        });
        out.push(match self.jail.cgroup_fallback_reason() {
            Some(why) => MechanismState::partial(
                Mechanism::Cgroup,
                format!(
                    "{why}: rlimit fallback in force: memory capped per process by RLIMIT_DATA (RLIMIT_AS only as a backstop of 16x, at least {}), tasks by RLIMIT_NPROC, no CPU quota, no peak memory; a memory-limit failure is reported from the tool's stderr; for real limits run cordon in a delegated cgroup (see `cordon doctor`)",
                    cordon_sandbox::units::format_size(cordon_jail::fallback::AS_BACKSTOP_MIN)
                ),
            ),
            None => {
                let absent = crate::supervisor::absent_controllers(&self.jail, spec);
                let delegated = cordon_jail::delegate::current().and_then(|d| d.scope());
                if absent.is_empty() {
                    MechanismState::enforced(Mechanism::Cgroup)
                } else if let (Some(scope), false) = (delegated, f.root) {
                    MechanismState::partial(
                        Mechanism::Cgroup,
                        format!(
                            "no {} controller in the delegated scope {} (the systemd user manager was given none: a drop-in for user@.service with `Delegate=pids memory cpu` gives it them)",
                            absent.join(", "),
                            scope.display()
                        ),
                    )
                } else {
                    MechanismState::partial(
                        Mechanism::Cgroup,
                        format!("no {} controller here", absent.join(", ")),
                    )
                }
            }
        });
        out
    }

    /// The jail's spec for `spec` placed as `placement` says, and its
    /// egress policy.
    fn jail_spec(
        spec: &SandboxSpec,
        placement: &Placement,
    ) -> Result<(JailSpec, Option<EgressPolicy>), String> {
        if let Some(m) = spec.mounts.iter().find(|m| m.writable) {
            return Err(format!(
                "mount {}:{}:rw: the native runtime binds host paths read-only only",
                m.src.display(),
                m.dst.display()
            ));
        }
        if spec.workspace.is_some() || spec.state.is_some() {
            crate::volume::mechanism().map_err(|e| format!("{}: {e}", spec.tool))?;
        }
        let mut env = spec.env.clone();
        let (network, egress) = crate::supervisor::network(&spec.network, &mut env, true);
        Ok((
            JailSpec {
                tool: spec.tool.clone(),
                argv: spec.argv.clone(),
                env,
                secret_env: Vec::new(),
                binds: spec
                    .mounts
                    .iter()
                    .map(cordon_sandbox::Mount::bind)
                    .collect(),
                volumes: placement
                    .volumes
                    .iter()
                    .map(|v| Bind {
                        src: v.src.clone(),
                        dst: v.dst.clone(),
                    })
                    .collect(),
                limits: placement.limits(spec),
                network,
                seccomp: spec.seccomp.clone(),
                landlock: spec.landlock,
                root: spec.root.clone(),
                cwd: spec.cwd.as_ref().map(PathBuf::from),
                user: spec.user,
                trust_bundle: None,
                host_ids: placement.host_ids,
            },
            egress,
        ))
    }

    /// Run `spec` with its doors (if any) served for the sandbox's life.
    fn run_jail(
        &self,
        spec: &JailSpec,
        egress: Option<EgressPolicy>,
        icpt: Option<Interception>,
        stdin: Stdin,
        ctx: &Context,
    ) -> Result<Outcome, RunError> {
        let net = self.net.for_doors(egress.as_ref())?;
        crate::supervisor::run_jail(
            &self.jail,
            net.as_ref(),
            spec,
            egress.map(|e| (e, icpt)),
            stdin,
            ctx,
            false,
        )
    }
}

impl Runtime for Native {
    fn name(&self) -> &'static str {
        "native"
    }

    fn check(&self, spec: &SandboxSpec) -> Check {
        let mechanisms = self.mechanisms(spec);
        let problems = match Native::jail_spec(spec, &Placement::default()) {
            Err(e) => vec![e.into()],
            Ok(_) if self.preflight_on_failure => Vec::new(),
            Ok((js, _)) => self.preflight(&js),
        };
        Check {
            mechanisms,
            problems,
        }
    }

    fn run(&self, spec: &SandboxSpec, input: Vec<u8>, ctx: &Context) -> Result<Outcome, RunError> {
        if let Some(why) = spec.unprepared_volumes(&ctx.placement.volumes) {
            return Err(RunError::Refused(why));
        }
        let (mut js, egress) =
            Native::jail_spec(spec, &ctx.placement).map_err(RunError::Refused)?;
        let icpt = add_credentials(&mut js, egress.as_ref(), ctx)?;
        match self.run_jail(&js, egress, icpt, Stdin::Bytes(input), ctx) {
            Ok(o) => Ok(o),
            // Nothing ran: say why, as admission would have.
            Err(RunError::Setup(e)) if self.preflight_on_failure => {
                let problems = self.preflight(&js);
                if problems.is_empty() {
                    Err(RunError::Setup(e))
                } else {
                    Err(RunError::Refused(format!(
                        "{}: would not start on this host: {}",
                        spec.tool,
                        problems.join("; ")
                    )))
                }
            }
            Err(e) => Err(e),
        }
    }

    fn spawn(&self, spec: &SandboxSpec, ctx: &Context) -> Result<Spawned, RunError> {
        if let Some(why) = spec.unprepared_volumes(&ctx.placement.volumes) {
            return Err(RunError::Refused(why));
        }
        let (mut js, egress) =
            Native::jail_spec(spec, &ctx.placement).map_err(RunError::Refused)?;
        let icpt = add_credentials(&mut js, egress.as_ref(), ctx)?;
        let net = self.net.for_doors(egress.as_ref())?;
        crate::supervisor::spawn_jail(
            Thread {
                jail: self.jail.clone(),
                net,
                spec: js,
                egress: egress.map(|e| (e, icpt)),
                supervisor: false,
                name: "sandbox",
                on_end: None,
            },
            ctx,
            (),
        )
    }

    fn jail(&self) -> Option<Arc<Jail>> {
        Some(self.jail.clone())
    }

    fn facts(&self) -> Facts {
        let spec = SandboxSpec::new("doctor", ["/bin/true"]);
        let mut notes = vec![if self.jail.pools_network_namespaces() {
            "network: sandboxes without network get an exclusive, empty namespace from a pool, owned by the broker's user namespace (the tool cannot configure it); sandboxes with egress doors get a new one".to_string()
        } else {
            "network: a new network namespace per sandbox, made inside its own user namespace (this broker cannot make them itself: an unprivileged broker, or root without CAP_SYS_ADMIN)".to_string()
        }];
        notes.extend(self.jail.notes());
        Facts {
            runtime: "native",
            mechanisms: self.mechanisms(&spec),
            notes,
        }
    }
}

/// The session's credentials (see [`crate::supervisor::credentials`]),
/// the trust bundle in the jail's root.
fn add_credentials(
    js: &mut JailSpec,
    egress: Option<&EgressPolicy>,
    ctx: &Context,
) -> Result<Option<Interception>, RunError> {
    let trust_path = crate::supervisor::trust_bundle_path(&js.root);
    let d = crate::supervisor::credentials(
        &js.tool,
        &mut js.env,
        &mut js.secret_env,
        egress,
        ctx,
        trust_path,
    )?;
    js.trust_bundle = d.trust_bundle;
    Ok(d.interception)
}
