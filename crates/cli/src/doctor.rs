//! `cordon doctor`: what this host can enforce, how each fact was detected,
//! and for each profile whether it holds at full strength here.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;

use cordon_jail::HostFacts;
use cordon_jail::cgroup::Version;
use cordon_policy::policy::{Mechanism, Profile};
use cordon_runtime::{MechanismState, Registry, State};

use crate::exit;

#[derive(Serialize)]
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
    /// How it was detected.
    how: String,
}

#[derive(Serialize)]
struct ProfileVerdict {
    profile: &'static str,
    /// full | partial | unavailable
    strength: &'static str,
    missing: Vec<String>,
}

#[derive(Serialize)]
struct RuntimeReport {
    runtime: &'static str,
    mechanisms: Vec<MechanismState>,
}

/// What `doctor` prints (as JSON with `--json`), and what a signed probe
/// report carries as its host facts.
#[derive(Serialize)]
pub struct Report {
    host: HostFacts,
    checks: Vec<Check>,
    runtimes: Vec<RuntimeReport>,
    profiles: Vec<ProfileVerdict>,
    notes: Vec<String>,
    /// The manifest's warm pools and their live state (`cordon doctor`
    /// only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pools: Option<crate::doctor_pools::PoolsReport>,
}

/// A profile's verdict from the mechanisms of the runtime it runs on:
/// unavailable when a mechanism it requires by default is not fully
/// enforced (its tools are refused, see `cordon_runtime::mechanism::hold`)
/// or the runtime cannot start, full only when every mechanism is fully
/// enforced and nothing else is missing, partial otherwise, each missing
/// piece named.
fn verdict(
    profile: Profile,
    name: &'static str,
    mechanisms: Option<&[MechanismState]>,
    unavailable_why: Option<String>,
    also_missing: Vec<String>,
) -> ProfileVerdict {
    let Some(ms) = mechanisms else {
        return ProfileVerdict {
            profile: name,
            strength: "unavailable",
            missing: unavailable_why.into_iter().chain(also_missing).collect(),
        };
    };
    let required = cordon_policy::resolve::default_requirements(profile);
    let mut missing: Vec<String> = Vec::new();
    let mut blocked = false;
    for m in ms {
        match &m.state {
            State::Enforced => {}
            State::Partial(_) | State::Missing(_) => {
                let req = required.contains(&m.mechanism);
                blocked |= req;
                missing.push(if req {
                    format!(
                        "{m} (required by {name} by default: tools refused unless `accept: [{}]`)",
                        m.mechanism
                    )
                } else {
                    m.to_string()
                });
            }
        }
    }
    for m in required {
        if !ms.iter().any(|s| s.mechanism == *m) {
            blocked = true;
            missing.push(format!("{m}: not provided by the runtime"));
        }
    }
    missing.extend(also_missing);
    ProfileVerdict {
        profile: name,
        strength: if blocked {
            "unavailable"
        } else if missing.is_empty() {
            "full"
        } else {
            "partial"
        },
        missing,
    }
}

/// Audit records that could not be written (counted by the audit writer),
/// the first and the last.
fn unwritten_audit_check(path: &Path) -> Check {
    let how = format!(
        "each record the audit writer could not write is counted in {} (delete it once dealt with)",
        path.display()
    );
    let (ok, detail) = match cordon_audit::read_unwritten(path) {
        Ok(u) if u.count == 0 => (true, "every audit record was written".to_string()),
        Ok(u) => {
            let show = |r: &Option<cordon_audit::UnwrittenRecord>| {
                r.as_ref()
                    .map(|r| {
                        format!(
                            "{} at {} ({}, session {}): {}",
                            r.what, r.time, r.tool, r.session, r.error
                        )
                    })
                    .unwrap_or_else(|| "not readable".into())
            };
            let detail = format!(
                "{} audit record(s) could not be written; first: {}; last: {}",
                u.count,
                show(&u.first),
                show(&u.last)
            );
            (false, detail)
        }
        Err(e) => (false, format!("{} cannot be read: {e}", path.display())),
    };
    Check {
        name: "audit records written",
        ok,
        detail,
        how,
    }
}

fn read_trim(p: &str) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

