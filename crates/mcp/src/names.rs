//! Which tool or server each exposed name belongs to, for the gateway's
//! life: every exposed tool and prompt name maps to exactly one owner.
//!
//! Command tools and the names a manifest fixes (`rename` targets, `allow`
//! entries in their exposed form) are claimed when the gateway starts; the
//! manifest's load already refused any of them given twice. A name a
//! server gives at listing time is claimed then: the first server to list
//! it keeps it, and a later server listing the same name has that tool or
//! prompt refused and reported, never resolved at call time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// What an exposed name belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A command tool of the manifest.
    Command(String),
    /// An `mcp:` tool (server) of the manifest.
    Server(String),
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Command(n) => write!(f, "the command tool `{n}`"),
            Owner::Server(n) => write!(f, "a name of server `{n}`"),
        }
    }
}

/// Tool and prompt names (two namespaces) and their owners.
#[derive(Default)]
pub(crate) struct NameClaims {
    tools: Mutex<BTreeMap<String, Owner>>,
    prompts: Mutex<BTreeMap<String, Owner>>,
    reported: Mutex<BTreeSet<String>>,
}

/// Tools or prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space {
    Tools,
    Prompts,
}

impl NameClaims {
    fn map(&self, space: Space) -> &Mutex<BTreeMap<String, Owner>> {
        match space {
            Space::Tools => &self.tools,
            Space::Prompts => &self.prompts,
        }
    }

    /// Claim `name` for `owner`; `Err` with the owner that has it already.
    pub fn claim(&self, space: Space, name: &str, owner: Owner) -> Result<(), Owner> {
        let Ok(mut m) = self.map(space).lock() else {
            return Err(owner);
        };
        match m.get(name) {
            Some(o) if *o != owner => Err(o.clone()),
            Some(_) => Ok(()),
            None => {
                m.insert(name.to_owned(), owner);
                Ok(())
            }
        }
    }

    /// A reload: every name of the owners in `release` is given up and
    /// each of `claims` claimed, all or nothing. `Err` with the first name
    /// another owner keeps (and that owner); then nothing changed.
    pub fn replace(
        &self,
        release: &[Owner],
        claims: &[(Space, String, Owner)],
    ) -> Result<(), (String, Owner)> {
        let (Ok(mut tools), Ok(mut prompts)) = (self.tools.lock(), self.prompts.lock()) else {
            return Err(("(all)".into(), Owner::Command("(a thread panicked)".into())));
        };
        let mut next = [tools.clone(), prompts.clone()];
        for m in next.iter_mut() {
            m.retain(|_, o| !release.contains(o));
        }
        for (space, name, owner) in claims {
            let m = &mut next[match space {
                Space::Tools => 0,
                Space::Prompts => 1,
            }];
            match m.get(name) {
                Some(o) if o != owner => return Err((name.clone(), o.clone())),
                _ => {
                    m.insert(name.clone(), owner.clone());
                }
            }
        }
        let [t, p] = next;
        *tools = t;
        *prompts = p;
        Ok(())
    }

    /// The owner of `name`, if any has claimed it.
    pub fn owner(&self, space: Space, name: &str) -> Option<Owner> {
        self.map(space).lock().ok()?.get(name).cloned()
    }

    /// Print `message` on stderr, once for the gateway's life.
    pub fn report_once(&self, message: &str) {
        let first = self
            .reported
            .lock()
            .map(|mut r| r.insert(message.to_owned()))
            .unwrap_or(true);
        if first {
            eprintln!("cordon: warning: {message}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_claim_keeps_a_name() {
        let c = NameClaims::default();
        c.claim(Space::Tools, "read", Owner::Server("a".into()))
            .unwrap();
        // The same owner again (a restart re-lists): fine.
        c.claim(Space::Tools, "read", Owner::Server("a".into()))
            .unwrap();
        assert_eq!(
            c.claim(Space::Tools, "read", Owner::Server("b".into())),
            Err(Owner::Server("a".into()))
        );
        // Prompts are another namespace.
        c.claim(Space::Prompts, "read", Owner::Server("b".into()))
            .unwrap();
        assert_eq!(
            c.owner(Space::Tools, "read"),
            Some(Owner::Server("a".into()))
        );
    }

    #[test]
    fn a_reload_releases_and_claims_all_or_nothing() {
        let c = NameClaims::default();
        let a = || Owner::Server("a".into());
        let b = || Owner::Server("b".into());
        c.claim(Space::Tools, "a__x", a()).unwrap();
        c.claim(Space::Tools, "b__x", b()).unwrap();
        // `b`'s name taken by `a`, `b` not released: refused, nothing changed.
        assert_eq!(
            c.replace(
                &[a()],
                &[
                    (Space::Tools, "a__y".into(), a()),
                    (Space::Tools, "b__x".into(), a())
                ]
            ),
            Err(("b__x".into(), b()))
        );
        assert_eq!(c.owner(Space::Tools, "a__x"), Some(a()));
        assert_eq!(c.owner(Space::Tools, "a__y"), None);
        // `b` released, its name claimed by a command tool.
        c.replace(
            &[b()],
            &[(Space::Tools, "b__x".into(), Owner::Command("b__x".into()))],
        )
        .unwrap();
        assert_eq!(
            c.owner(Space::Tools, "b__x"),
            Some(Owner::Command("b__x".into()))
        );
        assert_eq!(c.owner(Space::Tools, "a__x"), Some(a()));
    }
}
