//! Signed conformance reports: what `cordon probe --report FILE` writes,
//! and `cordon report verify FILE --key PUB` checks.
//!
//! A report file is one line of JSON, an envelope:
//! `{"format":"cordon-signed-report/1","report":B64,"signature":B64}`.
//! `report` is the base64 of the exact bytes of the report (JSON: see
//! [`Payload`]); `signature` is the base64 of the ed25519 signature, by the
//! host key (`cordon key init`), of [`CONTEXT`] followed by those bytes.
//! The bytes are signed as they are, never re-serialised; and the envelope
//! must be exactly as cordon writes it (re-encoding the parsed envelope
//! gives the file back byte for byte), so that any byte changed anywhere in
//! the file is refused.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow};
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use cordon_policy::ToolPolicy;
use cordon_probes::Report;

use crate::doctor;
use crate::exit;
use crate::key::{PublicKey, SigningKey};

/// The envelope's format.
pub const ENVELOPE: &str = "cordon-signed-report/1";
/// The report's format.
pub const FORMAT: &str = "cordon-report/1";
/// What is signed before the report's bytes: a signature made for anything
/// else with the same key is never a report's.
pub const CONTEXT: &[u8] = b"cordon-signed-report/1\n";

#[derive(clap::Subcommand, Debug)]
pub enum ReportCmd {
    /// Check a report's signature, then print what it proves: the host,
    /// its kernel, cordon's version, when the probes ran, each tool's
    /// verdicts and every escape. Exit 1 when the signature does not
    /// verify, 2 when the file is not a signed report.
    Verify {
        /// The report (`cordon probe --report FILE`).
        file: PathBuf,
        /// The public key (FILE.pub of `cordon key init`, or `cordon key show`).
        #[arg(long, value_name = "PUB")]
        key: PathBuf,
        /// Print the signed report itself (JSON) once it verifies.
        #[arg(long)]
        json: bool,
    },
}

/// What was probed: a manifest's tool, or a profile or prefix on its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Subject {
    /// The tool's name (or the profile or prefix probed).
    pub name: String,
    pub profile: String,
    /// The runtime its sandbox runs on (`native`, `gvisor`, `microvm`;
    /// `none` for P0 and a prefix).
    pub runtime: String,
    /// sha256 of the tool's resolved policy (the one `cordon inventory`
    /// records); none when no manifest tool was probed.
    pub policy_sha256: Option<String>,
}

impl Subject {
    pub fn tool(p: &ToolPolicy) -> Subject {
        Subject {
            name: p.name.clone(),
            profile: cordon_broker::profile_name(p.profile).to_string(),
            runtime: serde_json::to_value(p.runtime)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            policy_sha256: Some(crate::state::policy_digest(p)),
        }
    }

    pub fn bare(name: &str, profile: &str, runtime: &str) -> Subject {
        Subject {
            name: name.into(),
            profile: profile.into(),
            runtime: runtime.into(),
            policy_sha256: None,
        }
    }
}

/// One tool's part of a report.
#[derive(Serialize)]
struct ToolPart<'a> {
    #[serde(flatten)]
    subject: &'a Subject,
    /// The sandbox and every probe's verdict and evidence.
    probes: &'a Report,
}

/// A tool that could not be probed, and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NotProbed {
    pub tool: String,
    pub why: String,
}

/// The report that is signed.
#[derive(Serialize)]
struct Payload<'a> {
    format: &'static str,
    cordon_version: &'static str,
    /// `/proc/sys/kernel/hostname`.
    hostname: String,
    /// The fingerprint of the key that signs it.
    signing_key: String,
    /// When the run started and ended (RFC 3339, UTC).
    started: &'a str,
    ended: &'a str,
    /// `cordon doctor --json`: the host's facts, checks, runtimes and profiles.
    host: &'a doctor::Report,
    tools: Vec<ToolPart<'a>>,
    not_probed: &'a [NotProbed],
}

/// The envelope, in the order it is written.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    format: String,
    report: String,
    signature: String,
}

/// Everything a report holds, gathered by `cordon probe`.
pub struct Run<'a> {
    pub started: &'a str,
    pub ended: &'a str,
    pub host: &'a doctor::Report,
    pub tools: &'a [(Subject, Report)],
    pub not_probed: &'a [NotProbed],
}

