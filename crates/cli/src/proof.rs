//! The proof cache of `cordon serve`'s start probes: a tool whose probes
//! all held is recorded with the key of everything the proof depended on,
//! and a later start whose key is the same (and whose proof is younger than
//! [`MAX_AGE`]) serves it without proving it again.
//!
//! The key covers the tool's resolved policy, the cordon binary itself
//! (device, inode, size and modification time), this boot
//! (`/proc/sys/kernel/random/boot_id`: a reboot, a new kernel or a sysctl
//! reset is a new boot), the kernel release, the broker's uid, the isolation
//! mechanisms the host has (user namespaces, Landlock ABI, seccomp,
//! `mount_setattr`, `close_range`, which cgroup version holds each
//! controller), every `CORDON_*` setting in the environment, and the identity of the program the tool names, of its
//! mount sources and of the runtimes' own binaries (`runsc`, `qemu-system-x86_64`) found in `PATH`.
//! Any change to one of these is a different key, and the tool is proved
//! again. Only proofs that held are recorded; a refusal is never cached.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use cordon_policy::ToolPolicy;

/// A proof older than this is proved again even when nothing changed.
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// The file of recorded proofs, in cordon's state directory.
pub fn cache_file(state: &Path) -> PathBuf {
    state.join(FILE)
}

const FILE: &str = "proofs.json";

/// One tool's last proof that held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    /// sha256 of everything the proof depended on ([`Host::key`]).
    pub key: String,
    /// When it was proved (seconds since the epoch).
    pub proved_at: u64,
}

/// What a proof depends on besides the tool's own policy: read once per
/// start.
#[derive(Debug, Clone, Serialize)]
pub struct Host {
    boot_id: String,
    kernel: String,
    arch: String,
    euid: u32,
    user_namespaces: bool,
    landlock_abi: i32,
    seccomp: bool,
    mount_setattr: bool,
    close_range: bool,
    cgroups: Vec<String>,
    cordon: Option<FileId>,
    runtimes: BTreeMap<String, Option<FileId>>,
    settings: BTreeMap<String, String>,
}

/// A file's identity: a rebuilt or replaced binary, or a source whose
/// mode or owner changed, is another one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    /// Changed by chmod and chown too.
    ctime_ns: i128,
}

fn file_id(p: &Path) -> Option<FileId> {
    let m = std::fs::metadata(p).ok()?;
    Some(FileId {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
    })
}

impl Host {
    /// This host, as the broker about to prove tools sees it.
    pub fn detect() -> Host {
        let facts = cordon_jail::host::detect();
        let version = |name: &str, p: &Option<cordon_jail::cgroup::Placement>| {
            format!(
                "{name}={}",
                p.as_ref()
                    .map(|p| format!("{:?}", p.version))
                    .unwrap_or_else(|| "none".into())
            )
        };
        let layout = &facts.cgroup_layout;
        let path: BTreeMap<String, String> = std::env::var("PATH")
            .map(|p| BTreeMap::from([("PATH".to_string(), p)]))
            .unwrap_or_default();
        let runtimes = ["runsc", "qemu-system-x86_64"]
            .into_iter()
            .map(|n| {
                let found = crate::shims::which_outside(n, &path, &[]);
                (n.to_string(), found.and_then(|p| file_id(&p)))
            })
            .collect();
        Host {
            boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            kernel: facts.kernel.clone(),
            arch: facts.arch.clone(),
            euid: facts.euid,
            user_namespaces: facts.user_namespaces,
            landlock_abi: facts.landlock_abi,
            seccomp: facts.seccomp,
            mount_setattr: facts.mount_setattr,
            close_range: facts.close_range,
            cgroups: vec![
                version("memory", &layout.memory),
                version("pids", &layout.pids),
                version("cpu", &layout.cpu),
                format!("v2_base={}", layout.v2_base.is_some()),
            ],
            cordon: std::env::current_exe().ok().and_then(|p| file_id(&p)),
            runtimes,
            settings: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .filter(|(k, _)| k.starts_with("CORDON_"))
                .collect(),
        }
    }

    /// The key of a proof of `p` on this host: a host without a boot id
    /// (no `/proc`) gives none, and nothing is cached.
    pub fn key(&self, p: &ToolPolicy) -> Option<String> {
        if self.boot_id.is_empty() {
            return None;
        }
        let policy = serde_json::to_vec(p).ok()?;
        let host = serde_json::to_vec(self).ok()?;
        let programs: Vec<(String, Option<FileId>)> = programs_of(p)
            .into_iter()
            .map(|prog| {
                let id = file_id(Path::new(&prog));
                (prog, id)
            })
            .collect();
        let programs = serde_json::to_vec(&programs).ok()?;
        let mut h = sha2::Sha256::new();
        for part in [&policy, &host, &programs] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        Some(hex::encode(h.finalize()))
    }
}

/// The host files a tool names: its command's or MCP server's program
/// (when absolute) and its mount sources.
fn programs_of(p: &ToolPolicy) -> Vec<String> {
    let json = serde_json::to_value(p).unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    let mut add = |s: &str| {
        if s.starts_with('/') && !out.iter().any(|o| o == s) {
            out.push(s.to_string());
        }
    };
    for ptr in ["/exec/command/argv/0", "/exec/mcp/command/0"] {
        if let Some(s) = json.pointer(ptr).and_then(|v| v.as_str()) {
            add(s);
        }
    }
    if let Some(mounts) = json.get("mounts").and_then(|m| m.as_array()) {
        for m in mounts {
            if let Some(s) = m.get("src").and_then(|v| v.as_str()) {
                add(s);
            }
        }
    }
    out
}