pub fn run(
    json: bool,
    providers: Option<&Path>,
    manifest: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let (mut report, registry) = collect(providers);
    report.pools = Some(crate::doctor_pools::collect(manifest));
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::from(exit::OK));
    }
    print_text(&report, &registry);
    Ok(ExitCode::from(exit::OK))
}

/// This host's facts, checks, runtimes and profile verdicts, and the
/// registry they were read from.
pub fn collect(providers: Option<&Path>) -> (Report, Registry) {
    // The registry first: the native runtime's jail may move this process
    // into a delegated scope, and the facts are read after that.
    let registry =
        Registry::for_host(Default::default()).with_upstream_dns(crate::run::upstream_dns());
    let facts = cordon_jail::host::detect();
    let native = registry
        .get(
            cordon_policy::policy::Runtime::Native,
            cordon_runtime::Use::Call,
        )
        .ok();
    let native_facts = native.as_ref().map(|n| n.facts());
    let native_err = registry
        .unavailable()
        .iter()
        .map(|(_, why)| why.clone())
        .next();
    let mut checks = Vec::new();
    let mut notes = Vec::new();

    userns_checks(&facts, &mut checks);
    checks.push(volumes_check());
    checks.push(cgroups_check(&facts));
    let cgroup_usable = cgroup_usable_check(native_facts.as_ref(), native_err.as_ref());
    checks.push(delegation_check());
    checks.push(tenant_uids_check());
    checks.push(cgroup_usable);
    kernel_checks(&facts, &mut checks);
    let gvisor = Gvisor::of(&registry);
    gvisor_checks(&gvisor, &mut checks);
    microvm_checks(&registry, &mut checks, &mut notes);
    wasm_checks(&registry, &mut checks, &mut notes);
    checks.push(image_store_check());
    let (credential_check, broker_missing) = credential_broker_check(providers);
    checks.push(credential_check);
    if let Ok(unwritten) = cordon_broker::default_unwritten_path() {
        checks.push(unwritten_audit_check(&unwritten));
    }
    if let Some(f) = &native_facts {
        notes.extend(f.notes.iter().cloned());
    }
    for n in &facts.notes {
        if !notes.contains(n) {
            notes.push(n.clone());
        }
    }

    let profiles = profile_verdicts(
        native_facts.as_ref(),
        native_err.as_ref(),
        &gvisor,
        broker_missing,
    );
    for (pid, why) in cordon_runtime::pool::stopped_pools() {
        notes.push(format!("broker {pid}: {why}"));
    }
    for n in &gvisor.notes {
        let n = format!("gvisor: {n}");
        if !notes.contains(&n) {
            notes.push(n);
        }
    }
    let runtimes = registry
        .runtimes()
        .iter()
        .map(|rt| RuntimeReport {
            runtime: rt.name(),
            mechanisms: rt.facts().mechanisms,
        })
        .collect();
    let report = Report {
        host: facts,
        checks,
        runtimes,
        profiles,
        notes,
        pools: None,
    };
    (report, registry)
}