/// The signed envelope of `run`, as the file's bytes.
pub fn sign(run: &Run<'_>, key: &SigningKey) -> anyhow::Result<Vec<u8>> {
    let payload = Payload {
        format: FORMAT,
        cordon_version: env!("CARGO_PKG_VERSION"),
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        signing_key: key.public().fingerprint(),
        started: run.started,
        ended: run.ended,
        host: run.host,
        tools: run
            .tools
            .iter()
            .map(|(subject, probes)| ToolPart { subject, probes })
            .collect(),
        not_probed: run.not_probed,
    };
    let bytes = serde_json::to_vec_pretty(&payload).context("encoding the report")?;
    Ok(envelope(&bytes, &key.sign(&signed_message(&bytes))))
}

fn signed_message(payload: &[u8]) -> Vec<u8> {
    let mut m = CONTEXT.to_vec();
    m.extend_from_slice(payload);
    m
}

fn envelope(payload: &[u8], signature: &[u8]) -> Vec<u8> {
    let b64 = &base64::engine::general_purpose::STANDARD;
    let env = Envelope {
        format: ENVELOPE.into(),
        report: b64.encode(payload),
        signature: b64.encode(signature),
    };
    // Strings of ASCII only: serialising cannot fail.
    let mut out = serde_json::to_vec(&env).unwrap_or_default();
    out.push(b'\n');
    out
}

/// Write `bytes` to `path` whole: a temporary file beside it, renamed over it.
pub fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Why a file is not a report that verifies.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// Not a signed report as cordon writes them.
    #[error("not a signed cordon report: {0}")]
    Malformed(String),
    /// The signature is not the key's over these bytes.
    #[error("{0}: the report was changed, or signed by another key")]
    BadSignature(#[from] crate::key::BadSignature),
}

/// The report's bytes, once the envelope `file` is well formed and its
/// signature verifies with `key`.
pub fn verify(file: &[u8], key: &PublicKey) -> Result<Vec<u8>, Refusal> {
    let malformed = |why: &str| Refusal::Malformed(why.to_string());
    let env: Envelope = serde_json::from_slice(file)
        .map_err(|e| Refusal::Malformed(format!("not the JSON envelope cordon writes ({e})")))?;
    if env.format != ENVELOPE {
        return Err(Refusal::Malformed(format!(
            "format {:?}, not {ENVELOPE:?}",
            env.format
        )));
    }
    let b64 = &base64::engine::general_purpose::STANDARD;
    let payload = b64
        .decode(&env.report)
        .map_err(|e| Refusal::Malformed(format!("the report is not base64 ({e})")))?;
    let signature = b64
        .decode(&env.signature)
        .map_err(|e| Refusal::Malformed(format!("the signature is not base64 ({e})")))?;
    if envelope(&payload, &signature) != file {
        return Err(malformed(
            "the file is not byte for byte the envelope cordon writes (changed, reformatted, or truncated)",
        ));
    }
    key.verify(&signed_message(&payload), &signature)?;
    Ok(payload)
}

/// The summary `report verify` prints of a report that verified.
#[derive(Debug, Deserialize)]
struct Proved {
    format: String,
    cordon_version: String,
    hostname: String,
    started: String,
    ended: String,
    host: ProvedHost,
    tools: Vec<ProvedTool>,
    not_probed: Vec<NotProbed>,
}

#[derive(Debug, Deserialize)]
struct ProvedHost {
    host: ProvedFacts,
}

#[derive(Debug, Deserialize)]
struct ProvedFacts {
    kernel: String,
    arch: String,
}

#[derive(Debug, Deserialize)]
struct ProvedTool {
    #[serde(flatten)]
    subject: Subject,
    probes: ProvedProbes,
}

#[derive(Debug, Deserialize)]
struct ProvedProbes {
    sandbox: String,
    results: Vec<ProvedResult>,
}

#[derive(Debug, Deserialize)]
struct ProvedResult {
    probe: String,
    /// As the probes' report writes a verdict: lowercase.
    verdict: String,
    evidence: String,
}

