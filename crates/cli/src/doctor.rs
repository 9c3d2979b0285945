//! `cordon doctor`: what this host can enforce, how each fact was detected,
//! and for each profile whether it holds at full strength here.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;

use cordon_jail::cgroup::Version;
use cordon_jail::{HostFacts, Jail};

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
    /// full | reduced | unavailable
    strength: &'static str,
    missing: Vec<String>,
}

#[derive(Serialize)]
struct Report {
    host: HostFacts,
    checks: Vec<Check>,
    profiles: Vec<ProfileVerdict>,
    notes: Vec<String>,
}

fn which(bin: &str) -> Option<String> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/usr/bin", "/usr/local/bin"])
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
}

fn read_trim(p: &str) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

pub fn run(json: bool) -> anyhow::Result<ExitCode> {
    let facts = cordon_jail::host::detect();
    let jail = Jail::new();
    let mut checks = Vec::new();
    let mut notes = Vec::new();

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
    checks.push(Check {
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
    });
    let (cg_usable, cg_detail) = match &jail {
        Ok(j) if j.uses_cgroups() => (true, "a pool of cgroups was created and limits can be written".to_string()),
        Ok(_) => (
            false,
            "cgroups cannot be created here (no delegation?): limits fall back to rlimits (RLIMIT_AS, RLIMIT_NPROC), which are weaker".to_string(),
        ),
        Err(e) => (false, format!("the jail cannot start: {e}")),
    };
    checks.push(Check {
        name: "cgroup limits usable",
        ok: cg_usable,
        detail: cg_detail,
        how: "created the broker's cgroup pool under its own cgroup".into(),
    });
    if let Ok(j) = &jail {
        checks.push(Check {
            name: "network namespaces",
            ok: true,
            detail: if j.pools_network_namespaces() {
                "sandboxes without network get an exclusive, empty namespace from a pool, owned by the broker's user namespace (the tool cannot configure it); sandboxes with egress doors get a new one".into()
            } else {
                "a new network namespace per sandbox, made inside its own user namespace (this broker cannot make them itself: an unprivileged broker, or root without CAP_SYS_ADMIN)".into()
            },
            how: "broker uid; unshare(CLONE_NEWNET) on a pool thread".into(),
        });
    }
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
    let runsc = which("runsc");
    checks.push(Check {
        name: "gvisor (runsc)",
        ok: runsc.is_some(),
        detail: runsc.clone().unwrap_or_else(|| "not found".into()),
        how: "runsc in PATH".into(),
    });
    let qemu = which("qemu-system-x86_64");
    checks.push(Check {
        name: "qemu",
        ok: qemu.is_some(),
        detail: qemu.clone().unwrap_or_else(|| "not found".into()),
        how: "qemu-system-x86_64 in PATH".into(),
    });
    if let Ok(j) = &jail {
        notes.extend(j.notes().iter().cloned());
    }
    notes.extend(facts.notes.iter().cloned());

    let mut p1_missing = Vec::new();
    if jail.is_err() {
        p1_missing.push("the native jail cannot start".to_string());
    }
    if !facts.seccomp {
        p1_missing.push("seccomp".into());
    }
    if !cg_usable {
        p1_missing.push("cgroup memory/pids limits (rlimit fallback in use)".into());
    }
    if facts.landlock_abi == 0 {
        p1_missing.push("Landlock second layer".into());
    }
    let p1 = ProfileVerdict {
        profile: "P1",
        strength: if jail.is_err() || !facts.seccomp {
            "unavailable"
        } else if p1_missing.is_empty() {
            "full"
        } else {
            "reduced"
        },
        missing: p1_missing.clone(),
    };
    let mut p2_missing = p1_missing.clone();
    p2_missing.push("credential broker (tools that declare secrets are refused)".into());
    p2_missing.push("OCI image runtime (tools given an `image` are refused)".into());
    let p2 = ProfileVerdict {
        profile: "P2",
        // Command and MCP-server tools run with their egress doors; what is
        // missing is refused, never run weaker.
        strength: if jail.is_err() || !facts.seccomp {
            "unavailable"
        } else {
            "reduced"
        },
        missing: p2_missing,
    };
    let mut p3_missing = vec!["a gVisor or microVM runtime integration in this build".to_string()];
    if runsc.is_none() {
        p3_missing.push("runsc not installed".into());
    }
    if !kvm {
        p3_missing.push("no usable /dev/kvm for a microVM".into());
    }
    let p3 = ProfileVerdict {
        profile: "P3",
        strength: "unavailable",
        missing: p3_missing,
    };
    let report = Report {
        host: facts,
        checks,
        profiles: vec![p1, p2, p3],
        notes,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::from(exit::OK));
    }
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
    Ok(ExitCode::from(exit::OK))
}