/// An age as a person reads it: `42 s`, `7 min`, `3 h`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    if s < 120 {
        format!("{s} s")
    } else if s < 2 * 3600 {
        format!("{} min", s / 60)
    } else {
        format!("{} h", s / 3600)
    }
}

/// The recorded proofs (empty when there are none or the file is
/// unreadable: a cache that cannot be read only costs a proof).
pub fn load(file: &Path) -> BTreeMap<String, Proof> {
    std::fs::read(file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Whether `tool`'s recorded proof matches `key` and is younger than
/// [`MAX_AGE`] at `now`: its age when it does.
pub fn fresh(
    proofs: &BTreeMap<String, Proof>,
    tool: &str,
    key: &str,
    now: SystemTime,
) -> Option<Duration> {
    let proof = proofs.get(tool)?;
    if proof.key != key {
        return None;
    }
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
    let age = Duration::from_secs(now.checked_sub(proof.proved_at)?);
    (age < MAX_AGE).then_some(age)
}

/// Record `proved` (tool name, key) as held now in the cache of the state
/// directory `state`, keeping the other tools' proofs and dropping those of
/// `refused`.
pub fn store(
    state: &Path,
    proved: &[(String, String)],
    refused: &[String],
    now: SystemTime,
) -> anyhow::Result<()> {
    let mut proofs = load(&cache_file(state));
    let at = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    for (tool, key) in proved {
        proofs.insert(
            tool.clone(),
            Proof {
                key: key.clone(),
                proved_at: at,
            },
        );
    }
    for tool in refused {
        proofs.remove(tool);
    }
    crate::state::replace_file(state, FILE, &proofs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(yaml: &str) -> ToolPolicy {
        let dir = cordon_testkit::scratch::scratch();
        let m = dir.path().join("m.yaml");
        std::fs::write(&m, yaml).unwrap();
        let loaded = cordon_policy::load(&m).unwrap();
        loaded.policy.tools.values().next().unwrap().clone()
    }

    const WC: &str = "version: 1\ntools:\n  wc:\n    profile: P1\n    command: [\"/usr/bin/wc\"]\n    limits: {wall_seconds: 5, memory: 64M, tasks: 4}\n    network: none\n";

    #[test]
    fn the_key_changes_with_the_policy_the_host_and_the_programs() {
        let host = Host::detect();
        let a = tool(WC);
        let k = host.key(&a).unwrap();
        assert_eq!(
            host.key(&a).unwrap(),
            k,
            "the same inputs give the same key"
        );
        let b = tool(&WC.replace("memory: 64M", "memory: 128M"));
        assert_ne!(host.key(&b).unwrap(), k, "a changed limit is another key");
        let c = tool(&WC.replace("/usr/bin/wc", "/usr/bin/head"));
        assert_ne!(host.key(&c).unwrap(), k, "another program is another key");
        let mut other = host.clone();
        other.boot_id = "another boot".into();
        assert_ne!(other.key(&a).unwrap(), k, "a reboot is another key");
        let mut other = host.clone();
        other.landlock_abi -= 1;
        assert_ne!(other.key(&a).unwrap(), k, "a weaker host is another key");
        let mut other = host.clone();
        other.cordon = None;
        assert_ne!(other.key(&a).unwrap(), k, "another binary is another key");
        let mut other = host;
        other.boot_id.clear();
        assert_eq!(other.key(&a), None, "no boot id, no caching");
    }

    #[test]
    fn a_program_replaced_on_disk_is_another_key() {
        let dir = cordon_testkit::scratch::scratch();
        let prog = dir.path().join("tool");
        std::fs::write(&prog, "#!/bin/sh\necho one\n").unwrap();
        let p = tool(&WC.replace("/usr/bin/wc", prog.to_str().unwrap()));
        let host = Host::detect();
        let k = host.key(&p).unwrap();
        std::fs::write(&prog, "#!/bin/sh\necho two, longer\n").unwrap();
        assert_ne!(host.key(&p).unwrap(), k);
    }

    #[test]
    fn proofs_are_fresh_only_for_their_key_and_age() {
        let dir = cordon_testkit::scratch::scratch();
        let file = cache_file(dir.path());
        let now = SystemTime::now();
        assert!(load(&file).is_empty());
        store(
            dir.path(),
            &[("a".into(), "k1".into()), ("b".into(), "k2".into())],
            &[],
            now,
        )
        .unwrap();
        let mode = std::fs::metadata(&file).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let proofs = load(&file);
        assert!(fresh(&proofs, "a", "k1", now).is_some());
        assert!(fresh(&proofs, "a", "k2", now).is_none(), "another key");
        assert!(fresh(&proofs, "c", "k1", now).is_none(), "another tool");
        assert!(
            fresh(&proofs, "a", "k1", now + MAX_AGE).is_none(),
            "too old"
        );
        store(dir.path(), &[], &["a".into()], now).unwrap();
        let proofs = load(&file);
        assert!(
            fresh(&proofs, "a", "k1", now).is_none(),
            "a refusal drops it"
        );
        assert!(fresh(&proofs, "b", "k2", now).is_some(), "others kept");
        std::fs::write(&file, "not json").unwrap();
        assert!(load(&file).is_empty(), "an unreadable cache is empty");
    }
}
