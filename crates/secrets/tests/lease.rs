//! Leases over the `exec` and `static` providers: what a session gets,
//! what the provider was asked, re-mint before expiry, revocation at the
//! session's end, and refusals.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_egress::Placement;
use cordon_policy::ToolPolicy;
use cordon_secrets::{CredentialBroker, Event, EventKind, config};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn private(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn tool(secrets: &str) -> ToolPolicy {
    let y = format!(
        "tools:\n  api:\n    profile: P2\n    command: [/bin/true]\n    egress: [\"api.example:443\"]\n    secrets:\n{secrets}"
    );
    cordon_policy::load_str(Path::new("m.yaml"), &y)
        .unwrap()
        .policy
        .tools["api"]
        .clone()
}

/// A broker whose `mint` provider is the exec fixture writing into `dir`,
/// with every event collected.
fn exec_broker(dir: &Path, extra: &str) -> (Arc<CredentialBroker>, Arc<Mutex<Vec<Event>>>) {
    let p = dir.join("providers.yaml");
    private(
        &p,
        &format!(
            "default: mint\nproviders:\n  mint:\n    type: exec\n    command: [\"{}\", \"{}\"]\n    revoke: [\"{}\", \"{}\"]\n{extra}",
            fixture("mint.py").display(),
            dir.display(),
            fixture("revoke.py").display(),
            dir.display()
        ),
    );
    let b = Arc::new(CredentialBroker::new(config::load(&p).unwrap()).unwrap());
    let events = Arc::new(Mutex::new(Vec::new()));
    let e = events.clone();
    b.on_event(Arc::new(move |ev| {
        e.lock().unwrap().push(ev.clone());
        Ok(())
    }));
    (b, events)
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn is_placeholder(v: &str) -> bool {
    v.strip_prefix("cordon-ph-")
        .is_some_and(|h| h.len() == 32 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

#[test]
fn proxy_delivery_gives_a_placeholder_and_the_door_the_token_until_revoked() {
    let d = cordon_testkit::scratch();
    let (b, events) = exec_broker(d.path(), "");
    let t = tool(
        "      - {name: API_TOKEN, scope: \"read:issues\", ttl: 600, audience: jira, bind: {path: /rest/}}\n",
    );
    let lease = b.mint(&t, "sess-1").unwrap();
    let creds = lease.credentials().unwrap();
    // The sandbox's variable holds only the placeholder.
    assert_eq!(creds.env.len(), 1);
    let (name, ph) = &creds.env[0];
    assert_eq!(name, "API_TOKEN");
    assert!(is_placeholder(ph), "{}", ph.as_str());
    let minted = lines(&d.path().join("minted"));
    assert_eq!(minted.len(), 1);
    assert_ne!(ph.as_str(), minted[0]);
    // The provider was asked for this tool, session, scope, ttl, audience.
    let req: serde_json::Value =
        serde_json::from_str(&lines(&d.path().join("requests.jsonl"))[0]).unwrap();
    assert_eq!(
        req,
        serde_json::json!({"tool": "api", "session": "sess-1", "scope": "read:issues", "ttl": 600, "audience": "jira"})
    );
    // The door's injection: bound to the one endpoint, the token from the source.
    let inj: Vec<_> = creds.injections.iter().collect();
    assert_eq!(inj.len(), 1);
    assert_eq!(inj[0].placeholder, ph.as_str());
    assert_eq!(
        (
            inj[0].binding.host.as_str(),
            inj[0].binding.port,
            inj[0].binding.path_prefix.as_deref()
        ),
        ("api.example", 443, Some("/rest/"))
    );
    assert_eq!(
        inj[0].binding.placement,
        Placement::Header {
            name: "Authorization".into(),
            template: "Bearer {token}".into()
        }
    );
    assert_eq!(inj[0].source.current().unwrap().as_str(), minted[0]);
    // Nothing prints the token.
    assert!(!format!("{creds:?} {lease:?} {:?}", inj[0]).contains(&minted[0]));
    // Another session: another placeholder and token.
    let lease2 = b.mint(&t, "sess-2").unwrap();
    let creds2 = lease2.credentials().unwrap();
    assert_ne!(creds2.env[0].1.as_str(), ph.as_str());
    assert_eq!(b.live(), 2);
    // Session end: revoked at the provider (token on its stdin), and the
    // door's source refuses from then on.
    let source = inj[0].source.clone();
    drop(creds);
    drop(lease);
    assert_eq!(lines(&d.path().join("revoked")), vec![minted[0].clone()]);
    let err = source.current().unwrap_err();
    assert!(err.contains("revoked"), "{err}");
    assert!(lease2.source("API_TOKEN").unwrap().current().is_ok());
    // Broker shutdown revokes the rest.
    b.revoke_all("shutdown").unwrap();
    assert_eq!(lines(&d.path().join("revoked")).len(), 2);
    assert_eq!(b.live(), 0);
    let ev = events.lock().unwrap();
    let kinds: Vec<_> = ev
        .iter()
        .filter(|e| e.session == "sess-1")
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, vec![EventKind::Minted, EventKind::Revoked]);
    let minted_ev = ev.iter().find(|e| e.kind == EventKind::Minted).unwrap();
    assert_eq!(
        (
            minted_ev.provider.as_str(),
            minted_ev.scope.as_str(),
            minted_ev.ttl_seconds
        ),
        ("mint", "read:issues", 600)
    );
    assert!(minted_ev.expires_at.is_some());
    for tok in lines(&d.path().join("minted")) {
        assert!(!format!("{ev:?}").contains(&tok));
    }
}

#[test]
fn a_short_lived_token_is_reminted_before_it_expires_and_the_old_one_revoked() {
    let d = cordon_testkit::scratch();
    let (b, events) = exec_broker(d.path(), "");
    let t = tool("      - {name: API_TOKEN, scope: s, ttl: 3}\n");
    let lease = b.mint(&t, "long").unwrap();
    let source = lease.source("API_TOKEN").unwrap();
    let first = source.current().unwrap().to_string();
    // Re-minted at 80% of its life: wait (bounded) for the second mint.
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines(&d.path().join("minted")).len() < 2 {
        assert!(Instant::now() < deadline, "no re-mint");
        std::thread::sleep(Duration::from_millis(50));
    }
    let minted = lines(&d.path().join("minted"));
    assert_eq!(minted[0], first);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !lines(&d.path().join("revoked")).contains(&first) {
        assert!(
            Instant::now() < deadline,
            "the replaced token was not revoked"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let now = source.current().unwrap().to_string();
    assert_ne!(now, first);
    // On a loaded host the revocation can come after a third mint (every
    // 2.4 s here): the current token is one of those minted by now.
    assert!(lines(&d.path().join("minted")).contains(&now));
    drop(lease);
    assert!(lines(&d.path().join("revoked")).contains(&now));
    assert!(source.current().is_err());
    assert!(
        events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.kind == EventKind::Reminted)
    );
}

#[test]
fn env_delivery_puts_the_token_itself_in_the_variable() {
    let d = cordon_testkit::scratch();
    let (b, _) = exec_broker(d.path(), "");
    let t = tool("      - {name: API_TOKEN, scope: s, ttl: 60, deliver: env}\n");
    let lease = b.mint(&t, "s").unwrap();
    let creds = lease.credentials().unwrap();
    assert!(creds.injections.is_empty());
    assert_eq!(creds.env[0].1.as_str(), lines(&d.path().join("minted"))[0]);
}

#[test]
fn a_failed_mint_refuses_the_session_without_showing_the_output() {
    let d = cordon_testkit::scratch();
    let (b, events) = exec_broker(d.path(), "");
    std::fs::write(d.path().join("FAIL"), "").unwrap();
    let t = tool("      - {name: API_TOKEN, scope: s, ttl: 60}\n");
    let err = b.mint(&t, "s").unwrap_err();
    assert!(err.contains("failed (exit status: 3"), "{err}");
    assert!(!err.contains("leaky-"), "{err}");
    let ev = events.lock().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].kind, EventKind::MintFailed);
    // Positive control: without FAIL the same mint works.
    drop(ev);
    std::fs::remove_file(d.path().join("FAIL")).unwrap();
    assert!(b.mint(&t, "s").is_ok());
}

#[test]
fn a_mint_that_cannot_be_audited_is_revoked_and_refused() {
    let d = cordon_testkit::scratch();
    let (b, _) = exec_broker(d.path(), "");
    b.on_event(Arc::new(|ev| match ev.kind {
        EventKind::Minted => Err("disk full".into()),
        _ => Ok(()),
    }));
    let t = tool("      - {name: API_TOKEN, scope: s, ttl: 60}\n");
    let err = b.mint(&t, "s").unwrap_err();
    assert!(
        err.contains("audit record of its mint could not be written (disk full)"),
        "{err}"
    );
    // Minted, then revoked at once.
    assert_eq!(
        lines(&d.path().join("minted")),
        lines(&d.path().join("revoked"))
    );
    assert_eq!(lines(&d.path().join("minted")).len(), 1);
    // Positive control: a sink that records lets the mint through.
    b.on_event(Arc::new(|_| Ok(())));
    assert!(b.mint(&t, "s").is_ok());
}

#[test]
fn a_provider_that_does_not_answer_is_killed_at_its_timeout() {
    let d = cordon_testkit::scratch();
    let p = d.path().join("providers.yaml");
    private(
        &p,
        "default: slow\nproviders:\n  slow:\n    type: exec\n    command: [/bin/sleep, \"30\"]\n    timeout_seconds: 1\n",
    );
    let b = Arc::new(CredentialBroker::new(config::load(&p).unwrap()).unwrap());
    let err = b
        .mint(&tool("      - {name: T, scope: s, ttl: 60}\n"), "s")
        .unwrap_err();
    assert!(err.contains("did not answer within 1s"), "{err}");
}

#[test]
fn unknown_or_missing_providers_are_refused_at_admission() {
    use cordon_runtime::Minting;
    let d = cordon_testkit::scratch();
    let p = d.path().join("providers.yaml");
    private(&p, "providers:\n  dev:\n    type: static\n    env: NOPE\n");
    let b = CredentialBroker::new(config::load(&p).unwrap()).unwrap();
    let err = b
        .can_mint(&tool(
            "      - {name: T, scope: s, ttl: 60, provider: vault}\n",
        ))
        .unwrap_err();
    assert!(err.contains("provider `vault` is not defined"), "{err}");
    let err = b
        .can_mint(&tool("      - {name: T, scope: s, ttl: 60}\n"))
        .unwrap_err();
    assert!(err.contains("has no `default`"), "{err}");
    assert!(
        b.can_mint(&tool(
            "      - {name: T, scope: s, ttl: 60, provider: dev}\n"
        ))
        .is_ok()
    );
}

#[test]
fn static_values_come_from_a_private_file_or_the_broker_environment() {
    let d = cordon_testkit::scratch();
    let value = d.path().join("value");
    private(&value, "static-value-123\n");
    let p = d.path().join("providers.yaml");
    private(
        &p,
        &format!(
            "default: file\nproviders:\n  file:\n    type: static\n    file: {}\n  var:\n    type: static\n    env: HOME\n",
            value.display()
        ),
    );
    let b = Arc::new(CredentialBroker::new(config::load(&p).unwrap()).unwrap());
    b.on_event(Arc::new(|_| Ok(())));
    let t = tool("      - {name: T, scope: s, ttl: 60, deliver: env}\n");
    let l = b.mint(&t, "s").unwrap();
    assert_eq!(
        l.credentials().unwrap().env[0].1.as_str(),
        "static-value-123"
    );
    // The broker's own variable (one every test process has).
    let home = std::env::var("HOME").unwrap();
    let t = tool("      - {name: T, scope: s, ttl: 60, deliver: env, provider: var}\n");
    let l = b.mint(&t, "s").unwrap();
    assert_eq!(l.credentials().unwrap().env[0].1.as_str(), home);
    // A value file others can read is refused, naming its mode, not its value.
    std::fs::set_permissions(&value, std::fs::Permissions::from_mode(0o640)).unwrap();
    let err = b
        .mint(&tool("      - {name: T, scope: s, ttl: 60}\n"), "s")
        .unwrap_err();
    assert!(
        err.contains("mode 0640") && !err.contains("static-value"),
        "{err}"
    );
}

/// No sink: nothing would record the mint, so it is refused and the token
/// revoked (before, `emit` said `Ok` and the mint went ahead unaudited).
#[test]
fn a_mint_without_an_event_sink_is_refused_and_revoked() {
    let d = cordon_testkit::scratch();
    let p = d.path().join("providers.yaml");
    private(
        &p,
        &format!(
            "default: mint\nproviders:\n  mint:\n    type: exec\n    command: [\"{}\", \"{}\"]\n    revoke: [\"{}\", \"{}\"]\n",
            fixture("mint.py").display(),
            d.path().display(),
            fixture("revoke.py").display(),
            d.path().display()
        ),
    );
    let b = Arc::new(CredentialBroker::new(config::load(&p).unwrap()).unwrap());
    let t = tool("      - {name: API_TOKEN, scope: s, ttl: 60}\n");
    let err = b.mint(&t, "s").unwrap_err();
    assert!(
        err.contains("audit record of its mint could not be written (no sink is set"),
        "{err}"
    );
    let minted = lines(&d.path().join("minted"));
    assert_eq!(minted.len(), 1);
    assert_eq!(lines(&d.path().join("revoked")), minted);
    assert_eq!(b.live(), 0);
    // Positive control: with a sink the same mint goes through.
    b.on_event(Arc::new(|_| Ok(())));
    assert!(b.mint(&t, "s").is_ok());
}

/// Records that cannot be written are never dropped silently: a failed
/// mint's says so in the refusal, a revocation's in what `revoke` returns.
#[test]
fn unrecorded_credential_events_are_surfaced() {
    let d = cordon_testkit::scratch();
    let (b, _) = exec_broker(d.path(), "");
    let t = tool("      - {name: API_TOKEN, scope: s, ttl: 60}\n");
    // Positive control: a sink that records everything, nothing to say.
    let lease = b.mint(&t, "s").unwrap();
    assert_eq!(lease.revoke("done"), Ok(()));
    b.on_event(Arc::new(|ev| match ev.kind {
        EventKind::Minted => Ok(()),
        k => Err(format!("cannot write {}", k.as_str())),
    }));
    let lease = b.mint(&t, "s").unwrap();
    let err = lease.revoke("done").unwrap_err();
    assert!(
        err.contains("credential revoke of secret API_TOKEN")
            && err.contains("was not written: cannot write revoke"),
        "{err}"
    );
    // The token was revoked all the same.
    assert_eq!(
        lines(&d.path().join("revoked")),
        lines(&d.path().join("minted"))
    );
    // A failed mint whose record cannot be written either says both.
    std::fs::write(d.path().join("FAIL"), "").unwrap();
    let err = b.mint(&t, "s").unwrap_err();
    assert!(
        err.contains("its audit record could not be written: cannot write mint_failed"),
        "{err}"
    );
}
