//! `cordon exec --runtime gvisor`, `cordon run` of a P3 gVisor tool and
//! `cordon doctor`'s gVisor lines, as root and as uid 65534 (through
//! setpriv; no cgroup delegation for it here, so P3, which requires cgroup
//! limits, is refused unless the call accepts their absence).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use cordon_testkit::skip;
use skip::{skip_or_fail, this_test};

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

use cordon_testkit::is_root;

/// `runsc` is there and new enough, or the test fails (skips only when
/// allowed).
fn have_runsc() -> bool {
    let o = Command::new(CORDON)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let check = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "gvisor (runsc)")
        .cloned()
        .unwrap();
    if check["ok"] != true {
        skip_or_fail(&this_test(), &format!("gvisor: {}", check["detail"]));
        return false;
    }
    true
}

fn dir(tag: &str) -> cordon_testkit::Scratch {
    let d = cordon_testkit::scratch::named(&format!("cordon-gv-cli-{tag}-"));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

fn cordon(nobody: bool, args: &[&str], stdin: &[u8], audit: &Path) -> Output {
    let mut cmd = if nobody {
        let mut c = Command::new("/usr/bin/setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            CORDON,
        ]);
        c
    } else {
        Command::new(CORDON)
    };
    cmd.args(args)
        .env_remove("CORDON_MANIFEST")
        .env_remove("XDG_RUNTIME_DIR")
        .env("CORDON_AUDIT", audit)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // uid 65534's runtime directory (it has no XDG_RUNTIME_DIR here, and
    // cordon never falls back to a path under /tmp): one of its own.
    if nobody {
        let run = audit.with_extension("run");
        std::fs::create_dir_all(&run).unwrap();
        std::os::unix::fs::chown(&run, Some(65534), Some(65534)).unwrap();
        cmd.env("CORDON_RUN_DIR", &run);
    }
    let mut child = cmd.spawn().expect("spawn cordon");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn exec_runtime_gvisor_runs_in_its_own_kernel() {
    if !is_root() {
        skip_or_fail(
            &this_test(),
            "needs root (and runs the unprivileged case through setpriv)",
        );
        return;
    }
    if !have_runsc() {
        return;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let d = dir("exec");
    let script = "cat; echo; uname -r; id -u";
    // Root: admitted, runs, the output is gVisor's.
    let o = cordon(
        false,
        &["exec", "--runtime", "gvisor", "--", "/bin/sh", "-c", script],
        b"in",
        &d.join("root.jsonl"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "in");
    assert_ne!(lines[1], host.trim(), "the host kernel answered");
    assert_eq!(lines[2], "1000");
    // uid 65534: no cgroup delegation, so P3 is refused, naming it...
    let o = cordon(
        true,
        &["exec", "--runtime", "gvisor", "--", "/bin/sh", "-c", script],
        b"in",
        &d.join("nobody.jsonl"),
    );
    assert_eq!(
        o.status.code(),
        Some(21),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    assert!(
        text(&o.stderr).contains("required mechanism not enforced on this host: cgroup: missing"),
        "{}",
        text(&o.stderr)
    );
    // ...and runs (under --rootless) when the call accepts that.
    let o = cordon(
        true,
        &[
            "exec",
            "--runtime",
            "gvisor",
            "--accept",
            "cgroup",
            "--",
            "/bin/sh",
            "-c",
            script,
        ],
        b"in",
        &d.join("nobody.jsonl"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).lines().nth(2), Some("1000"));
}

#[test]
fn a_p3_tool_runs_with_the_proxy_door_and_the_metadata_address_refused() {
    if !have_runsc() {
        return;
    }
    let d = dir("run");
    let m = d.join("m.yaml");
    std::fs::write(
        &m,
        "tools:\n  web:\n    profile: P3\n    runtime: gvisor\n    egress: proxy\n    limits: {wall_seconds: 30}\n    command: [/usr/bin/curl, -sS, -m, \"10\", \"http://169.254.169.254/latest/meta-data/\"]\n",
    )
    .unwrap();
    let audit = d.join("audit.jsonl");
    let o = cordon(
        false,
        &["run", "-m", m.to_str().unwrap(), "--json", "web"],
        b"",
        &audit,
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&o.stdout), text(&o.stderr)));
    assert_eq!(v["status"], "ok", "{v}");
    let egress = v["egress"].as_array().unwrap();
    assert_eq!(egress.len(), 1, "{v}");
    assert_eq!(egress[0]["decision"], "refused");
    assert_eq!(
        egress[0]["reason"],
        "egress to 169.254.169.254:80 refused: IP literal 169.254.169.254 is not in the allowlist of web"
    );
    let rec = std::fs::read_to_string(&audit).unwrap();
    assert!(rec.contains("\"runtime\":\"gvisor\""), "{rec}");
}

/// `--tasks 32` counts the tool's own tasks: python3 runs (gVisor's own
/// host threads alone are about as many), a fork bomb ends at 32 with the
/// task limit's exit code and reason.
#[test]
fn exec_tasks_are_the_tools_own() {
    if !is_root() {
        skip_or_fail(&this_test(), "needs root (P3 cgroup limits)");
        return;
    }
    if !have_runsc() {
        return;
    }
    let d = dir("tasks");
    let exec = |argv: &[&str]| {
        let mut args = vec!["exec", "--runtime", "gvisor", "--tasks", "32", "--"];
        args.extend_from_slice(argv);
        cordon(false, &args, b"", &d.join("audit.jsonl"))
    };
    // Positive control.
    let o = exec(&["/usr/bin/python3", "-c", "print(1)"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "1\n");
    let o = exec(&[
        "/bin/sh",
        "-c",
        "i=0; while [ $i -lt 100 ]; do sleep 30 & i=$((i+1)); done; echo started; wait",
    ]);
    assert_eq!(o.status.code(), Some(13), "{}", text(&o.stderr));
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    assert!(
        text(&o.stderr).contains("cordon: exec: task limit 32 reached\n"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn doctor_names_the_gvisor_platforms() {
    if !have_runsc() {
        return;
    }
    let o = Command::new(CORDON).arg("doctor").output().unwrap();
    let out = text(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.contains("gvisor platforms"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.starts_with("ok"), "{line}");
    assert!(
        line.contains("systrap works") && line.contains("chosen: systrap"),
        "{line}"
    );
    assert!(out.lines().any(|l| l.starts_with("P3: ")), "{out}");
}

#[test]
fn probe_holds_inside_gvisor_and_says_who_answered() {
    if !have_runsc() {
        return;
    }
    let d = dir("probe");
    let m = d.join("m.yaml");
    std::fs::write(
        &m,
        "tools:\n  p3:\n    profile: P3\n    runtime: gvisor\n    command: [/bin/true]\n    limits: {wall_seconds: 5, memory: 512M, tasks: 128}\n",
    )
    .unwrap();
    let o = cordon(
        false,
        &["probe", "-m", m.to_str().unwrap(), "--only", "escape"],
        b"",
        &d.join("audit.jsonl"),
    );
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    assert!(out.contains("cordon gvisor runtime"), "{out}");
    let line = |p: &str| {
        out.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(p))
            .unwrap_or_else(|| panic!("no {p}: {out}"))
            .to_string()
    };
    // The P3 probe: nothing of one task in the next.
    let fresh = line("fresh_task");
    assert!(fresh.starts_with("HELD"), "{fresh}");
    assert!(
        fresh.contains("/dev/shm/.cordon-fresh-")
            && fresh.contains("no process of the earlier task is visible"),
        "{fresh}"
    );
    // Where gVisor itself answers, the evidence says so.
    assert!(
        line("io_uring").contains("[answered inside gVisor"),
        "{out}"
    );
    assert!(
        line("network").contains("[answered by gVisor's own network stack"),
        "{out}"
    );
    assert!(line("host_fs").contains("/sys is empty"), "{out}");
}

/// `lifetime: pool` through the broker (as `cordon serve` makes calls):
/// every call gets a sandbox no other call used, and is audited; a call
/// made once the pool has one ready takes it (the record names the pooled
/// sandbox), and the pool's state (`cordon doctor`'s) counts the take.
#[test]
fn a_pooled_tool_gets_a_fresh_sandbox_per_call() {
    if !is_root() {
        skip_or_fail(&this_test(), "needs root (cgroup limits for P3)");
        return;
    }
    if !have_runsc() {
        return;
    }
    let d = dir("pool");
    let m = d.join("m.yaml");
    std::fs::write(
        &m,
        "tools:\n  fresh:\n    profile: P3\n    runtime: gvisor\n    lifetime: pool\n    pool: {size: 1}\n    limits: {wall_seconds: 20}\n    command: [/bin/sh, -c, \"ls -A /tmp /dev/shm; touch /tmp/seen /dev/shm/seen; cat\"]\n",
    )
    .unwrap();
    let loaded = cordon_policy::load(&m).unwrap();
    let policy = &loaded.policy.tools["fresh"];
    let audit = d.join("audit.jsonl");
    let broker = cordon_broker::Broker::new(cordon_broker::BrokerOptions {
        audit: Some(audit.clone()),
        ..Default::default()
    })
    .unwrap();
    for i in 0..3 {
        let r = broker
            .call(policy, format!("call {i}").into_bytes())
            .unwrap();
        assert_eq!(
            r.outcome.status,
            cordon_broker::Status::Ok,
            "{:?}",
            r.outcome
        );
        // Nothing of the call before: both listings are empty.
        assert_eq!(
            text(&r.outcome.stdout),
            format!("/dev/shm:\n\n/tmp:\ncall {i}")
        );
        // Wait for the refill, so the next call is a pooled one.
        let ready = || {
            cordon_runtime::pool_status::snapshot()
                .into_iter()
                .find(|p| p.tool == "fresh")
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while ready().is_none_or(|p| p.ready == 0) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let p = ready().expect("the pool's state");
        assert_eq!((p.kind.as_str(), p.size), ("command", 1), "{p:?}");
        assert_eq!(p.ready, 1, "{p:?}");
    }
    let p = cordon_runtime::pool_status::snapshot()
        .into_iter()
        .find(|p| p.tool == "fresh")
        .unwrap();
    assert_eq!(p.handed_out, 2, "{p:?}");
    let records = std::fs::read_to_string(&audit).unwrap();
    assert_eq!(records.lines().count(), 3, "{records}");
    // The first call made the pool and started cold; the next two each
    // took a pooled sandbox of their own.
    let taken: Vec<String> = records
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["pool"]["event"] == "handed_over")
        .map(|r| r["pool"]["sandbox"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(taken.len(), 2, "{records}");
    assert!(taken.iter().all(|s| s.starts_with("pool-")), "{taken:?}");
    assert_ne!(taken[0], taken[1], "{records}");
    assert!(
        records
            .lines()
            .all(|l| l.contains("\"runtime\":\"gvisor\"")),
        "{records}"
    );
}

/// Serve `examples/data/web/index.html` for every request on
/// 127.0.0.80:80 (the example pins `news.example` there); the request
/// lines seen.
fn web_upstream() -> Option<std::sync::Arc<std::sync::Mutex<Vec<String>>>> {
    use std::io::{BufRead, BufReader};
    let l = match std::net::TcpListener::bind("127.0.0.80:80") {
        Ok(l) => l,
        Err(e) => {
            skip_or_fail(
                &this_test(),
                &format!("bind 127.0.0.80:80 for the example's upstream: {e}"),
            );
            return None;
        }
    };
    let page = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/data/web/index.html"),
    )
    .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut first = String::new();
            let _ = r.read_line(&mut first);
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
            }
            s.lock().unwrap().push(first.trim().to_string());
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                page.len()
            );
            let _ = c.write_all(&page);
        }
    });
    Some(seen)
}

/// The example `browse` tool: headless Chromium under gVisor fetches the
/// page through the proxy door and returns its text; the cookie the page
/// sets does not survive into the next task (positive control: within one
/// task, a second load sees it).
#[test]
fn the_browse_example_fetches_through_the_proxy_and_keeps_no_cookie() {
    if !is_root() {
        skip_or_fail(
            &this_test(),
            "needs root (P3 cgroup limits, port 80 upstream)",
        );
        return;
    }
    if !have_runsc() {
        return;
    }
    if !Path::new("/usr/lib/chromium/chromium").exists() {
        skip_or_fail(&this_test(), "chromium is not installed (scripts/setup.sh)");
        return;
    }
    let Some(seen) = web_upstream() else { return };
    let d = dir("browse");
    let m = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/browse.yaml");
    // No public name resolves: nothing Chromium might ask for leaves the
    // machine (the pinned news.example needs no lookup).
    let run = || {
        let mut cmd = Command::new(CORDON);
        cmd.args(["run", "-m", m.to_str().unwrap(), "--json", "browse"])
            .env("CORDON_UPSTREAM_DNS", "127.0.0.1:9")
            .env("CORDON_AUDIT", d.join("audit.jsonl"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"http://news.example/\n")
            .unwrap();
        let o = child.wait_with_output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}{}", text(&o.stdout), text(&o.stderr)));
        v
    };
    for _ in 0..2 {
        let v = run();
        assert_eq!(v["status"], "ok", "{v}");
        let out = v["output"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"));
        assert!(out.contains("Hello from the local upstream"), "{out}");
        // The script ran, and found no cookie of an earlier task.
        assert!(out.contains("cookies before: []"), "{out}");
        let egress = v["egress"].as_array().unwrap();
        assert!(
            egress.iter().any(|e| e["name"] == "news.example"
                && e["decision"] == "allowed"
                && e["door"] == "proxy"),
            "{v}"
        );
    }
    assert!(seen.lock().unwrap().iter().any(|l| l == "GET / HTTP/1.1"));
    // Positive control: within one task the profile keeps the cookie.
    let script = "for i in 1 2; do /usr/lib/chromium/chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking --disable-component-update --disable-sync --disable-extensions --user-data-dir=/tmp/profile --proxy-server=\"$HTTP_PROXY\" --dump-dom http://news.example/ 2>/dev/null | grep -o 'cookies before: \\[[^]]*\\]' | head -n 1; done";
    let o = Command::new(CORDON)
        .args([
            "exec",
            "--runtime",
            "gvisor",
            "--egress-proxy",
            "--resolve",
            "news.example=127.0.0.80",
            "--allow-cidr",
            "127.0.0.80/32",
            "--memory",
            "2G",
            "--tasks",
            "256",
            "--wall",
            "90",
            "--",
            "/bin/sh",
            "-c",
            script,
        ])
        .env("CORDON_UPSTREAM_DNS", "127.0.0.1:9")
        .env("CORDON_AUDIT", d.join("audit.jsonl"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "cookies before: []\ncookies before: [seen=1]\n"
    );
}
