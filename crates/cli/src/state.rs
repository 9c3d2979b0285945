//! cordon's state directory, and what `cordon probe` records there for
//! `cordon inventory`: per tool, when its sandbox's probes last ran, with
//! which verdicts, and for which resolved policy.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use cordon_policy::ToolPolicy;
use cordon_probes::{Report, Verdict};

/// `$CORDON_STATE_DIR`, else `/var/lib/cordon` as root, else
/// `$XDG_STATE_HOME/cordon` (or `~/.local/state/cordon`): the same
/// directory the MCP listing cache lives under (see `cordon_dirs`).
/// `Err`: no safe place, saying what to set.
pub fn state_dir() -> anyhow::Result<PathBuf> {
    cordon_dirs::Dirs::current()
        .state()
        .map_err(|e| anyhow::anyhow!(e))
}

/// One tool's last probe run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeRecord {
    pub tool: String,
    /// When it ran (RFC 3339, UTC).
    pub at: String,
    /// Every probe held (or was skipped as not applicable) and the
    /// controls passed.
    pub passed: bool,
    pub held: usize,
    pub escaped: usize,
    pub skipped: usize,
    /// Probes that could not be judged (errors, failed controls).
    pub other: usize,
    /// sha256 of the tool's resolved policy the run was for.
    pub policy_sha256: String,
    /// When `passed`, the same as `at`; otherwise the last run that passed
    /// (kept from the previous record).
    pub last_passed: Option<String>,
}

/// The digest of a resolved policy (its JSON form).
pub fn policy_digest(p: &ToolPolicy) -> String {
    let json = serde_json::to_vec(p).unwrap_or_default();
    hex::encode(sha2::Sha256::digest(json))
}

fn probes_file(dir: &Path) -> PathBuf {
    dir.join("probes.json")
}

/// Every recorded tool, by name (empty when nothing was recorded).
pub fn probe_records(dir: &Path) -> anyhow::Result<BTreeMap<String, ProbeRecord>> {
    let path = probes_file(dir);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).with_context(|| format!("reading {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// A record for `report`, a run on `p`'s sandbox.
pub fn record_of(p: &ToolPolicy, report: &Report, now: String) -> ProbeRecord {
    let count = |v: Verdict| report.results.iter().filter(|r| r.verdict == v).count();
    let held = count(Verdict::Held);
    let escaped = count(Verdict::Escaped);
    let skipped = count(Verdict::Skipped);
    let passed = report.exit_code() == cordon_probes::report::EXIT_ALL_HELD;
    ProbeRecord {
        tool: p.name.clone(),
        at: now.clone(),
        passed,
        held,
        escaped,
        skipped,
        other: report.results.len() - held - escaped - skipped,
        policy_sha256: policy_digest(p),
        last_passed: passed.then_some(now),
    }
}

/// Merge `new` into the records in `dir` (made if missing), keeping each
/// tool's last passing run, and replace the file in one rename.
pub fn save_probe_records(dir: &Path, new: Vec<ProbeRecord>) -> anyhow::Result<()> {
    let mut all = probe_records(dir).unwrap_or_default();
    for mut r in new {
        if r.last_passed.is_none()
            && let Some(old) = all.get(&r.tool)
            && old.policy_sha256 == r.policy_sha256
        {
            r.last_passed = old.last_passed.clone();
        }
        all.insert(r.tool.clone(), r);
    }
    replace_file(dir, "probes.json", &all)
}

/// Write `value` as JSON to `dir/name` (the directory made private if
/// missing): whole, to a temporary file of mode 0600 renamed over it, so a
/// reader never sees half of it.
pub fn replace_file(dir: &Path, name: &str, value: &impl Serialize) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    cordon_dirs::ensure_private(dir, cordon_sys::io::geteuid())
        .with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let text = serde_json::to_vec_pretty(value).with_context(|| format!("encoding {name}"))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(&text)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
}

/// Now, RFC 3339 in UTC.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(tool: &str, passed: bool, at: &str, digest: &str) -> ProbeRecord {
        ProbeRecord {
            tool: tool.into(),
            at: at.into(),
            passed,
            held: 1,
            escaped: usize::from(!passed),
            skipped: 0,
            other: 0,
            policy_sha256: digest.into(),
            last_passed: passed.then(|| at.to_string()),
        }
    }

    #[test]
    fn a_failed_run_keeps_the_last_pass_of_the_same_policy_only() {
        let d = std::env::temp_dir().join(format!("cordon-state-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        assert!(probe_records(&d).unwrap().is_empty());
        save_probe_records(
            &d,
            vec![rec("a", true, "t1", "x"), rec("b", true, "t1", "x")],
        )
        .unwrap();
        save_probe_records(
            &d,
            vec![rec("a", false, "t2", "x"), rec("b", false, "t2", "y")],
        )
        .unwrap();
        let all = probe_records(&d).unwrap();
        assert_eq!(all["a"].at, "t2");
        assert!(!all["a"].passed);
        assert_eq!(all["a"].last_passed.as_deref(), Some("t1"));
        // Another policy: its earlier pass was for something else.
        assert_eq!(all["b"].last_passed, None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
