//! Probes of kernel surface a parser never needs: mounts, user namespaces,
//! ptrace, raw sockets, keyrings, bpf, io_uring. Each escapes when the
//! kernel grants the request.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};
use nix::unistd::{Pid, getpid, getppid};

use cordon_sys::probe::{Keyring, bpf_map_create_array, io_uring_setup, keyctl_get_keyring_id};

use super::{Finding, Verdict, agent_command, errname, unique};

/// Mount a tmpfs on a fresh directory (then unmount it).
pub(super) fn mount() -> Verdict {
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    let dir = std::path::PathBuf::from(format!("/tmp/.cordon-mnt-{}", unique()));
    let made = fs::create_dir(&dir).is_ok();
    let target = if made {
        dir.clone()
    } else {
        std::path::PathBuf::from("/tmp")
    };
    let r = mount(
        Some("tmpfs"),
        &target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=64k"),
    );
    let v = match r {
        Ok(()) => {
            let undo = match umount2(&target, MntFlags::MNT_DETACH) {
                Ok(()) => String::new(),
                Err(e) => format!(" (unmount failed: {e:?})"),
            };
            Verdict::escaped(format!("mounted a tmpfs on {}{undo}", target.display()))
        }
        Err(e) => Verdict::held(format!("mount tmpfs on {}: {e:?}", target.display())),
    };
    if made {
        let _ = fs::remove_dir(&dir);
    }
    v
}

/// A nested user namespace: the door to most in-namespace privilege.
pub(super) fn userns() -> Verdict {
    match nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER) {
        Ok(()) => Verdict::escaped("unshare(CLONE_NEWUSER) succeeded: nested user namespace"),
        Err(e) => Verdict::held(format!("unshare(CLONE_NEWUSER): {e:?}")),
    }
}

/// Helper process for the ptrace probe: PTRACE_TRACEME, then report the
/// errno as exit code (0 = granted).
pub(super) fn traceme_child() -> i32 {
    match nix::sys::ptrace::traceme() {
        Ok(()) => 0,
        Err(e) => e as i32,
    }
}

fn comm_of(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// ptrace: PTRACE_TRACEME in a child, and PTRACE_SEIZE of our parent and
/// of pid 1. A seize does not stop the tracee, and our exit detaches it.
pub(super) fn ptrace() -> Verdict {
    let mut f = Vec::new();
    match agent_command(&["_traceme"]) {
        Ok(mut cmd) => {
            let st = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            f.push(match st {
                Ok(s) if s.code() == Some(0) => {
                    Finding::escaped("PTRACE_TRACEME succeeded: ptrace(2) is reachable")
                }
                Ok(s) => match (s.code(), s.signal()) {
                    (Some(c), _) => {
                        Finding::held(format!("PTRACE_TRACEME: {:?}", Errno::from_raw(c)))
                    }
                    (None, Some(sig)) => {
                        Finding::held(format!("PTRACE_TRACEME: helper killed by signal {sig}"))
                    }
                    _ => Finding::error("PTRACE_TRACEME: helper ended without status"),
                },
                Err(e) => Finding::error(format!("spawn ptrace helper: {}", errname(&e))),
            });
        }
        Err(e) => f.push(Finding::error(format!("own executable: {}", errname(&e)))),
    }
    let me = getpid().as_raw();
    let parent = getppid().as_raw();
    let mut targets = Vec::new();
    if parent > 0 {
        targets.push(("parent", parent));
    }
    if me != 1 && parent != 1 {
        targets.push(("pid 1", 1));
    }
    for (what, pid) in targets {
        f.push(
            match nix::sys::ptrace::seize(Pid::from_raw(pid), nix::sys::ptrace::Options::empty()) {
                Ok(()) => Finding::escaped(format!(
                    "PTRACE_SEIZE of {what} {pid} ({}) succeeded",
                    comm_of(pid)
                )),
                Err(e) => Finding::held(format!("PTRACE_SEIZE {what} {pid}: {e:?}")),
            },
        );
    }
    Verdict::combine(f)
}

/// Raw and packet sockets (CAP_NET_RAW): crafted packets, sniffing.
pub(super) fn raw_socket() -> Verdict {
    let mut f = Vec::new();
    for (label, fam, proto) in [
        (
            "socket(AF_INET, SOCK_RAW, ICMP)",
            AddressFamily::Inet,
            SockProtocol::Icmp,
        ),
        (
            "socket(AF_PACKET, SOCK_RAW, ETH_P_ALL)",
            AddressFamily::Packet,
            SockProtocol::EthAll,
        ),
    ] {
        f.push(
            match socket(fam, SockType::Raw, SockFlag::SOCK_CLOEXEC, proto) {
                Ok(_fd) => Finding::escaped(format!("{label} succeeded")),
                Err(e) => Finding::held(format!("{label}: {e:?}")),
            },
        );
    }
    Verdict::combine(f)
}

/// Kernel keyrings are not namespaced: reaching them from a sandbox reaches
/// keys of the same uid everywhere.
pub(super) fn keyctl() -> Verdict {
    let mut f = Vec::new();
    for (label, k) in [("session", Keyring::Session), ("user", Keyring::User)] {
        f.push(match keyctl_get_keyring_id(k) {
            Ok(id) => Finding::escaped(format!(
                "keyctl(KEYCTL_GET_KEYRING_ID, {label}): keyring {id}"
            )),
            Err(e @ (Errno::EPERM | Errno::EACCES | Errno::ENOSYS)) => {
                Finding::held(format!("keyctl(KEYCTL_GET_KEYRING_ID, {label}): {e:?}"))
            }
            Err(e) => Finding::escaped(format!(
                "keyctl(KEYCTL_GET_KEYRING_ID, {label}): {e:?}: the keyring syscall is reachable"
            )),
        });
    }
    Verdict::combine(f)
}

/// bpf(2): BPF_MAP_CREATE of a one-entry array.
pub(super) fn bpf() -> Verdict {
    match bpf_map_create_array() {
        Ok(_fd) => Verdict::escaped("bpf(BPF_MAP_CREATE) succeeded"),
        Err(e) => Verdict::held(format!("bpf(BPF_MAP_CREATE): {e:?}")),
    }
}

/// io_uring_setup(2): a large, often-exploited surface that bypasses
/// seccomp filtering of the calls it performs.
pub(super) fn io_uring() -> Verdict {
    match io_uring_setup(4) {
        Ok(_fd) => Verdict::escaped("io_uring_setup(4) succeeded"),
        Err(e) => Verdict::held(format!("io_uring_setup: {e:?}")),
    }
}
