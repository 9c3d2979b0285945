//! systemd delegation: on a pure cgroup v2 host, a broker whose own cgroup
//! it may not split (an unprivileged user in a login session, root in a
//! service) asks the systemd manager it can reach over D-Bus (the user
//! manager for an unprivileged broker, the system manager for root) for a
//! transient scope with `Delegate=yes` holding its own process, as
//! `systemd-run --scope -p Delegate=yes` does. The broker then moves itself
//! into a leaf `<scope>/broker` (cgroup v2 puts no processes in a cgroup
//! whose controllers are enabled for its children) and its slots go under
//! `<scope>/cordon`: memory, pids and cpu limits, `memory.peak`,
//! `cgroup.kill` and `CLONE_INTO_CGROUP`, the jail's v2 code path, for an
//! unprivileged user as for root.
//!
//! The request is made once per process (the process is in the scope
//! afterwards). Every way it does not happen is an answer, never an error:
//! not a pure v2 host, already delegated, no bus, no manager on it, or a
//! refusal, each with why; the jail then goes on as before (cgroups where
//! it can write them, else the rlimit fallback), and `cordon doctor` says
//! which path was taken.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cgroup::Version;
use crate::host::HostFacts;

/// How the broker came to have a delegated cgroup subtree, or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "path", content = "detail")]
pub enum Delegation {
    /// Not asked for (why: not a pure v2 host, the root cgroup, turned
    /// off).
    NotTried(String),
    /// No D-Bus socket of a systemd manager could be reached (which were
    /// looked for, and why each failed).
    NoBus(String),
    /// A bus, but no systemd manager on it.
    NoManager(String),
    /// The manager refused the scope, or the scope could not be used.
    Refused(String),
    /// The broker's own cgroup was delegated already (it runs in a unit
    /// with `Delegate=yes`, e.g. under `systemd-run --scope -p
    /// Delegate=yes`): its slots go under it.
    AlreadyDelegated {
        /// The delegated cgroup (the broker is in `<scope>/broker`).
        scope: PathBuf,
    },
    /// A transient scope was made for the broker.
    Delegated {
        /// The unit, e.g. `cordon-4242-1a2b3c.scope`.
        unit: String,
        /// Its cgroup directory (the broker is in `<scope>/broker`).
        scope: PathBuf,
    },
}

impl Delegation {
    /// The delegated cgroup the slots go under, if any.
    pub fn scope(&self) -> Option<&Path> {
        match self {
            Delegation::AlreadyDelegated { scope } | Delegation::Delegated { scope, .. } => {
                Some(scope)
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for Delegation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Delegation::NotTried(why) => write!(f, "not asked for: {why}"),
            Delegation::NoBus(why) => write!(f, "no bus: {why}"),
            Delegation::NoManager(why) => write!(f, "no manager: {why}"),
            Delegation::Refused(why) => write!(f, "refused: {why}"),
            Delegation::AlreadyDelegated { scope } => {
                write!(f, "already delegated at {}", scope.display())
            }
            Delegation::Delegated { unit, scope } => {
                write!(f, "delegated at {} ({unit})", scope.display())
            }
        }
    }
}

static DONE: OnceLock<Delegation> = OnceLock::new();

/// What this process's delegation request came to, once one was made (by
/// the first [`crate::Jail`] that uses cgroups).
pub fn current() -> Option<&'static Delegation> {
    DONE.get()
}

/// Ask for delegation if it is needed and not yet asked for in this
/// process (see the module documentation).
pub fn ensure(facts: &HostFacts) -> &'static Delegation {
    DONE.get_or_init(|| decide(facts))
}

/// How long the manager has to move the broker into its new scope.
const SCOPE_WAIT: Duration = Duration::from_secs(10);

