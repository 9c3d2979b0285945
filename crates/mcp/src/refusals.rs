//! The egress a long-lived server was refused, kept so that the call it
//! happened during can say so: a server that fails because its network
//! access was refused (a package fetched at run time, an API not in the
//! allowlist) often answers only "Error executing tool", and the reason is
//! otherwise in the audit log alone.

use std::collections::VecDeque;
use std::sync::Mutex;

/// How many refusals are kept; older ones are dropped (the audit log has
/// them all).
const KEPT: usize = 32;

/// The refusals of one server's sandbox, numbered in the order they came.
#[derive(Debug, Default)]
pub struct Refusals {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// How many refusals came so far.
    count: u64,
    /// The last [`KEPT`], with their numbers.
    last: VecDeque<(u64, String)>,
}

impl Refusals {
    /// Keep one refusal: `target` (`host:port`) and why.
    pub fn push(&self, target: &str, why: &str) {
        let Ok(mut i) = self.inner.lock() else { return };
        i.count += 1;
        let n = i.count;
        if i.last.len() == KEPT {
            i.last.pop_front();
        }
        i.last.push_back((n, format!("{target}: {why}")));
    }

    /// A mark to ask [`Refusals::since`] with: how many came so far.
    pub fn mark(&self) -> u64 {
        self.inner.lock().map(|i| i.count).unwrap_or_default()
    }

    /// The refusals that came after `mark`, each once (the same target and
    /// reason repeated is said once).
    pub fn since(&self, mark: u64) -> Vec<String> {
        let Ok(i) = self.inner.lock() else {
            return Vec::new();
        };
        let mut out: Vec<String> = Vec::new();
        for (_, what) in i.last.iter().filter(|(n, _)| *n > mark) {
            if !out.contains(what) {
                out.push(what.clone());
            }
        }
        out
    }
}

/// The line a call's result gets for the refusals during it.
pub fn note(refused: &[String]) -> String {
    format!(
        "cordon: while this call ran, the server's network access was refused by its manifest (see `cordon audit query --denied`): {}",
        refused.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refusals_after_the_mark_are_said_each_once() {
        let r = Refusals::default();
        r.push("a.test:443", "not allowed");
        let m = r.mark();
        assert!(r.since(m).is_empty());
        r.push("b.test:443", "not allowed");
        r.push("b.test:443", "not allowed");
        r.push("c.test:80", "not allowed");
        assert_eq!(
            r.since(m),
            ["b.test:443: not allowed", "c.test:80: not allowed"]
        );
        for n in 0..100 {
            r.push(&format!("d{n}.test:1"), "x");
        }
        assert_eq!(r.since(0).len(), KEPT, "bounded");
    }
}
