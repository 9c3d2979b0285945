//! Session workspaces and per-tenant state through the broker and the
//! native jail, against the real kernel: what each session and tenant
//! sees, when a workspace goes, that its size holds, and that a symlink a
//! tool plants is never followed by cordon. The root tests run as root;
//! the unprivileged one re-runs this binary as uid 65534 through setpriv,
//! where a tool that declares a workspace is refused (its size could not
//! be enforced) while one that does not still runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cordon_broker::{Broker, BrokerOptions, CallError, Caller, Volumes};
use cordon_policy::ToolPolicy;

use cordon_testkit::skip;

const CHILD_ENV: &str = "CORDON_WORKSPACE_TEST_CHILD";

const MANIFEST: &str = r#"
tools:
  writer:
    profile: P1
    command: ["/bin/sh"]
    workspace: {mount: /work, size: 1M}
    state: {mount: /data, size: 4M}
  reader:
    profile: P1
    command: ["/bin/sh"]
    workspace: {mount: /ws, size: 1M}
  plain:
    profile: P1
    command: ["/bin/sh"]
"#;

use cordon_testkit::euid;

/// Fields drop in order: the broker (unmounting what it mounted) before
/// the directory.
struct Bed {
    broker: Broker,
    run: PathBuf,
    state: PathBuf,
    tools: std::collections::BTreeMap<String, ToolPolicy>,
    dir: cordon_testkit::Scratch,
}

fn bed() -> Bed {
    let dir = cordon_testkit::scratch::named("cordon-ws-");
    // The sandbox's host uid reaches its workspace's mount point by path.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let run = dir.path().join("run");
    let state = dir.path().join("state");
    let mut opts = BrokerOptions::one_shot(Some(dir.path().join("audit.jsonl")), false);
    opts.one_shot = false;
    let broker = Broker::new(opts).unwrap();
    let owner = broker.registry().sandbox_owner();
    let broker = broker.with_volumes(Volumes::new(run.clone(), state.clone(), owner));
    let loaded = cordon_policy::load_str(Path::new("m.yaml"), MANIFEST).unwrap();
    Bed {
        dir,
        run,
        state,
        broker,
        tools: loaded.policy.tools,
    }
}

fn who(tenant: &str, session: &str) -> Caller {
    let mut c = Caller::new(session, "test");
    c.tenant = tenant.to_string();
    c
}

impl Bed {
    /// Run `script` in `tool` for `who`: (exit code, stdout, stderr).
    fn sh(
        &self,
        who: &Caller,
        tool: &str,
        script: &str,
    ) -> Result<(i32, String, String), CallError> {
        let r = self
            .broker
            .call_as(who, &self.tools[tool], script.as_bytes().to_vec())?;
        Ok((
            r.outcome.exit_code.unwrap_or(-1),
            String::from_utf8_lossy(&r.outcome.stdout).into_owned(),
            String::from_utf8_lossy(&r.outcome.stderr).into_owned(),
        ))
    }

    fn ok(&self, who: &Caller, tool: &str, script: &str) -> String {
        let (code, out, err) = self.sh(who, tool, script).unwrap();
        assert_eq!(code, 0, "{tool}: {script}\nstdout: {out}\nstderr: {err}");
        out
    }