fn decide(facts: &HostFacts) -> Delegation {
    let hs = &facts.cgroup_hierarchies;
    if hs.iter().any(|h| h.version == Version::V1) {
        return Delegation::NotTried(
            "not a pure cgroup v2 host (v1 hierarchies are mounted)".into(),
        );
    }
    let Some(v2) = hs.iter().find(|h| h.version == Version::V2) else {
        return Delegation::NotTried("no cgroup v2 hierarchy is mounted".into());
    };
    if v2.own == v2.mount {
        return Delegation::NotTried(format!(
            "this process is in the root cgroup of {} (no systemd manages the tree above it)",
            v2.mount.display()
        ));
    }
    if let Some(scope) = delegated_already(&v2.own) {
        return match into_leaf(&scope) {
            Ok(()) => Delegation::AlreadyDelegated { scope },
            Err(e) => Delegation::Refused(format!(
                "{} is delegated, but this process cannot move into {}/broker: {e}",
                scope.display(),
                scope.display()
            )),
        };
    }
    let buses = buses(facts.euid, &Env::from_process());
    let pid = std::process::id();
    let unit = unit_name(pid);
    // The blocking API runs its own little runtime: on a thread of its
    // own, whatever the caller's context (a tokio worker included).
    let req = {
        let unit = unit.clone();
        std::thread::Builder::new()
            .name("cordon-delegate".into())
            .spawn(move || request(&buses, &unit, pid))
    };
    let answer = match req {
        Ok(h) => h
            .join()
            .unwrap_or_else(|_| Err(Delegation::Refused("the D-Bus request panicked".into()))),
        Err(e) => Err(Delegation::Refused(format!(
            "start the D-Bus request thread: {e}"
        ))),
    };
    if let Err(d) = answer {
        return d;
    }
    let scope = match wait_for_scope(&v2.mount, &unit, SCOPE_WAIT) {
        Ok(s) => s,
        Err(e) => return Delegation::Refused(e),
    };
    match into_leaf(&scope) {
        Ok(()) => Delegation::Delegated { unit, scope },
        Err(e) => Delegation::Refused(format!(
            "{unit} was made at {}, but this process cannot move into {}/broker: {e}",
            scope.display(),
            scope.display()
        )),
    }
}

/// The delegated cgroup this process is in, if any: its own cgroup when
/// systemd marked it delegated (`trusted.delegate` or `user.delegate`
/// set to 1), or the parent of a `broker` leaf of such a cgroup (a process
/// started by a broker that was moved there). A cgroup the user merely
/// owns is not enough: every unit of a user manager is owned by its user,
/// but only a unit with `Delegate=yes` is the user's to split.
fn delegated_already(own: &Path) -> Option<PathBuf> {
    let marked = |d: &Path| {
        ["trusted.delegate", "user.delegate"]
            .iter()
            .any(|n| cordon_sys::io::get_xattr(d, n).as_deref() == Some(b"1"))
    };
    if marked(own) {
        return Some(own.to_path_buf());
    }
    let parent = own.parent()?;
    (own.file_name()? == "broker" && marked(parent)).then(|| parent.to_path_buf())
}

/// Move this process into `<scope>/broker` (made if missing), unless it
/// is there already.
fn into_leaf(scope: &Path) -> std::io::Result<()> {
    let leaf = scope.join("broker");
    match fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // "0": the writing process, all its threads.
    fs::write(leaf.join("cgroup.procs"), "0")
}

/// A D-Bus endpoint of a systemd manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bus {
    /// A bus (dbus-daemon or dbus-broker), by address: the method call
    /// goes to `org.freedesktop.systemd1` on it.
    Bus(String),
    /// The manager's own private socket (`systemd/private`): a direct
    /// connection to it, no bus.
    Private(PathBuf),
}

impl Bus {
    fn describe(&self) -> String {
        match self {
            Bus::Bus(a) => format!("the bus at {a}"),
            Bus::Private(p) => format!("systemd's private socket {}", p.display()),
        }
    }

    /// The socket path, for a `unix:path=` address or the private socket.
    fn path(&self) -> Option<PathBuf> {
        match self {
            Bus::Bus(a) => a
                .strip_prefix("unix:path=")
                .map(|p| PathBuf::from(p.split(',').next().unwrap_or(p))),
            Bus::Private(p) => Some(p.clone()),
        }
    }
}

/// The environment [`buses`] reads.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// `DBUS_SESSION_BUS_ADDRESS`.
    pub session_bus: Option<String>,
    /// `DBUS_SYSTEM_BUS_ADDRESS`.
    pub system_bus: Option<String>,
    /// `XDG_RUNTIME_DIR`, when it belongs to this user.
    pub runtime_dir: Option<PathBuf>,
}

impl Env {
    fn from_process() -> Env {
        let euid = cordon_sys::io::geteuid();
        Env {
            session_bus: std::env::var("DBUS_SESSION_BUS_ADDRESS").ok(),
            system_bus: std::env::var("DBUS_SYSTEM_BUS_ADDRESS").ok(),
            // Kept through `su` or `setpriv`, it may be another user's.
            runtime_dir: std::env::var_os("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .filter(|d| owned_by_dir(d, euid)),
        }
    }
}

fn owned_by_dir(d: &Path, uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(d).is_ok_and(|m| m.uid() == uid)
}

/// Where a manager may answer, in order: for root the system bus and the
/// system manager's private socket; for anyone else the user bus and the
/// user manager's private socket, in `$XDG_RUNTIME_DIR` (or
/// `/run/user/<uid>`).
pub fn buses(euid: u32, env: &Env) -> Vec<Bus> {
    let mut out = Vec::new();
    if euid == 0 {
        if let Some(a) = &env.system_bus {
            out.push(Bus::Bus(a.clone()));
        }
        out.push(Bus::Bus("unix:path=/run/dbus/system_bus_socket".into()));
        out.push(Bus::Private("/run/systemd/private".into()));
    } else {
        if let Some(a) = &env.session_bus {
            out.push(Bus::Bus(a.clone()));
        }
        let rt = env
            .runtime_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("/run/user/{euid}")));
        out.push(Bus::Bus(format!("unix:path={}", rt.join("bus").display())));
        out.push(Bus::Private(rt.join("systemd/private")));
    }
    out.dedup();
    out
}

