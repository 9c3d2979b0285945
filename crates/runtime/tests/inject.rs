//! Credential injection in a real sandbox: the tool sees only placeholders
//! (in its environment); curl, Python `requests` (both through the proxy
//! door) and Node's `fetch` (which ignores the proxy variables: the DNS and
//! transparent doors) trust the session CA with no flag of their own, and
//! the placeholder reaches the bound loopback upstream as the real token,
//! over HTTPS and HTTP. Anywhere else (another allowed host, a denied host,
//! a body, base64, Basic auth to the wrong host) it is refused; the token is
//! nowhere in the sandbox nor in what cordon reports.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_egress::{Binding, HostPort, Injection, Injections, Placement, TokenSource};
use cordon_runtime::native::Native;
use cordon_runtime::{
    Context, Credentials, EgressEvent, EgressPolicy, Network, Root, Runtime, SandboxSpec, Status,
};
use zeroize::Zeroizing;

use cordon_testkit::image;
use cordon_testkit::skip;
use cordon_testkit::upstream::{Log, test_pki, upstream};

const PH: &str = "cordon-ph-Jr4Qn8Wc2Lx6Vb0Tz5Hm9Ks3";
const TOKEN: &str = "jira-real-token-5b1f0c9e77a2d4836e";
const PH_PLAIN: &str = "cordon-ph-Pw7Dk2Rt9Yb4Nc6Xv1Qs8Lm3";
const TOKEN_PLAIN: &str = "plain-real-token-0e4d9a2b6c8f13";

struct Fixed(&'static str);

impl TokenSource for Fixed {
    fn current(&self) -> Result<Zeroizing<String>, String> {
        Ok(Zeroizing::new(self.0.to_string()))
    }
}

fn have(prog: &str, args: &[&str]) -> bool {
    std::process::Command::new(prog)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// An allowlist of `entries` on loopback: the names resolve to 127.0.0.1
/// (denied.test too, which is not allowed), no upstream DNS.
fn loopback_policy(entries: Vec<String>) -> EgressPolicy {
    let mut policy = EgressPolicy::allowlist("jira_search", entries).unwrap();
    for n in ["api.test", "other.test", "denied.test"] {
        policy
            .resolve
            .insert(n.into(), IpAddr::from([127, 0, 0, 1]));
    }
    policy.allow_cidrs.push("127.0.0.1/32".parse().unwrap());
    policy.upstream_dns = Some("127.0.0.1:9".parse().unwrap());
    policy
}

/// JIRA_TOKEN: a bearer token bound to `https://api.test:{port}/rest`.
fn jira_injection(port: u16, upstream_ca: &std::path::Path) -> Injection {
    Injection {
        secret: "JIRA_TOKEN".into(),
        placeholder: PH.into(),
        binding: Binding {
            host: "api.test".into(),
            port,
            path_prefix: Some("/rest".into()),
            placement: Placement::Header {
                name: "Authorization".into(),
                template: "Bearer {token}".into(),
            },
            upstream_ca: Some(upstream_ca.to_path_buf()),
        },
        source: Arc::new(Fixed(TOKEN)),
    }
}

/// What a sandbox running one of the scripts printed.
struct Printed {
    out: String,
    err: String,
}

impl Printed {
    /// The status of `CASE name`.
    fn case(&self, name: &str) -> String {
        let Printed { out, err } = self;
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("CASE {name} ")))
            .unwrap_or_else(|| panic!("no case {name}: {out} {err}"))
            .to_string()
    }

    /// The half token nowhere in the sandbox (the scan ran and looked at
    /// files).
    fn assert_scan_clean(&self) {
        let Printed { out, err } = self;
        let scan = out
            .lines()
            .find(|l| l.starts_with("SCANNED"))
            .unwrap_or_else(|| panic!("{out} {err}"));
        assert!(scan.ends_with("HITS []"), "{scan}");
        let n: usize = scan.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(n >= 5, "{scan}");
    }

    /// The trust bundle: the host's roots plus the session CA, where the
    /// jail puts it, linked and named by the three variables.
    fn assert_bundle(&self) {
        let bundle = self.out.lines().find(|l| l.starts_with("BUNDLE ")).unwrap();
        let f: Vec<&str> = bundle.split_whitespace().collect();
        assert!(f[1].parse::<usize>().unwrap() >= 2, "{bundle}");
        assert_eq!(
            &f[2..],
            [
                "/etc/ssl/certs/ca-certificates.crt",
                "/etc/ssl/certs/ca-certificates.crt",
                "/etc/ssl/certs/ca-certificates.crt"
            ]
        );
    }
}