    fn audit(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn mounted_under_run(&self) -> Vec<String> {
        let run = self.run.to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .filter(|m| m.starts_with(&run))
            .collect()
    }
}

fn need_root(test: &str) -> bool {
    if euid() == 0 {
        return true;
    }
    if std::env::var_os(CHILD_ENV).is_none() {
        skip::skip_or_fail(
            test,
            "needs root (the broker mounts each workspace's tmpfs)",
        );
    }
    false
}

#[test]
fn sessions_and_tenants_see_only_their_own_workspace() {
    if !need_root("sessions_and_tenants_see_only_their_own_workspace") {
        return;
    }
    let b = bed();
    let (a1, a2, b1) = (who("alpha", "s1"), who("alpha", "s2"), who("beta", "s1"));
    b.ok(&a1, "writer", "echo a1 > /work/mine");
    b.ok(&a2, "writer", "echo a2 > /work/mine");
    // Another tenant's session of the same id is another workspace.
    b.ok(&b1, "writer", "echo b1 > /work/mine");
    assert_eq!(b.ok(&a1, "writer", "cat /work/mine"), "a1\n");
    assert_eq!(b.ok(&a2, "writer", "cat /work/mine"), "a2\n");
    assert_eq!(b.ok(&b1, "writer", "cat /work/mine"), "b1\n");
    assert_eq!(b.ok(&a1, "writer", "ls -A /work"), "mine\n");
    // A second tool of the session sees the first one's file, at its own mount.
    assert_eq!(b.ok(&a1, "reader", "cat /ws/mine"), "a1\n");
    // A tool without a workspace has none.
    let (code, _, _) = b.sh(&a1, "plain", "ls /work").unwrap();
    assert_ne!(code, 0, "a tool without a workspace sees /work");
    // The session ends: its workspace goes; the others stay.
    b.broker.end_session(&a1, Duration::ZERO);
    assert_eq!(
        b.ok(&a1, "writer", "ls -A /work"),
        "",
        "the ended session's files came back"
    );
    assert_eq!(b.ok(&a2, "writer", "cat /work/mine"), "a2\n");
    for s in [&a1, &a2, &b1] {
        b.broker.end_session(s, Duration::ZERO);
    }
    assert_eq!(b.broker.volumes().workspace_count(), 0);
    // What is left mounted under the run directory is the state only.
    let left = b.mounted_under_run();
    assert!(
        left.iter().all(|m| m.contains("/state/")),
        "workspaces still mounted: {left:?}"
    );
}

#[test]
fn a_retained_workspace_outlives_its_session_then_goes() {
    if !need_root("a_retained_workspace_outlives_its_session_then_goes") {
        return;
    }
    let b = bed();
    let s = who("alpha", "kept");
    b.ok(&s, "writer", "echo kept > /work/f");
    b.broker.end_session(&s, Duration::from_secs(3));
    assert_eq!(
        b.broker.volumes().workspace_count(),
        1,
        "destroyed before its retain"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while b.broker.volumes().workspace_count() > 0 {
        assert!(Instant::now() < deadline, "the reaper never destroyed it");
        std::thread::sleep(Duration::from_millis(200));
    }
    let left = b.mounted_under_run();
    assert!(left.iter().all(|m| !m.contains("/workspaces/")), "{left:?}");
    assert_eq!(b.ok(&s, "writer", "ls -A /work"), "");
}

#[test]
fn state_persists_for_its_tenant_only_and_can_be_removed() {
    if !need_root("state_persists_for_its_tenant_only_and_can_be_removed") {
        return;
    }
    let b = bed();
    b.ok(
        &who("alpha", "s1"),
        "writer",
        "echo remembered > /data/memory",
    );
    b.broker.end_session(&who("alpha", "s1"), Duration::ZERO);
    assert_eq!(
        b.ok(&who("alpha", "s2"), "writer", "cat /data/memory"),
        "remembered\n"
    );
    let (code, _, err) = b
        .sh(&who("beta", "s1"), "writer", "cat /data/memory")
        .unwrap();
    assert_ne!(code, 0, "tenant beta read alpha's state");
    assert!(err.contains("No such file"), "{err}");
    // While a broker has it mounted, it cannot be removed.
    let held = cordon_runtime::volume::remove_state(&b.state, "alpha", "writer");
    assert!(
        held.as_ref().is_err_and(|e| e.contains("in use")),
        "{held:?}"
    );
    // The image outlives the broker; a new broker mounts it again.
    let Bed {
        dir,
        state,
        broker,
        tools,
        ..
    } = b;
    drop(broker);
    let names: Vec<(String, String)> = cordon_runtime::volume::list_states(&state)
        .unwrap()
        .iter()
        .map(|e| (e.tenant.clone(), e.tool.clone()))
        .collect();
    assert_eq!(
        names,
        [
            ("alpha".to_string(), "writer".to_string()),
            ("beta".to_string(), "writer".to_string())
        ]
    );
    {
        let mut opts = BrokerOptions::one_shot(Some(dir.path().join("audit.jsonl")), false);
        opts.one_shot = false;
        let broker = Broker::new(opts).unwrap();
        let owner = broker.registry().sandbox_owner();
        let broker =
            broker.with_volumes(Volumes::new(dir.path().join("run"), state.clone(), owner));
        let r = broker
            .call_as(
                &who("alpha", "s3"),
                &tools["writer"],
                b"cat /data/memory".to_vec(),
            )
            .unwrap();
        assert_eq!(r.outcome.stdout, b"remembered\n");
    }
    assert!(cordon_runtime::volume::remove_state(&state, "alpha", "writer").unwrap());
    assert!(!cordon_runtime::volume::remove_state(&state, "alpha", "writer").unwrap());
    let left = cordon_runtime::volume::list_states(&state).unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].tenant, "beta");
    // No path traversal through a tenant or a tool.
    assert!(cordon_runtime::volume::remove_state(&state, "../beta", "writer").is_err());
    assert!(cordon_runtime::volume::remove_state(&state, "beta", "../x").is_err());
    assert!(cordon_runtime::volume::remove_state(&state, "beta", "writer").unwrap());
}