/// A unit name of this process's own: `cordon-<pid>-<time>.scope`.
fn unit_name(pid: u32) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0);
    format!("cordon-{pid}-{t:x}.scope")
}

/// The properties of the transient scope: the broker's pid in it,
/// `Delegate=yes`, collected once it is inactive or failed.
pub fn properties(pid: u32) -> Vec<(&'static str, zbus::zvariant::Value<'static>)> {
    use zbus::zvariant::Value;
    vec![
        (
            "Description",
            Value::from(format!(
                "cordon broker {pid} (delegated cgroup for its sandboxes)"
            )),
        ),
        ("PIDs", Value::from(vec![pid])),
        ("Delegate", Value::from(true)),
        ("CollectMode", Value::from("inactive-or-failed")),
    ]
}

/// `StartTransientUnit(unit, "fail", properties(pid), [])` on the first of
/// `buses` that answers. `Err` is the delegation that did not happen.
pub fn request(buses: &[Bus], unit: &str, pid: u32) -> Result<(), Delegation> {
    let mut tried = Vec::new();
    let mut reached = false;
    for bus in buses {
        if let Some(p) = bus.path()
            && !p.exists()
        {
            tried.push(format!("{}: no such socket", bus.describe()));
            continue;
        }
        match call(bus, unit, pid) {
            Ok(()) => return Ok(()),
            Err(CallError::Connect(e)) => tried.push(format!("{}: {e}", bus.describe())),
            Err(CallError::NoManager(e)) => {
                reached = true;
                tried.push(format!("{}: {e}", bus.describe()));
            }
            Err(CallError::Refused(e)) => {
                return Err(Delegation::Refused(format!(
                    "StartTransientUnit {unit} on {}: {e}",
                    bus.describe()
                )));
            }
        }
    }
    let who = if cordon_sys::io::geteuid() == 0 {
        "the systemd system manager"
    } else {
        "a systemd user manager"
    };
    let why = format!("{who} was looked for at {}", tried.join("; "));
    Err(if reached {
        Delegation::NoManager(why)
    } else {
        Delegation::NoBus(why)
    })
}

enum CallError {
    Connect(String),
    NoManager(String),
    Refused(String),
}

