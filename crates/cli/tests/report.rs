//! Signed conformance reports through the real CLI: `cordon key init`,
//! `cordon probe --report`, `cordon report verify`. A report verifies with
//! the key that signed it, and with no other key, nor after any one byte
//! of it changed, nor truncated.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cordon_testkit::Scratch;
use cordon_testkit::skip::{skip_or_fail, this_test};

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

/// A tool whose sandbox probes quickly.
const WC: &str =
    "tools:\n  wc:\n    profile: P1\n    command: [/usr/bin/wc]\n    limits: {wall_seconds: 3}\n";

/// The same, and one more with a host directory mounted "for debugging":
/// its `host_fs` probe escapes.
const LEAKY: &str = "tools:\n  wc:\n    profile: P1\n    command: [/usr/bin/wc]\n    limits: {wall_seconds: 3}\n  leaky:\n    profile: P1\n    command: [/usr/bin/wc]\n    limits: {wall_seconds: 3}\n    mounts: [\"/home:/home\"]\n";

struct Env {
    dir: Scratch,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: cordon_testkit::scratch::named("cordon-report-test-"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Run cordon with its state and configuration in this test's own
    /// directory.
    fn cordon(&self, args: &[&str]) -> Output {
        Command::new(CORDON)
            .args(args)
            .current_dir(self.dir.path())
            .env_remove("CORDON_MANIFEST")
            .env_remove("CORDON_REPORT_KEY")
            .env("CORDON_STATE_DIR", self.path("state"))
            .env("CORDON_CONFIG_DIR", self.path("config"))
            .env("CORDON_AUDIT", self.path("audit.jsonl"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("running cordon")
    }

    fn manifest(&self, yaml: &str) -> String {
        let m = self.path("m.yaml");
        std::fs::write(&m, yaml).unwrap();
        m.to_str().unwrap().to_string()
    }

    fn key(&self, name: &str) -> String {
        let k = self.path(name);
        let o = self.cordon(&["key", "init", "--key", k.to_str().unwrap()]);
        assert_eq!(code(&o), 0, "{}", text(&o.stderr));
        k.to_str().unwrap().to_string()
    }
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn key_init_makes_a_private_key_it_never_overwrites() {
    let env = Env::new();
    // The default place: the configuration directory.
    let o = env.cordon(&["key", "init"]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let key = env.path("config/report-key.pem");
    let public = text(&o.stdout);
    assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"), "{public}");
    assert_eq!(mode(&key), 0o600);
    assert!(
        std::fs::read_to_string(&key)
            .unwrap()
            .starts_with("-----BEGIN PRIVATE KEY-----")
    );
    let pubfile = env.path("config/report-key.pem.pub");
    assert_eq!(std::fs::read_to_string(&pubfile).unwrap(), public);
    let o = env.cordon(&["key", "show"]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), public);

    // A second init refuses, and the key is the same one.
    let before = std::fs::read(&key).unwrap();
    let o = env.cordon(&["key", "init"]);
    assert_eq!(code(&o), 2);
    assert!(
        text(&o.stderr).contains("refusing to overwrite"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(std::fs::read(&key).unwrap(), before);
    // --force replaces it (mode 0600 still), with another public key.
    let o = env.cordon(&["key", "init", "--force"]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    assert_ne!(std::fs::read(&key).unwrap(), before);
    assert_ne!(text(&o.stdout), public);
    assert_eq!(mode(&key), 0o600);
    assert_eq!(std::fs::read_to_string(&pubfile).unwrap(), text(&o.stdout));

    // Never inside the state directory.
    std::fs::create_dir_all(env.path("state")).unwrap();
    let inside = env.path("state/k.pem");
    let o = env.cordon(&["key", "init", "--key", inside.to_str().unwrap()]);
    assert_eq!(code(&o), 2);
    assert!(
        text(&o.stderr).contains("inside the state directory"),
        "{}",
        text(&o.stderr)
    );
    assert!(!inside.exists());
}

#[test]
fn a_report_is_never_written_without_a_key() {
    let env = Env::new();
    let m = env.manifest(WC);
    let o = env.cordon(&["probe", "-m", &m, "--report", "r.json"]);
    assert_eq!(code(&o), 2);
    let e = text(&o.stderr);
    assert!(
        e.contains("no signing key") && e.contains("cordon key init"),
        "{e}"
    );
    assert!(!env.path("r.json").exists());
    // A key in the environment asks for no report: a plain run is one.
    let o = Command::new(CORDON)
        .args(["probe", "-m", &m, "--only", "control"])
        .current_dir(env.dir.path())
        .env("CORDON_REPORT_KEY", env.path("absent.pem"))
        .env("CORDON_STATE_DIR", env.path("state"))
        .output()
        .unwrap();
    assert!([0, 3].contains(&code(&o)), "{}", text(&o.stderr));
    assert!(!env.path("r.json").exists());
}

/// The report's file after one byte changed.
fn flipped(bytes: &[u8], at: usize, mask: u8) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at] ^= mask;
    b
}

#[test]
fn a_report_verifies_with_its_key_only_and_unchanged_only() {
    let env = Env::new();
    let key = env.key("host.pem");
    let other = env.key("other.pem");
    let m = env.manifest(WC);
    let o = env.cordon(&[
        "probe", "-m", &m, "--report", "r.json", "--key", &key, "--junit", "j.xml",
    ]);
    // 3: a loaded host where some probe ran out of time even at the
    // longest wall; the report is written and signed all the same.
    assert!(
        [0, 3].contains(&code(&o)),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let report = env.path("r.json");
    assert!(
        std::fs::read_to_string(env.path("j.xml"))
            .unwrap()
            .contains("<testsuite"),
        "JUnit stays"
    );

    // The right key: verifies, and says what it proves.
    let o = env.cordon(&["report", "verify", "r.json", "--key", &format!("{key}.pub")]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("signature verifies with key sha256:"), "{out}");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(out.contains(&format!("kernel {}", kernel.trim())), "{out}");
    assert!(
        out.contains(&format!("cordon {}", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    assert!(out.contains("tool wc (P1, native, policy sha256:"), "{out}");
    assert!(out.contains("no probe escaped"), "{out}");

    // The signed report itself: doctor's facts, times, every probe.
    let o = env.cordon(&[
        "report",
        "verify",
        "r.json",
        "--key",
        &format!("{key}.pub"),
        "--json",
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["format"], "cordon-report/1");
    assert_eq!(v["host"]["host"]["kernel"], kernel.trim());
    assert!(v["host"]["profiles"].is_array(), "doctor's report: {v}");
    assert!(v["started"].as_str().unwrap() <= v["ended"].as_str().unwrap());
    let tool = &v["tools"][0];
    assert_eq!(tool["name"], "wc");
    assert_eq!(tool["runtime"], "native");
    assert_eq!(tool["policy_sha256"].as_str().unwrap().len(), 64);
    let results = tool["probes"]["results"].as_array().unwrap();
    assert!(
        results
            .iter()
            .any(|r| r["probe"] == "control" && r["verdict"] == "held"),
        "{tool}"
    );
    assert!(results.iter().all(|r| r["evidence"].is_string()));

    // Another key: refused, naming it.
    let o = env.cordon(&[
        "report",
        "verify",
        "r.json",
        "--key",
        &format!("{other}.pub"),
    ]);
    assert_eq!(code(&o), 1, "{}", text(&o.stdout));
    assert!(
        text(&o.stderr).contains("signature does not verify with key sha256:"),
        "{}",
        text(&o.stderr)
    );
    assert!(o.stdout.is_empty());

    // One byte changed: in the envelope's JSON, inside the signed
    // report's base64, inside the signature's, the last byte; each
    // refused, never verified.
    let bytes = std::fs::read(&report).unwrap();
    let text_of = String::from_utf8(bytes.clone()).unwrap();
    let report_at = text_of.find("\"report\":\"").unwrap() + 10;
    let sig_at = text_of.find("\"signature\":\"").unwrap() + 13;
    let positions = [
        0,
        3,
        report_at,
        report_at + 100,
        (report_at + sig_at) / 2,
        sig_at,
        sig_at + 40,
        bytes.len() - 3,
        bytes.len() - 1,
    ];
    let tampered = env.path("t.json");
    for at in positions {
        for mask in [0x01, 0x02, 0x20] {
            std::fs::write(&tampered, flipped(&bytes, at, mask)).unwrap();
            let o = env.cordon(&["report", "verify", "t.json", "--key", &format!("{key}.pub")]);
            let e = text(&o.stderr);
            assert!([1, 2].contains(&code(&o)), "byte {at} ^ {mask:#x}: {e}");
            assert!(
                e.contains("refused: signature does not verify with key")
                    || e.contains("refused: not a signed cordon report"),
                "byte {at} ^ {mask:#x}: {e}"
            );
            assert!(o.stdout.is_empty(), "byte {at} ^ {mask:#x}");
        }
    }
    // A byte inside the signed report, changed so that the base64 stays
    // valid: the signature does not verify.
    let b64 = |c: u8| c.is_ascii_alphanumeric();
    let at = (report_at + 200..sig_at)
        .find(|&i| bytes[i].is_ascii_lowercase() && bytes[i] != b'z')
        .unwrap();
    let mut b = bytes.clone();
    b[at] += 1;
    assert!(b64(b[at]));
    std::fs::write(&tampered, &b).unwrap();
    let o = env.cordon(&["report", "verify", "t.json", "--key", &format!("{key}.pub")]);
    assert_eq!(code(&o), 1, "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("signature does not verify with key"),
        "{}",
        text(&o.stderr)
    );

    // Truncated, or not a report at all: malformed.
    for keep in [0, 1, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&tampered, &bytes[..keep]).unwrap();
        let o = env.cordon(&["report", "verify", "t.json", "--key", &format!("{key}.pub")]);
        assert_eq!(code(&o), 2, "kept {keep}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains("refused: not a signed cordon report"),
            "kept {keep}: {}",
            text(&o.stderr)
        );
    }
    // Positive control: the untouched file still verifies.
    std::fs::write(&tampered, &bytes).unwrap();
    let o = env.cordon(&["report", "verify", "t.json", "--key", &format!("{key}.pub")]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
}

#[test]
fn a_report_names_every_escaped_probe() {
    if !Path::new("/home").is_dir() {
        skip_or_fail(&this_test(), "no /home on this host");
        return;
    }
    let env = Env::new();
    let key = env.key("host.pem");
    let m = env.manifest(LEAKY);
    let o = env.cordon(&[
        "probe", "-m", &m, "--only", "host_fs", "--report", "r.json", "--key", &key,
    ]);
    assert_eq!(code(&o), 1, "{}{}", text(&o.stdout), text(&o.stderr));
    let o = env.cordon(&["report", "verify", "r.json", "--key", &format!("{key}.pub")]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("ESCAPED leaky host_fs: "), "{out}");
    assert!(!out.contains("ESCAPED wc"), "{out}");
    assert!(out.contains("tool leaky (P1, native"), "{out}");
    assert!(!out.contains("no probe escaped"), "{out}");
}
