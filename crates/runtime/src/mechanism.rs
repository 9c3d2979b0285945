//! Mechanisms as a runtime enforces them on this host, and the one place a
//! policy's requirements are held against them.

use std::fmt;

pub use cordon_policy::policy::Mechanism;
use serde::Serialize;

/// How one mechanism holds for a sandbox on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "why")]
pub enum State {
    /// Fully enforced.
    Enforced,
    /// In force, but weaker than its full form (why).
    Partial(String),
    /// Not in force (why; and the fallback, if any).
    Missing(String),
}

/// One mechanism and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MechanismState {
    /// Which.
    pub mechanism: Mechanism,
    /// How it holds.
    #[serde(flatten)]
    pub state: State,
}

impl MechanismState {
    /// Fully enforced.
    pub fn enforced(mechanism: Mechanism) -> Self {
        MechanismState {
            mechanism,
            state: State::Enforced,
        }
    }

    /// Partial, with why.
    pub fn partial(mechanism: Mechanism, why: impl Into<String>) -> Self {
        MechanismState {
            mechanism,
            state: State::Partial(why.into()),
        }
    }

    /// Missing, with why.
    pub fn missing(mechanism: Mechanism, why: impl Into<String>) -> Self {
        MechanismState {
            mechanism,
            state: State::Missing(why.into()),
        }
    }

    /// Whether it is fully enforced.
    pub fn is_enforced(&self) -> bool {
        self.state == State::Enforced
    }
}

impl fmt::Display for MechanismState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            State::Enforced => write!(f, "{}: enforced", self.mechanism),
            State::Partial(why) => write!(f, "{}: partial ({why})", self.mechanism),
            State::Missing(why) => write!(f, "{}: missing ({why})", self.mechanism),
        }
    }
}

/// What the Wasm layer of `runtime: wasm` adds to a mechanism inside the
/// native jail around it (which enforces every mechanism as for a native
/// tool): `None` where it adds nothing of that kind.
pub fn wasm_layer(m: Mechanism) -> Option<&'static str> {
    Some(match m {
        Mechanism::Network => {
            "WASI preview 1 is given no socket and no way to make one (no preopened socket, TCP, UDP or name lookup)"
        }
        Mechanism::ReadonlyRoot | Mechanism::Landlock => {
            "the module sees no file system but the manifest's mounts, each preopened read-only"
        }
        Mechanism::Seccomp => {
            "the module makes no system call: it calls WASI functions, which the runner carries out"
        }
        Mechanism::Cgroup => {
            "linear memory is capped (a growth past it traps) and the module stops at the wall clock (epoch interruption)"
        }
        Mechanism::Descriptors => {
            "the module has stdin, stdout, stderr and its preopens, nothing else"
        }
        Mechanism::Namespaces | Mechanism::Kvm => return None,
    })
}

/// Hold `mechanisms` against a tool's requirements: `Err` names every
/// required mechanism that is not fully enforced (a mechanism the runtime
/// does not report at all counts as missing); `Ok` carries one warning per
/// mechanism that is partial or missing but not required, saying whether
/// the manifest accepted it.
pub fn hold(
    tool: &str,
    runtime: &str,
    require: &[Mechanism],
    accept: &[Mechanism],
    mechanisms: &[MechanismState],
) -> Result<Vec<String>, String> {
    let mut refused = Vec::new();
    for m in require {
        match mechanisms.iter().find(|s| s.mechanism == *m) {
            Some(s) if s.is_enforced() => {}
            Some(s) => refused.push(s.to_string()),
            None => refused.push(format!(
                "{m}: missing (the {runtime} runtime has no such mechanism)"
            )),
        }
    }
    if !refused.is_empty() {
        let names: Vec<&str> = require
            .iter()
            .filter(|m| {
                !mechanisms
                    .iter()
                    .any(|s| s.mechanism == **m && s.is_enforced())
            })
            .map(|m| m.name())
            .collect();
        return Err(format!(
            "{tool}: refused: required mechanism not enforced on this host: {}; accept the degradation with `accept: [{}]` to run anyway, or see `cordon doctor`",
            refused.join("; "),
            names.join(", ")
        ));
    }
    Ok(mechanisms
        .iter()
        .filter(|s| !s.is_enforced())
        .map(|s| {
            if accept.contains(&s.mechanism) {
                format!("{s} [accepted]")
            } else {
                s.to_string()
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_and_missing_is_refused_by_name() {
        let ms = [
            MechanismState::enforced(Mechanism::Seccomp),
            MechanismState::missing(Mechanism::Cgroup, "no delegation; rlimits instead"),
        ];
        let e = hold(
            "t",
            "native",
            &[Mechanism::Seccomp, Mechanism::Cgroup],
            &[],
            &ms,
        )
        .expect_err("cgroup is required");
        assert!(e.contains("cgroup: missing (no delegation"), "{e}");
        assert!(e.contains("accept: [cgroup]"), "{e}");
        // Positive control: accepted, it runs with a warning.
        let w = hold(
            "t",
            "native",
            &[Mechanism::Seccomp],
            &[Mechanism::Cgroup],
            &ms,
        )
        .expect("accepted");
        assert_eq!(
            w,
            vec!["cgroup: missing (no delegation; rlimits instead) [accepted]"]
        );
    }

    #[test]
    fn partial_counts_as_not_enforced_and_unknown_as_missing() {
        let ms = [MechanismState::partial(Mechanism::Landlock, "ABI 3 < 6")];
        assert!(hold("t", "native", &[Mechanism::Landlock], &[], &ms).is_err());
        let e = hold("t", "native", &[Mechanism::Cgroup], &[], &ms).expect_err("unknown");
        assert!(e.contains("has no such mechanism"), "{e}");
        let w = hold("t", "native", &[], &[], &ms).expect("not required");
        assert_eq!(w, vec!["landlock: partial (ABI 3 < 6)"]);
    }
}
