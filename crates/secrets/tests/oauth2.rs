//! The `oauth2` provider against real authorization servers on loopback,
//! over HTTPS with a test CA (tests/fixtures/oauth2-server.mjs):
//! oauth2-mock-server for client credentials and RFC 7009 revocation, and
//! an RFC 8693 token-exchange grant on @node-oauth/oauth2-server (which
//! oauth2-mock-server lacks). Both are installed by scripts/setup.sh.

use cordon_testkit::skip;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use cordon_policy::ToolPolicy;
use cordon_secrets::{CredentialBroker, config};

fn npm_dir() -> PathBuf {
    std::env::var_os("CORDON_E2E_NPM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e/npm"))
}

struct Servers {
    child: Child,
    cc: u16,
    te: u16,
    log: PathBuf,
    ca: PathBuf,
    dir: cordon_testkit::Scratch,
}

impl Drop for Servers {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Servers {
    fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// A test CA and a certificate for 127.0.0.1 signed by it.
fn make_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let st = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stderr(Stdio::null())
            .status()
            .expect("openssl");
        assert!(st.success(), "openssl {args:?}");
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=cordon test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "srv.key",
        "-out",
        "srv.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "srv.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "srv.pem",
        "-days",
        "2",
        "-extfile",
        "ext",
    ]);
    (dir.join("ca.pem"), dir.join("srv.key"), dir.join("srv.pem"))
}

fn start() -> Option<Servers> {
    let npm = npm_dir();
    for m in ["oauth2-mock-server", "@node-oauth/oauth2-server"] {
        if !npm
            .join("node_modules")
            .join(m)
            .join("package.json")
            .is_file()
        {
            skip::skip_or_fail(
                &skip::this_test(),
                &format!(
                    "{m} is not installed under {} (scripts/setup.sh)",
                    npm.display()
                ),
            );
            return None;
        }
    }
    let dir = cordon_testkit::scratch();
    let (ca, key, cert) = make_ca(dir.path());
    let log = dir.path().join("requests.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oauth2-server.mjs");
    let mut child = match Command::new("node")
        .arg(&script)
        .arg(&npm)
        .arg(&log)
        .arg(&key)
        .arg(&cert)
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            skip::skip_or_fail(&skip::this_test(), &format!("node cannot be started: {e}"));
            return None;
        }
    };
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut ports = std::collections::BTreeMap::new();
    for _ in 0..2 {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let (k, v) = line
            .trim()
            .split_once(' ')
            .unwrap_or_else(|| panic!("the OAuth2 servers did not start: {line:?}"));
        ports.insert(k.to_string(), v.parse::<u16>().unwrap());
    }
    Some(Servers {
        child,
        cc: ports["cc"],
        te: ports["te"],
        log,
        ca,
        dir,
    })
}