fn call(bus: &Bus, unit: &str, pid: u32) -> Result<(), CallError> {
    use zbus::blocking::connection::Builder;
    let timeout = Duration::from_secs(10);
    let (builder, dest) = match bus {
        Bus::Bus(a) => (
            Builder::address(a.as_str()),
            Some("org.freedesktop.systemd1"),
        ),
        Bus::Private(p) => (
            Builder::address(format!("unix:path={}", p.display()).as_str()).map(Builder::p2p),
            None,
        ),
    };
    let conn = builder
        .and_then(|b| b.method_timeout(timeout).build())
        .map_err(|e| CallError::Connect(e.to_string()))?;
    let aux: Vec<(&str, Vec<(&str, zbus::zvariant::Value<'_>)>)> = Vec::new();
    let r = conn.call_method(
        dest,
        "/org/freedesktop/systemd1",
        Some("org.freedesktop.systemd1.Manager"),
        "StartTransientUnit",
        &(unit, "fail", properties(pid), aux),
    );
    match r {
        Ok(_job) => Ok(()),
        Err(zbus::Error::MethodError(name, detail, _)) => {
            let text = format!("{name}: {}", detail.unwrap_or_default());
            if matches!(
                name.as_str(),
                "org.freedesktop.DBus.Error.ServiceUnknown"
                    | "org.freedesktop.DBus.Error.NameHasNoOwner"
                    | "org.freedesktop.DBus.Error.UnknownMethod"
                    | "org.freedesktop.DBus.Error.UnknownObject"
                    | "org.freedesktop.DBus.Error.UnknownInterface"
            ) {
                Err(CallError::NoManager(text))
            } else {
                Err(CallError::Refused(text))
            }
        }
        Err(e) => Err(CallError::Refused(e.to_string())),
    }
}

/// Wait until this process's v2 cgroup is the unit's: its directory.
fn wait_for_scope(mount: &Path, unit: &str, limit: Duration) -> Result<PathBuf, String> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    let suffix = format!("/{unit}");
    loop {
        let own = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("read /proc/self/cgroup: {e}"))?;
        if let Some(p) = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .filter(|p| p.ends_with(&suffix))
        {
            return Ok(mount.join(p.trim_start_matches('/')));
        }
        if start.elapsed() > limit {
            return Err(format!(
                "{unit} was accepted, but this process was not in it after {}s (its cgroup: {})",
                limit.as_secs(),
                own.trim()
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::Hierarchy;

    #[test]
    fn the_scope_holds_the_broker_and_is_delegated() {
        let p = properties(4242);
        let names: Vec<&str> = p.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["Description", "PIDs", "Delegate", "CollectMode"]);
        let get = |n: &str| &p.iter().find(|(k, _)| *k == n).unwrap().1;
        assert_eq!(get("PIDs").value_signature().to_string(), "au");
        assert_eq!(get("PIDs"), &zbus::zvariant::Value::from(vec![4242u32]));
        assert_eq!(get("Delegate"), &zbus::zvariant::Value::from(true));
        // The whole call body has StartTransientUnit's signature.
        use zbus::zvariant::DynamicType;
        let aux: Vec<(&str, Vec<(&str, zbus::zvariant::Value<'_>)>)> = Vec::new();
        let body = ("u.scope", "fail", p, aux);
        assert_eq!(body.signature().to_string(), "(ssa(sv)a(sa(sv)))");
        let u = unit_name(7);
        assert!(u.starts_with("cordon-7-") && u.ends_with(".scope"), "{u}");
    }

    #[test]
    fn buses_are_the_users_or_the_systems() {
        let env = Env::default();
        assert_eq!(
            buses(1000, &env),
            [
                Bus::Bus("unix:path=/run/user/1000/bus".into()),
                Bus::Private("/run/user/1000/systemd/private".into())
            ]
        );
        assert_eq!(
            buses(0, &env),
            [
                Bus::Bus("unix:path=/run/dbus/system_bus_socket".into()),
                Bus::Private("/run/systemd/private".into())
            ]
        );
        let env = Env {
            session_bus: Some("unix:path=/tmp/b,guid=1".into()),
            runtime_dir: Some("/tmp/rt".into()),
            ..Env::default()
        };
        let b = buses(1000, &env);
        assert_eq!(b[0].path(), Some(PathBuf::from("/tmp/b")));
        assert_eq!(b[1], Bus::Bus("unix:path=/tmp/rt/bus".into()));
    }

    #[test]
    fn no_bus_is_an_answer_naming_where_it_looked() {
        // This machine has no systemd: whatever it is asked, the answer
        // says there is no bus (here: sockets that do not exist).
        let t = tempfile::tempdir().unwrap();
        let env = Env {
            runtime_dir: Some(t.path().to_path_buf()),
            ..Env::default()
        };
        let d = request(&buses(1000, &env), "cordon-test.scope", 1).unwrap_err();
        let Delegation::NoBus(why) = &d else {
            panic!("{d:?}")
        };
        assert!(
            why.contains(&format!("{}/bus: no such socket", t.path().display()))
                && why.contains("systemd/private: no such socket"),
            "{why}"
        );
        assert!(d.scope().is_none());
        // A socket that exists but where nobody answers: still no bus.
        let sock = t.path().join("bus");
        let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        drop(l);
        let d = request(
            &[Bus::Bus(format!("unix:path={}", sock.display()))],
            "u.scope",
            1,
        )
        .unwrap_err();
        assert!(matches!(d, Delegation::NoBus(_)), "{d:?}");
    }

    fn facts(hs: Vec<Hierarchy>) -> HostFacts {
        let mut f = crate::host::detect();
        f.cgroup_hierarchies = hs;
        f
    }

    #[test]
    fn only_a_pure_v2_host_below_its_root_cgroup_asks() {
        let v1 = Hierarchy {
            version: Version::V1,
            controllers: vec!["memory".into()],
            mount: "/sys/fs/cgroup/memory".into(),
            own: "/sys/fs/cgroup/memory".into(),
        };
        let v2 = |own: &str| Hierarchy {
            version: Version::V2,
            controllers: vec![],
            mount: "/sys/fs/cgroup".into(),
            own: own.into(),
        };
        let d = decide(&facts(vec![v1, v2("/sys/fs/cgroup/unified")]));
        assert!(
            matches!(&d, Delegation::NotTried(w) if w.contains("not a pure cgroup v2 host")),
            "{d:?}"
        );
        let d = decide(&facts(vec![]));
        assert!(
            matches!(&d, Delegation::NotTried(w) if w.contains("no cgroup v2")),
            "{d:?}"
        );
        let d = decide(&facts(vec![v2("/sys/fs/cgroup")]));
        assert!(
            matches!(&d, Delegation::NotTried(w) if w.contains("root cgroup")),
            "{d:?}"
        );
        assert!(d.to_string().starts_with("not asked for: "), "{d}");
    }
}