/// User namespaces, for root and for an unprivileged user.
fn userns_checks(facts: &HostFacts, checks: &mut Vec<Check>) {
    let userns_max = read_trim("/proc/sys/user/max_user_namespaces").unwrap_or_default();
    let unpriv_knob = read_trim("/proc/sys/kernel/unprivileged_userns_clone");
    let apparmor = read_trim("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    let unpriv_ok = facts.user_namespaces
        && unpriv_knob.as_deref() != Some("0")
        && apparmor.as_deref() != Some("1");
    checks.push(Check {
        name: "user namespaces (as root)",
        ok: facts.user_namespaces,
        detail: format!("user.max_user_namespaces = {userns_max}"),
        how: "/proc/sys/user/max_user_namespaces".into(),
    });
    checks.push(Check {
        name: "user namespaces (unprivileged)",
        ok: unpriv_ok,
        detail: format!(
            "unprivileged_userns_clone = {}, apparmor_restrict_unprivileged_userns = {}",
            unpriv_knob.as_deref().unwrap_or("absent"),
            apparmor.as_deref().unwrap_or("absent")
        ),
        how: "/proc/sys/kernel/{unprivileged_userns_clone,apparmor_restrict_unprivileged_userns}"
            .into(),
    });
}

/// Whether workspace and state volume sizes are enforced.
fn volumes_check() -> Check {
    let volumes = cordon_runtime::volume::mechanism();
    Check {
        name: "workspace and state sizes",
        ok: volumes.is_ok(),
        detail: match &volumes {
            Ok(how) => format!("enforced: {how}"),
            Err(why) => why.clone(),
        },
        how: "tmpfs size= and ext4 images mounted by a root broker (docs/workspaces.md)".into(),
    }
}

/// The cgroup hierarchies mounted, and where the memory, pids and cpu
/// controllers are.
fn cgroups_check(facts: &HostFacts) -> Check {
    let layout = &facts.cgroup_layout;
    let place = |p: &Option<cordon_jail::cgroup::Placement>| match p {
        Some(p) => format!(
            "{} at {}",
            match p.version {
                Version::V1 => "v1",
                Version::V2 => "v2",
            },
            p.base.display()
        ),
        None => "unavailable".into(),
    };
    let hierarchies: Vec<String> = facts
        .cgroup_hierarchies
        .iter()
        .map(|h| {
            format!(
                "{:?} {} [{}]",
                h.version,
                h.mount.display(),
                h.controllers.join(",")
            )
        })
        .collect();
    let mode = {
        let v1 = facts
            .cgroup_hierarchies
            .iter()
            .any(|h| h.version == Version::V1);
        let v2 = facts
            .cgroup_hierarchies
            .iter()
            .any(|h| h.version == Version::V2);
        match (v1, v2) {
            (true, true) => "hybrid (v1 controllers, v2 mounted)",
            (true, false) => "v1 only",
            (false, true) => "unified v2",
            (false, false) => "none mounted",
        }
    };
    Check {
        name: "cgroups",
        ok: layout.memory.is_some() && layout.pids.is_some(),
        detail: format!(
            "{mode}; memory: {}; pids: {}; cpu: {}",
            place(&layout.memory),
            place(&layout.pids),
            place(&layout.cpu)
        ),
        how: format!(
            "/proc/self/mounts and /proc/self/cgroup: {}",
            hierarchies.join("; ")
        ),
    }
}

/// Whether the native runtime made its cgroup pool.
fn cgroup_usable_check(
    native_facts: Option<&cordon_runtime::Facts>,
    native_err: Option<&String>,
) -> Check {
    let cgroup_state = native_facts.and_then(|f| {
        f.mechanisms
            .iter()
            .find(|m| m.mechanism == Mechanism::Cgroup)
            .cloned()
    });
    let (cg_usable, cg_detail) = match (&cgroup_state, native_err) {
        (Some(m), _) if m.is_enforced() => (
            true,
            "a pool of cgroups was created and limits can be written".to_string(),
        ),
        (Some(m), _) => (false, m.to_string()),
        (None, Some(e)) => (false, format!("the jail cannot start: {e}")),
        (None, None) => (false, "no native runtime".to_string()),
    };
    Check {
        name: "cgroup limits usable",
        ok: cg_usable,
        detail: cg_detail,
        how: "created the broker's cgroup pool under its own cgroup".into(),
    }
}

/// Whether systemd delegated a cgroup subtree to this process.
fn delegation_check() -> Check {
    // The native runtime's jail asked (or not) for a delegated scope when
    // it was made, above.
    let delegation = cordon_jail::delegate::current();
    Check {
        name: "systemd delegation",
        ok: !matches!(
            delegation,
            Some(
                cordon_jail::delegate::Delegation::NoBus(_)
                    | cordon_jail::delegate::Delegation::NoManager(_)
                    | cordon_jail::delegate::Delegation::Refused(_)
            )
        ),
        detail: match delegation {
            Some(d) => d.to_string(),
            None => "not asked for: the native runtime did not start, or uses no cgroups".into(),
        },
        how: "on a pure cgroup v2 host below its root cgroup: StartTransientUnit (a scope with Delegate=yes holding this process) on the systemd manager's D-Bus (the user bus for an unprivileged user, the system bus for root; or the manager's private socket)".into(),
    }
}

/// Whether each tenant's sandboxes run as host uids of their own.
fn tenant_uids_check() -> Check {
    use cordon_broker::tenant_uids::{Availability, RANGE_ENV, SUBID_USER, TenantUids};
    let (ok, detail) = match TenantUids::discover() {
        Availability::InForce(u) => (
            true,
            format!(
                "in force: each tenant's native sandboxes run as a uid of its own from {}+{} (gids from {}), kept under {}",
                u.uid_first,
                u.count,
                u.gid_first,
                u.state_dir.display()
            ),
        ),
        Availability::Off(why) => (false, format!("not in force: {why}")),
    };
    Check {
        name: "per-tenant host uids",
        ok,
        detail,
        how: format!(
            "the `{SUBID_USER}` user's lines in /etc/subuid and /etc/subgid, or {RANGE_ENV}; root only"
        ),
    }
}

/// Kernel features the jail uses when present.
fn kernel_checks(facts: &HostFacts, checks: &mut Vec<Check>) {
    checks.push(Check {
        name: "mount_setattr",
        ok: facts.mount_setattr,
        detail: if facts.mount_setattr {
            "read-only binds are made read-only recursively, submounts included".into()
        } else {
            "absent (Linux before 5.12): a read-only bind covers its top mount only".into()
        },
        how: "mount_setattr(-1, NULL, 0, NULL, 0): EBADF/EINVAL vs ENOSYS".into(),
    });
    checks.push(Check {
        name: "close_range",
        ok: facts.close_range,
        detail: if facts.close_range {
            "every descriptor but the sandbox's own is closed before exec".into()
        } else {
            "absent (Linux before 5.9): descriptors are closed one by one below 4096 only".into()
        },
        how: "close_range(~0, ~0, 0): success/EINVAL vs ENOSYS".into(),
    });
    checks.push(Check {
        name: "seccomp",
        ok: facts.seccomp,
        detail: if facts.seccomp {
            "filter mode available".into()
        } else {
            "absent".into()
        },
        how: "`Seccomp:` line in /proc/self/status".into(),
    });
    checks.push(Check {
        name: "landlock",
        ok: facts.landlock_abi > 0,
        detail: format!("ABI version {}", facts.landlock_abi),
        how: "landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)".into(),
    });
    let kvm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    checks.push(Check {
        name: "kvm",
        ok: kvm,
        detail: if kvm {
            "/dev/kvm opens read-write".into()
        } else {
            "no usable /dev/kvm".into()
        },
        how: "open(/dev/kvm, O_RDWR)".into(),
    });
}

/// gVisor: runsc, its release, and which platforms start a sandbox here.
struct Gvisor {
    /// Why it cannot run here (empty: it can).
    problems: Vec<String>,
    facts: Option<cordon_runtime::Facts>,
    notes: Vec<String>,
}

impl Gvisor {
    fn of(registry: &Registry) -> Gvisor {
        let gvisor = registry
            .get(
                cordon_policy::policy::Runtime::Gvisor,
                cordon_runtime::Use::Call,
            )
            .ok();
        let gv_problems: Vec<String> = match &gvisor {
            Some(g) => g
                .check(&cordon_runtime::SandboxSpec::new("doctor", ["/bin/true"]))
                .problems
                .iter()
                .map(|p| p.trim_start_matches("runtime gvisor: ").to_string())
                .collect(),
            None => vec!["runtime gvisor is not available in this build".into()],
        };
        let gv_facts = gvisor.as_ref().map(|g| g.facts());
        let gv_notes: Vec<String> = gv_facts
            .as_ref()
            .map(|f| f.notes.clone())
            .unwrap_or_default();
        Gvisor {
            problems: gv_problems,
            facts: gv_facts,
            notes: gv_notes,
        }
    }

    /// The note of the gVisor runtime that starts with `prefix`, without it.
    fn note(&self, prefix: &str) -> Option<String> {
        self.notes
            .iter()
            .find_map(|n| n.strip_prefix(prefix).map(str::to_string))
    }
}

/// runsc and the platforms it starts a sandbox with here.
fn gvisor_checks(gv: &Gvisor, checks: &mut Vec<Check>) {
    checks.push(Check {
        name: "gvisor (runsc)",
        ok: gv.problems.is_empty(),
        detail: if gv.problems.is_empty() {
            gv.note("runsc ").unwrap_or_default()
        } else {
            gv.problems.join("; ")
        },
        how: "$CORDON_RUNSC or runsc in PATH; `runsc --version` (release 20240101 or newer)".into(),
    });
    if let Some(platforms) = gv.note("platforms: ") {
        checks.push(Check {
            name: "gvisor platforms",
            ok: gv.note("chosen platform: ").is_some(),
            detail: format!(
                "{platforms}; chosen: {}",
                gv.note("chosen platform: ").unwrap_or_else(|| "none".into())
            ),
            how: "runsc --platform=P --network=none --ignore-cgroups do /bin/true for systrap, kvm, ptrace (cached per runsc release and kernel)".into(),
        });
    }
}

/// The Wasm runtime: its runner, the compiled-code cache, and what the
/// Wasm layer adds to each mechanism of the jail around it.
fn wasm_checks(registry: &Registry, checks: &mut Vec<Check>, notes: &mut Vec<String>) {
    let how =
        "$CORDON_WASM, else cordon-wasm beside cordon (built with `cargo build -p cordon-wasm`)"
            .to_string();
    let rt = match registry.get(
        cordon_policy::policy::Runtime::Wasm,
        cordon_runtime::Use::Call,
    ) {
        Ok(rt) => rt,
        Err(e) => {
            checks.push(Check {
                name: "wasm (wasmtime)",
                ok: false,
                detail: e,
                how,
            });
            return;
        }
    };
    let facts = rt.facts();
    let first = facts.notes.first().cloned().unwrap_or_default();
    checks.push(Check {
        name: "wasm (wasmtime)",
        ok: !first.contains("unavailable: "),
        detail: first,
        how,
    });
    for n in facts.notes.iter().skip(1) {
        notes.push(format!("wasm: {n}"));
    }
}

/// The microVM runtime: QEMU, the guest kernel and init, and the
/// accelerator (KVM when a tiny guest boots under it here; the verdict is
/// cached per guest kernel, QEMU build and host kernel).
fn microvm_checks(registry: &Registry, checks: &mut Vec<Check>, notes: &mut Vec<String>) {
    let rt = registry
        .get(
            cordon_policy::policy::Runtime::Microvm,
            cordon_runtime::Use::Call,
        )
        .ok();
    let Some(rt) = rt else {
        checks.push(Check {
            name: "microvm (qemu)",
            ok: false,
            detail: "runtime microvm is not available in this build".into(),
            how: String::new(),
        });
        return;
    };
    let problems: Vec<String> = rt
        .check(&cordon_runtime::SandboxSpec::new("doctor", ["/bin/true"]))
        .problems
        .iter()
        .filter(|p| p.starts_with("runtime microvm: "))
        .map(|p| p.trim_start_matches("runtime microvm: ").to_string())
        .collect();
    let facts = rt.facts();
    let note = |prefix: &str| {
        facts
            .notes
            .iter()
            .find_map(|n| n.strip_prefix(prefix).map(str::to_string))
    };
    checks.push(Check {
        name: "microvm (qemu)",
        ok: problems.is_empty(),
        detail: if problems.is_empty() {
            ["QEMU ", "guest kernel ", "guest init "]
                .iter()
                .filter_map(|p| note(p).map(|n| format!("{}{n}", p)))
                .collect::<Vec<_>>()
                .join("; ")
        } else {
            problems.join("; ")
        },
        how: "$CORDON_QEMU or qemu-system-x86_64 (9.0 or newer) in PATH; $CORDON_VM_KERNEL or /boot/vmlinuz-*-cloud-amd64; $CORDON_VM_INIT or the static cordon-vm-init of scripts/build-vm-init.sh".into(),
    });
    if let Some(accel) = note("accelerator: ") {
        checks.push(Check {
            name: "microvm accelerator",
            ok: accel == "kvm",
            detail: accel,
            how: "a tiny guest booted under -accel kvm once (cached per guest kernel, QEMU, host kernel and guest init); $CORDON_VM_ACCEL=tcg|kvm decides without it".into(),
        });
    }
    for n in facts.notes {
        let n = format!("microvm: {n}");
        if !notes.contains(&n) {
            notes.push(n);
        }
    }
}

/// Where images are kept, and how many.
fn image_store_check() -> Check {
    let store = cordon_image::store::Store::default_dir();
    Check {
        name: "image store",
        ok: store.is_ok(),
        detail: match &store {
            Ok(d) if d.join("images").is_dir() => {
                let n = std::fs::read_dir(d.join("images"))
                    .map(|r| r.count())
                    .unwrap_or(0);
                format!("{} ({n} image records)", d.display())
            }
            Ok(d) => format!(
                "{} (not made yet: the first pull or load makes it)",
                d.display()
            ),
            Err(e) => e.to_string(),
        },
        how: "$CORDON_STORE, /var/lib/cordon as root, else ~/.local/share/cordon".into(),
    }
}

/// The credential broker's provider file, and what the profiles miss
/// without one.
fn credential_broker_check(providers: Option<&Path>) -> (Check, Vec<String>) {
    let (pf, pf_how) = cordon_secrets::describe_source(providers);
    let credentials = cordon_secrets::CredentialBroker::discover(providers);
    let check = Check {
        name: "credential broker",
        ok: matches!(credentials, Ok(Some(_))),
        detail: match &credentials {
            Ok(Some(b)) => format!(
                "provider file {} ({pf_how}): {}{}",
                b.path().display(),
                b.providers()
                    .iter()
                    .map(|(n, k)| format!("{n} ({})", k.name()))
                    .collect::<Vec<_>>()
                    .join(", "),
                b.default_provider()
                    .map(|d| format!("; default {d}"))
                    .unwrap_or_default()
            ),
            Ok(None) => format!(
                "no provider file at {} ({pf_how}): tools that declare secrets are refused",
                pf.display()
            ),
            Err(e) => format!("{e}: tools that declare secrets are refused"),
        },
        how: "--providers, $CORDON_PROVIDERS, else /etc/cordon/providers.yaml (mode 0600)".into(),
    };
    let broker_missing = match &credentials {
        Ok(Some(_)) => Vec::new(),
        _ => vec![
            "credential broker (no provider file loads: tools that declare secrets are refused)"
                .to_string(),
        ],
    };
    (check, broker_missing)
}

/// P1 and P2 on the native runtime, P3 on gVisor.
fn profile_verdicts(
    native_facts: Option<&cordon_runtime::Facts>,
    native_err: Option<&String>,
    gv: &Gvisor,
    broker_missing: Vec<String>,
) -> Vec<ProfileVerdict> {
    let ms = native_facts.map(|f| f.mechanisms.as_slice());
    let p1 = verdict(Profile::P1, "P1", ms, native_err.cloned(), Vec::new());
    let p2 = verdict(
        Profile::P2,
        "P2",
        ms,
        native_err.cloned(),
        broker_missing.clone(),
    );
    let p3 = if gv.problems.is_empty() {
        verdict(
            Profile::P3,
            "P3",
            gv.facts.as_ref().map(|f| f.mechanisms.as_slice()),
            None,
            broker_missing,
        )
    } else {
        verdict(
            Profile::P3,
            "P3",
            None,
            Some(format!(
                "runtime gvisor (P3 tools are refused): {}",
                gv.problems.join("; ")
            )),
            Vec::new(),
        )
    };
    vec![p1, p2, p3]
}

/// The report as lines for a person.
fn print_text(report: &Report, registry: &Registry) {
    println!(
        "host: kernel {} {}, running as uid {}{}",
        report.host.kernel,
        report.host.arch,
        report.host.euid,
        if report.host.root {
            " (root: tools run as an unprivileged uid inside a user namespace)"
        } else {
            " (unprivileged: tools run as this uid inside a user namespace)"
        }
    );
    for c in &report.checks {
        println!(
            "{} {:<32} {}\n      detected by: {}",
            if c.ok { "ok  " } else { "NO  " },
            c.name,
            c.detail,
            c.how
        );
    }
    for r in &report.runtimes {
        println!("runtime {}:", r.runtime);
        for m in &r.mechanisms {
            println!("  {m}");
        }
    }
    for (k, why) in registry.unavailable() {
        println!(
            "runtime {}: cannot start here: {why}",
            cordon_runtime::kind_name(*k)
        );
    }
    for p in &report.profiles {
        if p.missing.is_empty() {
            println!("{}: {}", p.profile, p.strength);
        } else {
            println!(
                "{}: {} (missing: {})",
                p.profile,
                p.strength,
                p.missing.join("; ")
            );
        }
    }
    for n in &report.notes {
        println!("note: {n}");
    }
    if let Some(p) = &report.pools {
        crate::doctor_pools::print(p);
    }
}