/// What arrived upstream: the token on `with_token` bound requests only,
/// each with its bearer header on a `/rest/` path; never a placeholder,
/// never a refused request.
fn assert_upstream_saw(seen: &[String], with_token: usize, placeholders: &[&str]) {
    let got: Vec<&String> = seen.iter().filter(|s| s.contains(TOKEN)).collect();
    assert_eq!(got.len(), with_token, "{seen:#?}");
    for s in &got {
        assert!(
            s.contains(&format!("authorization: Bearer {TOKEN}\n")),
            "{s}"
        );
        assert!(s.contains("/rest/"), "{s}");
    }
    for s in seen {
        for ph in placeholders {
            assert!(!s.contains(ph), "a placeholder reached the upstream: {s}");
        }
        assert!(
            !s.contains("/rest/x"),
            "a refused request reached the upstream: {s}"
        );
    }
}

/// The events: `used` requests got JIRA_TOKEN, `exfil` were refused as
/// exfiltration of it.
fn assert_jira_events(ev: &[EgressEvent], used: usize, exfil: usize) {
    let got = ev
        .iter()
        .filter(|e| e.injected == vec!["JIRA_TOKEN".to_string()])
        .count();
    assert_eq!(got, used, "{ev:#?}");
    let got = ev
        .iter()
        .filter(|e| e.exfiltration.as_deref() == Some("JIRA_TOKEN"))
        .count();
    assert_eq!(got, exfil, "{ev:#?}");
}

/// Python's `case(name, f)`: prints `CASE <name> <http status>`, or the
/// error's type.
macro_rules! py_case {
    () => {
        r#"def case(name, f):
    try:
        print("CASE", name, f().status_code, flush=True)
    except Exception as e:
        print("CASE", name, "error", type(e).__name__, flush=True)
"#
    };
}

/// A scan for the half token given on stdin in the environment and command
/// line of every process and every file of /etc, /tmp and /dev: prints
/// `SCANNED <files> HITS <where>`. The half is not the token; finding it
/// would mean the token is there.
macro_rules! scan_for_token {
    () => {
        r#"python3 -c '
import os, sys
half = sys.stdin.read().strip().encode()
hits = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for f in ("environ", "cmdline"):
            try:
                if half in open(f"/proc/{pid}/{f}", "rb").read(): hits.append(f"/proc/{pid}/{f}")
            except OSError: pass
n = 0
for top in ("/etc", "/tmp", "/dev"):
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            try:
                if os.path.isfile(p):
                    n += 1
                    if half in open(p, "rb").read(): hits.append(p)
            except OSError: pass
print("SCANNED", n, "HITS", hits)
'
"#
    };
}