/// What a verified report proves, as lines of text.
fn summary(payload: &[u8]) -> Result<Vec<String>, Refusal> {
    let p: Proved = serde_json::from_slice(payload).map_err(|e| {
        Refusal::Malformed(format!("the signed report is not a {FORMAT} report ({e})"))
    })?;
    if p.format != FORMAT {
        return Err(Refusal::Malformed(format!(
            "the signed report's format is {:?}, not {FORMAT:?}",
            p.format
        )));
    }
    let mut out = vec![
        format!(
            "host {} (kernel {}, {}), cordon {}",
            p.hostname, p.host.host.kernel, p.host.host.arch, p.cordon_version
        ),
        format!("probed from {} to {}", p.started, p.ended),
    ];
    let mut escaped = Vec::new();
    for t in &p.tools {
        let count = |v: &str| t.probes.results.iter().filter(|r| r.verdict == v).count();
        let (held, esc, skipped) = (count("held"), count("escaped"), count("skipped"));
        let other = t.probes.results.len() - held - esc - skipped;
        out.push(format!(
            "tool {} ({}, {}{}): {held} held, {esc} escaped, {skipped} skipped, {other} not judged; sandbox {}",
            t.subject.name,
            t.subject.profile,
            t.subject.runtime,
            t.subject
                .policy_sha256
                .as_deref()
                .map(|h| format!(", policy sha256:{h}"))
                .unwrap_or_default(),
            t.probes.sandbox,
        ));
        for r in &t.probes.results {
            if r.verdict == "escaped" {
                escaped.push(format!(
                    "ESCAPED {} {}: {}",
                    t.subject.name, r.probe, r.evidence
                ));
            }
        }
    }
    for n in &p.not_probed {
        out.push(format!("tool {} not probed: {}", n.tool, n.why));
    }
    if escaped.is_empty() {
        out.push("no probe escaped".into());
    }
    out.extend(escaped);
    Ok(out)
}

pub fn run(cmd: ReportCmd) -> anyhow::Result<ExitCode> {
    let ReportCmd::Verify { file, key, json } = cmd;
    let public = PublicKey::load(&key)?;
    let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    let refused = |e: Refusal| {
        let code = match e {
            Refusal::BadSignature(_) => exit::FINDING,
            Refusal::Malformed(_) => exit::USAGE,
        };
        eprintln!(
            "cordon report verify: {}: refused: {e} ({})",
            file.display(),
            key.display()
        );
        Ok(ExitCode::from(code))
    };
    let payload = match verify(&bytes, &public) {
        Ok(p) => p,
        Err(e) => return refused(e),
    };
    let lines = match summary(&payload) {
        Ok(l) => l,
        Err(e) => return refused(e),
    };
    if json {
        println!("{}", String::from_utf8_lossy(&payload));
        return Ok(ExitCode::from(exit::OK));
    }
    println!(
        "{}: signature verifies with key {} ({})",
        file.display(),
        public.fingerprint(),
        key.display()
    );
    println!("it proves that this host key signed:");
    for l in lines {
        println!("  {l}");
    }
    Ok(ExitCode::from(exit::OK))
}

/// How many reports of one tool `cordon serve` keeps (the oldest go).
pub const KEPT_PER_TOOL: usize = 50;

/// Where `cordon serve` keeps a signed report of every probe run it makes
/// (scheduled, on SIGUSR1, on a changed input, on a reload), and the key
/// that signs them.
pub struct Keeper {
    dir: PathBuf,
    key: SigningKey,
}