#[test]
fn a_write_past_the_size_fails_with_enospc_and_the_call_returns() {
    if !need_root("a_write_past_the_size_fails_with_enospc_and_the_call_returns") {
        return;
    }
    let b = bed();
    let s = who("alpha", "full");
    // Positive control: under the size, the write succeeds.
    b.ok(&s, "writer", "head -c 512000 /dev/zero > /work/half");
    assert!(
        b.audit().last().unwrap()["warnings"]
            .as_array()
            .is_none_or(|w| w.iter().all(|w| !w.as_str().unwrap().contains("full"))),
        "{:?}",
        b.audit().last()
    );
    // Past it: ENOSPC in the tool, which still answers.
    let (code, out, err) = b
        .sh(
            &s,
            "writer",
            "head -c 2000000 /dev/zero > /work/big; echo rc=$?",
        )
        .unwrap();
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(out, "rc=1\n");
    assert!(err.contains("No space left on device"), "{err}");
    let rec = b.audit().last().unwrap().clone();
    assert_eq!(rec["status"], "ok", "{rec}");
    let warnings = rec["warnings"].to_string();
    assert!(
        warnings.contains("the workspace at /work is full") && warnings.contains("ENOSPC"),
        "{rec}"
    );
    // The state's size holds too.
    let (_, out, err) = b
        .sh(
            &s,
            "writer",
            "head -c 6000000 /dev/zero > /data/big; echo rc=$?",
        )
        .unwrap();
    assert_eq!(out, "rc=1\n", "{err}");
    assert!(err.contains("No space left on device"), "{err}");
}

#[test]
fn a_planted_symlink_is_never_followed_by_cordon() {
    if !need_root("a_planted_symlink_is_never_followed_by_cordon") {
        return;
    }
    let b = bed();
    // A host file the tool cannot see, and a directory holding it.
    let victim_dir = b.dir.path().join("host");
    std::fs::create_dir(&victim_dir).unwrap();
    let victim = victim_dir.join("precious");
    std::fs::write(&victim, "keep me").unwrap();
    let s = who("alpha", "planted");
    b.ok(
        &s,
        "writer",
        &format!(
            "ln -s {v} /work/file-link && ln -s {d} /work/dir-link && mkdir /work/d && ln -s {v} /work/d/deep && ls -A /work",
            v = victim.display(),
            d = victim_dir.display()
        ),
    );
    // Inside the sandbox the links lead nowhere (the host path is not there).
    let (_, out, _) = b
        .sh(&s, "writer", "cat /work/file-link; echo rc=$?")
        .unwrap();
    assert!(out.ends_with("rc=1\n"), "{out}");
    b.broker.end_session(&s, Duration::ZERO);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert_eq!(
        std::fs::read_dir(&victim_dir).unwrap().count(),
        1,
        "the host directory changed"
    );
    assert_eq!(b.broker.volumes().workspace_count(), 0);
}

/// As uid 65534 no mount of the host's is possible, so no size could be
/// enforced: a tool that declares a workspace or state is refused, with
/// the reason, and audited as refused; a tool that declares neither runs.
#[test]
#[ignore = "run by unprivileged_broker_refuses_workspaces as uid 65534"]
fn unprivileged_body() {
    assert_ne!(euid(), 0, "must run as a non-root uid");
    let b = bed();
    let s = who("alpha", "s1");
    assert_eq!(b.ok(&s, "plain", "echo ran"), "ran\n");
    for tool in ["writer", "reader"] {
        match b.sh(&s, tool, "echo ran") {
            Err(CallError::Refused(m)) => assert!(
                m.contains("needs root") && m.contains("refused"),
                "{tool}: {m}"
            ),
            other => panic!("{tool} was not refused: {:?}", other.map(|o| o.1)),
        }
        let rec = b.audit().last().unwrap().clone();
        assert_eq!(rec["status"], "refused", "{rec}");
        assert_eq!(rec["tool"], tool, "{rec}");
    }
    assert!(b.mounted_under_run().is_empty());
    assert!(!b.run.join("workspaces").exists());
}

#[test]
fn unprivileged_broker_refuses_workspaces() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    if euid() != 0 || !Path::new("/usr/bin/setpriv").exists() {
        skip::skip_or_fail(
            "unprivileged_broker_refuses_workspaces",
            "needs root and /usr/bin/setpriv (re-runs as uid 65534)",
        );
        return;
    }
    let out = Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "unprivileged_body",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && so.contains("1 passed"),
        "as uid 65534:\n{so}\n{se}"
    );
}