/// What the sandbox runs: each case prints `CASE <name> <http status>`.
const SCRIPT: &str = concat!(
    r#"
set -u
c() { name=$1; shift; printf 'CASE %s %s\n' "$name" "$(curl -sS -o /dev/null -w '%{http_code}' --max-time 20 "$@" 2>/dev/null)"; }
c curl-https -H "Authorization: Bearer $JIRA_TOKEN" "https://api.test:$TLS/rest/api/2/search?jql=x"
c curl-http -H "X-Api-Key: $PLAIN_KEY" "http://api.test:$PLAIN/v1/ping"
c curl-control-other-http "http://other.test:$PLAIN/plain"
c curl-other-host -H "Authorization: Bearer $JIRA_TOKEN" "https://other.test:$TLS/rest/x"
c curl-denied-host -H "Authorization: Bearer $JIRA_TOKEN" "https://denied.test:$TLS/rest/x"
c curl-body --data "token=$JIRA_TOKEN" "https://api.test:$TLS/rest/x"
c curl-base64 --data "$(printf 'x%s' "$JIRA_TOKEN" | base64 -w0)" "https://api.test:$TLS/rest/x"
c curl-basic-wrong-host -u "bot:$JIRA_TOKEN" "https://other.test:$TLS/rest/x"
python3 - <<'PY'
import os, base64, requests
tls, plain = os.environ["TLS"], os.environ["PLAIN"]
ph = os.environ["JIRA_TOKEN"]
"#,
    py_case!(),
    r#"case("py-https", lambda: requests.get(f"https://api.test:{tls}/rest/py", headers={"Authorization": "Bearer " + ph}, timeout=20))
case("py-http", lambda: requests.get(f"http://api.test:{plain}/v1/py", headers={"X-Api-Key": os.environ["PLAIN_KEY"]}, timeout=20))
case("py-other-host", lambda: requests.get(f"https://other.test:{tls}/rest/x", headers={"Authorization": "Bearer " + ph}, timeout=20))
case("py-basic-wrong-host", lambda: requests.get(f"https://other.test:{tls}/rest/x", auth=("bot", ph), timeout=20))
case("py-base64-body", lambda: requests.post(f"https://api.test:{tls}/rest/x", data=base64.urlsafe_b64encode(("ab" + ph).encode()), timeout=20))
PY
node -e '
const tls = process.env.TLS, ph = process.env.JIRA_TOKEN;
async function c(name, url, opts) {
  try { const r = await fetch(url, opts); await r.text(); console.log("CASE", name, r.status); }
  catch (e) { console.log("CASE", name, "error", String(e.cause && e.cause.code || e)); }
}
(async () => {
  await c("node-https", `https://api.test:${tls}/rest/node`, {headers: {authorization: "Bearer " + ph}});
  await c("node-http", `http://api.test:${process.env.PLAIN}/v1/node`, {headers: {"x-api-key": process.env.PLAIN_KEY}});
  await c("node-other-host", `https://other.test:${tls}/rest/x`, {headers: {authorization: "Bearer " + ph}});
  await c("node-body", `https://api.test:${tls}/rest/x`, {method: "POST", body: JSON.stringify({t: ph})});
})();
'
# The token nowhere in the sandbox: environments and command lines of every
# process, and every file of /etc, /tmp and /dev. The half given on stdin
# is not the token; finding it would mean the token is there.
"#,
    scan_for_token!(),
    r#"echo "BUNDLE $(grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt) $(readlink /etc/ssl/cert.pem) $SSL_CERT_FILE $NODE_EXTRA_CA_CERTS"
"#,
);