impl Keeper {
    /// Reports in `dir` (made, mode 0700, when missing), signed with `key`.
    pub fn new(dir: PathBuf, key: SigningKey) -> anyhow::Result<Keeper> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("making the report directory {}", dir.display()))?;
        Ok(Keeper { dir, key })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sign and write the report of one run of `p`'s probes
    /// (`<tool>-<started>-<trigger>.json`), and remove that tool's oldest
    /// beyond [`KEPT_PER_TOOL`]. The file written.
    pub fn keep(
        &self,
        p: &ToolPolicy,
        report: &Report,
        started: &str,
        ended: &str,
        trigger: &str,
    ) -> anyhow::Result<PathBuf> {
        let host = doctor::collect(None).0;
        let tools = [(Subject::tool(p), report.clone())];
        let bytes = sign(
            &Run {
                started,
                ended,
                host: &host,
                tools: &tools,
                not_probed: &[],
            },
            &self.key,
        )?;
        let stamp: String = started
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let path = self.dir.join(format!("{}-{stamp}-{trigger}.json", p.name));
        write(&path, &bytes)?;
        self.prune(&p.name);
        Ok(path)
    }

    /// Keep the newest [`KEPT_PER_TOOL`] reports of `tool` (names sort by
    /// time: the stamp is RFC 3339 in UTC).
    fn prune(&self, tool: &str) {
        let prefix = format!("{tool}-");
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut mine: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.strip_prefix(&prefix).is_some_and(|rest| {
                        rest.starts_with(|c: char| c.is_ascii_digit()) && n.ends_with(".json")
                    })
                })
            })
            .collect();
        mine.sort();
        let excess = mine.len().saturating_sub(KEPT_PER_TOOL);
        for old in &mine[..excess] {
            let _ = std::fs::remove_file(old);
        }
    }
}

/// The key `probe --report` signs with: an error naming `cordon key init`
/// when there is none.
pub fn signing_key(given: Option<&Path>) -> anyhow::Result<SigningKey> {
    let path = crate::key::key_path(given)?;
    if !path.exists() {
        return Err(anyhow!(
            "--report: no signing key at {}; a report is never written unsigned: make one with `cordon key init`{}",
            path.display(),
            given
                .map(|p| format!(" --key {}", p.display()))
                .unwrap_or_default()
        ));
    }
    SigningKey::load(&path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keeper_keeps_the_newest_reports_of_each_tool() {
        let dir = cordon_testkit::scratch::scratch();
        crate::key::init(&dir.path().join("k.pem"), false).unwrap();
        let k = Keeper::new(
            dir.path().join("r"),
            SigningKey::load(&dir.path().join("k.pem")).unwrap(),
        )
        .unwrap();
        for i in 0..KEPT_PER_TOOL + 3 {
            for tool in ["wc", "wc-x"] {
                std::fs::write(
                    k.dir()
                        .join(format!("{tool}-2026-01-01T00-00-{i:02}Z-schedule.json")),
                    "",
                )
                .unwrap();
            }
        }
        k.prune("wc");
        let names: Vec<String> = std::fs::read_dir(k.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let of = |t: &str| {
            names
                .iter()
                .filter(|n| n.starts_with(&format!("{t}-2026")))
                .count()
        };
        assert_eq!(of("wc"), KEPT_PER_TOOL);
        // Another tool whose name starts alike is not touched.
        assert_eq!(of("wc-x"), KEPT_PER_TOOL + 3);
        assert!(!names.contains(&"wc-2026-01-01T00-00-00Z-schedule.json".to_string()));
    }

    #[test]
    fn an_envelope_verifies_only_unchanged_and_with_its_key() {
        let dir = cordon_testkit::scratch::scratch();
        let a = crate::key::init(&dir.path().join("a.pem"), false).unwrap();
        let b = crate::key::init(&dir.path().join("b.pem"), false).unwrap();
        let ka = SigningKey::load(&dir.path().join("a.pem")).unwrap();
        let payload = b"{\"format\":\"x\"}";
        let file = envelope(payload, &ka.sign(&signed_message(payload)));
        assert_eq!(verify(&file, &a).unwrap(), payload);
        assert!(matches!(verify(&file, &b), Err(Refusal::BadSignature(_))));
        // Every single byte changed, one at a time: refused, never verified.
        for i in 0..file.len() {
            for flip in [0x01, 0x20, 0x2a] {
                let mut f = file.clone();
                f[i] ^= flip;
                assert!(verify(&f, &a).is_err(), "byte {i} ^ {flip:#x} verified");
            }
        }
        for n in [0, 1, file.len() / 2, file.len() - 1] {
            assert!(matches!(verify(&file[..n], &a), Err(Refusal::Malformed(_))));
        }
        // Not signed with the context: not a report's signature.
        let bare = envelope(payload, &ka.sign(payload));
        assert!(matches!(verify(&bare, &a), Err(Refusal::BadSignature(_))));
    }
}