fn private(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn tool(secret: &str) -> ToolPolicy {
    let y = format!(
        "tools:\n  jira:\n    profile: P2\n    command: [/bin/true]\n    egress: [\"jira.internal.example:443\"]\n    secrets:\n      - {secret}\n"
    );
    cordon_policy::load_str(Path::new("m.yaml"), &y)
        .unwrap()
        .policy
        .tools["jira"]
        .clone()
}

fn broker(s: &Servers, providers: &str) -> Arc<CredentialBroker> {
    let p = s.dir.path().join("providers.yaml");
    private(&p, providers);
    let b = Arc::new(CredentialBroker::new(config::load(&p).unwrap()).unwrap());
    b.on_event(Arc::new(|_| Ok(())));
    b
}

fn b64(s: &str) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn client_credentials_mint_with_scope_and_audience_and_revoke_at_session_end() {
    let Some(s) = start() else { return };
    let secret = s.dir.path().join("client.secret");
    private(&secret, "s3cr3t\n");
    let b = broker(
        &s,
        &format!(
            "default: idp\nproviders:\n  idp:\n    type: oauth2\n    token_endpoint: https://127.0.0.1:{p}/token\n    revocation_endpoint: https://127.0.0.1:{p}/revoke\n    client_id: cordon\n    client_secret_file: {}\n    ca_file: {}\n",
            secret.display(),
            s.ca.display(),
            p = s.cc
        ),
    );
    let t = tool("{name: JIRA_TOKEN, scope: \"read:issues\", ttl: 60, audience: jira-api}");
    let lease = b.mint(&t, "sess-1").unwrap();
    let source = lease.source("JIRA_TOKEN").unwrap();
    let token = source.current().unwrap().to_string();
    assert!(!token.is_empty());
    // What the server received: the grant, the manifest's scope and
    // audience, the client authenticated with Basic.
    let reqs = s.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(reqs[0]["endpoint"], "token");
    assert_eq!(reqs[0]["body"]["grant_type"], "client_credentials");
    assert_eq!(reqs[0]["body"]["scope"], "read:issues");
    assert_eq!(reqs[0]["body"]["audience"], "jira-api");
    assert_eq!(
        reqs[0]["authorization"],
        format!("Basic {}", b64("cordon:s3cr3t"))
    );
    assert!(reqs[0]["body"].get("client_secret").is_none());
    // The sandbox sees a placeholder only.
    let creds = lease.credentials().unwrap();
    assert!(creds.env[0].1.starts_with("cordon-ph-"));
    assert_ne!(creds.env[0].1.as_str(), token);
    drop(creds);
    // Session end: RFC 7009 revocation of exactly that token.
    drop(lease);
    let reqs = s.requests();
    let revokes: Vec<_> = reqs.iter().filter(|r| r["endpoint"] == "revoke").collect();
    assert_eq!(revokes.len(), 1, "{reqs:?}");
    assert_eq!(revokes[0]["body"]["token"], token.as_str());
    assert_eq!(revokes[0]["body"]["token_type_hint"], "access_token");
    assert!(source.current().unwrap_err().contains("revoked"));
}

#[test]
fn token_exchange_sends_the_subject_token_scope_and_audience() {
    let Some(s) = start() else { return };
    let subject = s.dir.path().join("subject");
    private(&subject, "broker-subject-token\n");
    let client = s.dir.path().join("client.secret");
    private(&client, "te-secret");
    let b = broker(
        &s,
        &format!(
            "providers:\n  sts:\n    type: oauth2\n    grant: token_exchange\n    token_endpoint: https://127.0.0.1:{}/token\n    client_id: cordon-te\n    client_secret_file: {}\n    subject_token_file: {}\n    ca_file: {}\n",
            s.te,
            client.display(),
            subject.display(),
            s.ca.display()
        ),
    );
    let t = tool(
        "{name: JIRA_TOKEN, scope: \"read:issues\", ttl: 60, provider: sts, audience: \"https://jira.internal.example\"}",
    );
    let lease = b.mint(&t, "sess-te").unwrap();
    let token = lease.source("JIRA_TOKEN").unwrap().current().unwrap();
    assert!(token.starts_with("te-token-"), "{}", token.len());
    let reqs = s.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let body = &reqs[0]["body"];
    assert_eq!(
        body["grant_type"],
        "urn:ietf:params:oauth:grant-type:token-exchange"
    );
    assert_eq!(body["subject_token"], "broker-subject-token");
    assert_eq!(
        body["subject_token_type"],
        "urn:ietf:params:oauth:token-type:access_token"
    );
    assert_eq!(body["scope"], "read:issues");
    assert_eq!(body["audience"], "https://jira.internal.example");
    // No revocation endpoint configured: the token is zeroised here and
    // expires by its ttl.
    drop(lease);
    assert_eq!(s.requests().len(), 1);

    // A refused exchange (a wrong subject token) fails the session with
    // the server's error, not the subject token.
    private(&subject, "wrong-subject\n");
    let err = b.mint(&t, "sess-te-2").unwrap_err();
    assert!(err.contains("refused the token request"), "{err}");
    assert!(!err.contains("wrong-subject"), "{err}");
}

#[test]
fn an_endpoint_whose_certificate_the_ca_file_does_not_sign_is_refused() {
    let Some(s) = start() else { return };
    let other = cordon_testkit::scratch();
    let (other_ca, _, _) = make_ca(other.path());
    let mk = |ca: &Path| {
        broker(
            &s,
            &format!(
                "default: idp\nproviders:\n  idp:\n    type: oauth2\n    token_endpoint: https://127.0.0.1:{}/token\n    client_id: cordon\n    ca_file: {}\n",
                s.cc,
                ca.display()
            ),
        )
    };
    let t = tool("{name: JIRA_TOKEN, scope: r, ttl: 60}");
    let err = mk(&other_ca).mint(&t, "x").unwrap_err();
    assert!(
        err.contains("certificate") || err.contains("Unknown"),
        "{err}"
    );
    assert!(s.requests().is_empty());
    // Positive control: the right CA.
    assert!(mk(&s.ca).mint(&t, "x").is_ok());
}