#[test]
fn placeholders_become_tokens_only_at_the_bound_endpoint_for_curl_python_and_node() {
    let test = "placeholders_become_tokens_only_at_the_bound_endpoint_for_curl_python_and_node";
    if !cordon_testkit::is_root() {
        skip::skip_or_fail(test, "not root: the egress doors need network namespaces");
        return;
    }
    for (prog, args) in [("curl", ["--version"]), ("/usr/bin/node", ["--version"])] {
        if !have(prog, &args) {
            skip::skip_or_fail(test, &format!("{prog} is not installed (scripts/setup.sh)"));
            return;
        }
    }
    if !have("/usr/bin/python3", &["-c", "import requests"]) {
        skip::skip_or_fail(test, "python3-requests is not installed (scripts/setup.sh)");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let log: Log = Arc::default();
    let (ca_pem, cfg) = test_pki(&["api.test", "other.test"]);
    let tls = rt.block_on(upstream(Some(cfg), log.clone()));
    let plain = rt.block_on(upstream(None, log.clone()));
    let dir = cordon_testkit::scratch();
    let ca_file = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();

    let policy = loopback_policy(vec![
        format!("api.test:{tls}"),
        format!("other.test:{tls}"),
        format!("api.test:{plain}"),
        format!("other.test:{plain}"),
    ]);
    let _ = HostPort::parse("unused.test:1");
    let mut spec = SandboxSpec::new("jira_search", ["/bin/sh", "-c", SCRIPT]);
    spec.limits.wall = Duration::from_secs(120);
    spec.limits.memory_bytes = 1 << 30;
    spec.limits.tasks = 256;
    spec.env.push(("TLS".into(), tls.to_string()));
    spec.env.push(("PLAIN".into(), plain.to_string()));
    spec.network = Network::Doors(Box::new(policy));
    let injections = Injections::new(vec![
        jira_injection(tls, &ca_file),
        Injection {
            secret: "PLAIN_KEY".into(),
            placeholder: PH_PLAIN.into(),
            binding: Binding {
                host: "api.test".into(),
                port: plain,
                path_prefix: None,
                placement: Placement::Header {
                    name: "X-Api-Key".into(),
                    template: "{token}".into(),
                },
                upstream_ca: None,
            },
            source: Arc::new(Fixed(TOKEN_PLAIN)),
        },
    ]);
    let events: Arc<Mutex<Vec<EgressEvent>>> = Arc::default();
    let ev = events.clone();
    let ctx = Context {
        session: "sess-inject".into(),
        tenant: cordon_runtime::DEFAULT_TENANT.into(),
        on_egress: Arc::new(move |e| ev.lock().unwrap().push(e)),
        credentials: Credentials {
            env: vec![
                ("JIRA_TOKEN".into(), Zeroizing::new(PH.to_string())),
                ("PLAIN_KEY".into(), Zeroizing::new(PH_PLAIN.to_string())),
            ],
            injections,
        },
        placement: Default::default(),
    };
    let native = Native::new(Default::default()).expect("native runtime");
    let half = &TOKEN[..TOKEN.len() / 2];
    let o = native
        .run(&spec, format!("{half}\n").into_bytes(), &ctx)
        .expect("run");
    let printed = Printed {
        out: String::from_utf8_lossy(&o.stdout).to_string(),
        err: String::from_utf8_lossy(&o.stderr).to_string(),
    };
    let (out, err) = (&printed.out, &printed.err);
    assert_eq!(o.status, Status::Ok, "{} {out} {err}", o.reason);
    let case = |name: &str| printed.case(name);
    // Positive controls: each client reaches the bound endpoint, over
    // HTTPS trusting the session CA with no flag of its own.
    for c in [
        "curl-https",
        "curl-http",
        "curl-control-other-http",
        "py-https",
        "py-http",
        "node-https",
        "node-http",
    ] {
        assert_eq!(case(c), "200", "{c}: {out} {err}");
    }
    // Refusals.
    for c in [
        "curl-other-host",
        "curl-denied-host",
        "curl-body",
        "curl-base64",
        "curl-basic-wrong-host",
        "py-other-host",
        "py-basic-wrong-host",
        "py-base64-body",
        "node-other-host",
        "node-body",
    ] {
        let got = case(c);
        // A CONNECT refused by the allowlist is a 403 of the proxy: curl
        // reports the CONNECT status (000 with no response of the origin).
        if c == "curl-denied-host" {
            assert!(got == "403" || got == "000", "{c}: {got}: {out}");
        } else {
            assert_eq!(got, "403", "{c}: {out} {err}");
        }
    }
    // What arrived upstream: the token on the bound requests only, never
    // a placeholder.
    let seen: Vec<String> = log.lock().unwrap().iter().map(|s| s.line()).collect();
    // curl, requests and fetch.
    assert_upstream_saw(&seen, 3, &[PH, PH_PLAIN]);
    assert_eq!(
        seen.iter().filter(|s| s.contains(TOKEN_PLAIN)).count(),
        3,
        "{seen:#?}"
    );
    // Events: uses name the secret, refusals are marked; no value anywhere.
    // Every refusal but the denied host (refused at CONNECT, before any
    // request is seen) is an exfiltration.
    let ev = events.lock().unwrap().clone();
    assert_jira_events(&ev, 3, 9);
    assert!(
        ev.iter()
            .any(|e| e.name == "denied.test" && e.decision == cordon_runtime::Decision::Refused)
    );
    let all = format!("{ev:?}{out}{err}{}", o.reason);
    for t in [TOKEN, TOKEN_PLAIN, half] {
        assert!(!all.contains(t), "a token in cordon's output or events");
    }
    // The token nowhere in the sandbox; the trust bundle.
    printed.assert_scan_clean();
    printed.assert_bundle();
}

#[test]
fn an_image_root_gets_the_session_ca_over_its_own_bundle() {
    let test = "an_image_root_gets_the_session_ca_over_its_own_bundle";
    if let Some(why) = image::missing() {
        skip::skip_or_fail(test, &why);
        return;
    }
    if !cordon_testkit::is_root() {
        skip::skip_or_fail(test, "not root: the egress doors need network namespaces");
        return;
    }
    let img = image::busybox_with_bundle();
    let root = img.path();
    let script = "cat /etc/ssl/certs/ca-certificates.crt | busybox grep -c 'BEGIN CERTIFICATE'; \
                  busybox head -n 1 /etc/ssl/cert.pem; echo \"env $SSL_CERT_FILE $NODE_EXTRA_CA_CERTS\"; \
                  busybox grep -c 'BEGIN CERTIFICATE' \"$SSL_CERT_FILE\"";
    let mut spec = SandboxSpec::new("img", ["/bin/sh", "-c", script]);
    spec.root = Root::Image {
        rootfs: root.to_path_buf(),
        digest: "sha256:0000000000000000000000000000000000000000000000000000000000000000".into(),
    };
    spec.env[0].1 = "/bin".into();
    let mut policy = EgressPolicy::allowlist("img", ["api.test:443"]).unwrap();
    policy.upstream_dns = Some("127.0.0.1:9".parse().unwrap());
    spec.network = Network::Doors(Box::new(policy));
    let native = Native::new(Default::default()).expect("native runtime");
    let run = |ctx: &Context| {
        let o = native.run(&spec, Vec::new(), ctx).expect("run");
        (
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    // Positive control: without injections the image's own bundle.
    let (out, err) = run(&Context::discard("s"));
    assert!(out.starts_with("0\nIMAGE ROOTS\nenv  \n"), "{out} {err}");
    let ctx = Context {
        session: "s".into(),
        tenant: cordon_runtime::DEFAULT_TENANT.into(),
        on_egress: Arc::new(|_| {}),
        credentials: Credentials {
            env: vec![("JIRA_TOKEN".into(), Zeroizing::new(PH.to_string()))],
            injections: Injections::new(vec![Injection {
                secret: "JIRA_TOKEN".into(),
                placeholder: PH.into(),
                binding: Binding {
                    host: "api.test".into(),
                    port: 443,
                    path_prefix: None,
                    placement: Placement::Header {
                        name: "Authorization".into(),
                        template: "Bearer {token}".into(),
                    },
                    upstream_ca: None,
                },
                source: Arc::new(Fixed(TOKEN)),
            }]),
        },
        placement: Default::default(),
    };
    let (out, err) = run(&ctx);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out} {err}");
    let n: usize = lines[0].parse().unwrap();
    assert!(n >= 2, "the host's roots and the session CA: {out}");
    assert_eq!(
        lines[1], "-----BEGIN CERTIFICATE-----",
        "the image's symlink reaches the bundle"
    );
    assert_eq!(
        lines[2],
        "env /dev/cordon-ca-bundle.crt /dev/cordon-ca-bundle.crt"
    );
    assert_eq!(lines[3], lines[0]);
    // The image itself is untouched.
    assert_eq!(
        std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap(),
        image::IMAGE_ROOTS
    );
}

/// What the gVisor sandbox runs (curl and `requests`, both through the
/// proxy door: a guest kernel's resolver is not pointed at the DNS door).
const GVISOR_SCRIPT: &str = concat!(
    r#"
set -u
c() { name=$1; shift; printf 'CASE %s %s\n' "$name" "$(curl -sS -o /dev/null -w '%{http_code}' --max-time 20 "$@" 2>/dev/null)"; }
c curl-https -H "Authorization: Bearer $JIRA_TOKEN" "https://api.test:$TLS/rest/api/2/search?jql=x"
c curl-other-host -H "Authorization: Bearer $JIRA_TOKEN" "https://other.test:$TLS/rest/x"
c curl-denied-host -H "Authorization: Bearer $JIRA_TOKEN" "https://denied.test:$TLS/rest/x"
python3 - <<'PY'
import os, requests
tls, ph = os.environ["TLS"], os.environ["JIRA_TOKEN"]
"#,
    py_case!(),
    r#"case("py-https", lambda: requests.get(f"https://api.test:{tls}/rest/py", headers={"Authorization": "Bearer " + ph}, timeout=20))
case("py-other-host", lambda: requests.get(f"https://other.test:{tls}/rest/x", headers={"Authorization": "Bearer " + ph}, timeout=20))
PY
echo "ENV $JIRA_TOKEN"
"#,
    scan_for_token!(),
    r#"echo "BUNDLE $(grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt) $(readlink /etc/ssl/cert.pem) $SSL_CERT_FILE $REQUESTS_CA_BUNDLE"
"#,
);

/// A P3 gVisor tool with a secret: the placeholder in the sandbox becomes
/// the token at the door for the bound endpoint only, the session CA being
/// the bundle's trust.
#[test]
fn a_gvisor_sandbox_gets_its_token_substituted_at_the_door() {
    let test = "a_gvisor_sandbox_gets_its_token_substituted_at_the_door";
    if GVISOR_HARNESS.in_child() {
        gvisor_injection(test);
        return;
    }
    if !cordon_testkit::is_root() {
        skip::skip_or_fail(test, "not root: the test runs as root and as uid 65534");
        return;
    }
    gvisor_injection(test);
    // And from an unprivileged broker (`runsc --rootless`), in a copy of
    // this test binary run as uid 65534 with a runtime directory of its own.
    GVISOR_HARNESS.as_nobody(test);
}

/// The copy of this test binary that runs as uid 65534.
const GVISOR_HARNESS: cordon_testkit::reexec::Harness = cordon_testkit::reexec::Harness {
    child_env: "CORDON_INJECT_TEST_NOBODY",
    env_remove: &["XDG_RUNTIME_DIR"],
    run_dir_as_nobody: true,
    ..cordon_testkit::reexec::Harness::NONE
};

fn gvisor_injection(test: &str) {
    if !have("/usr/bin/python3", &["-c", "import requests"]) {
        skip::skip_or_fail(test, "python3-requests is not installed (scripts/setup.sh)");
        return;
    }
    let g = cordon_runtime::gvisor::Gvisor::new(Default::default(), Default::default())
        .expect("gvisor runtime");
    let problems = g.check(&SandboxSpec::new("probe", ["/bin/true"])).problems;
    if !problems.is_empty() {
        skip::skip_or_fail(test, &problems.join("; "));
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let log: Log = Arc::default();
    let (ca_pem, cfg) = test_pki(&["api.test", "other.test"]);
    let tls = rt.block_on(upstream(Some(cfg), log.clone()));
    let dir = cordon_testkit::scratch();
    let ca_file = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let policy = loopback_policy(vec![format!("api.test:{tls}"), format!("other.test:{tls}")]);
    let mut spec = SandboxSpec::new("jira_search", ["/bin/sh", "-c", GVISOR_SCRIPT]);
    spec.profile = cordon_policy::policy::Profile::P3;
    spec.limits = cordon_policy::resolve::default_limits(spec.profile).expect("P3 limits");
    spec.limits.wall = Duration::from_secs(120);
    spec.env.push(("TLS".into(), tls.to_string()));
    spec.network = Network::Doors(Box::new(policy));
    let events: Arc<Mutex<Vec<EgressEvent>>> = Arc::default();
    let ev = events.clone();
    let ctx = Context {
        session: "sess-gvisor".into(),
        tenant: cordon_runtime::DEFAULT_TENANT.into(),
        on_egress: Arc::new(move |e| ev.lock().unwrap().push(e)),
        credentials: Credentials {
            env: vec![("JIRA_TOKEN".into(), Zeroizing::new(PH.to_string()))],
            injections: Injections::new(vec![jira_injection(tls, &ca_file)]),
        },
        placement: Default::default(),
    };
    let half = &TOKEN[..TOKEN.len() / 2];
    let o = g
        .run(&spec, format!("{half}\n").into_bytes(), &ctx)
        .expect("run");
    let printed = Printed {
        out: String::from_utf8_lossy(&o.stdout).to_string(),
        err: String::from_utf8_lossy(&o.stderr).to_string(),
    };
    let (out, err) = (&printed.out, &printed.err);
    assert_eq!(o.status, Status::Ok, "{} {out} {err}", o.reason);
    let case = |name: &str| printed.case(name);
    // Positive controls: the bound endpoint, over HTTPS trusting the
    // session CA with no flag of the client's own.
    for c in ["curl-https", "py-https"] {
        assert_eq!(case(c), "200", "{c}: {out} {err}");
    }
    // The placeholder to another allowed host is refused at the door.
    for c in ["curl-other-host", "py-other-host"] {
        assert_eq!(case(c), "403", "{c}: {out} {err}");
    }
    let got = case("curl-denied-host");
    assert!(
        got == "403" || got == "000",
        "curl-denied-host: {got}: {out}"
    );
    // The sandbox sees only the placeholder.
    assert!(out.contains(&format!("\nENV {PH}\n")), "{out}");
    printed.assert_scan_clean();
    // The upstream sees the real token, on the bound requests only (curl
    // and requests), and never a placeholder.
    let seen: Vec<String> = log.lock().unwrap().iter().map(|s| s.line()).collect();
    assert_upstream_saw(&seen, 2, &[PH]);
    let ev = events.lock().unwrap().clone();
    assert_jira_events(&ev, 2, 2);
    let all = format!("{ev:?}{out}{err}{}", o.reason);
    for t in [TOKEN, half] {
        assert!(!all.contains(t), "a token in cordon's output or events");
    }
    // The trust bundle.
    printed.assert_bundle();
}
