//! The CLI as a user runs it: every subcommand, every failure class of
//! `run`/`exec` with its documented exit status and message, run both as
//! root and as an unprivileged user (uid 65534 through setpriv).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cordon_testkit::skip;
use skip::{skip_or_fail, this_test};

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn example() -> PathBuf {
    repo().join("examples/cordon.yaml")
}

use cordon_testkit::is_root;

/// Who runs cordon.
#[derive(Clone, Copy, Debug)]
enum As {
    Caller,
    Nobody,
}

fn modes() -> Vec<As> {
    if is_root() && Path::new("/usr/bin/setpriv").exists() {
        vec![As::Caller, As::Nobody]
    } else {
        skip_or_fail(
            &this_test(),
            "the runs as uid 65534 need root and /usr/bin/setpriv",
        );
        vec![As::Caller]
    }
}

/// This process's scratch directory, open to uid 65534 (removed by the
/// next test process's sweep once this one has exited).
fn scratch() -> &'static Path {
    static DIR: std::sync::LazyLock<cordon_testkit::Scratch> = std::sync::LazyLock::new(|| {
        let d = cordon_testkit::scratch::named("cordon-cli-");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        d
    });
    DIR.path()
}

/// A directory of this process's scratch for `tag`, open to uid 65534.
fn dir_for(tag: &str) -> PathBuf {
    let dir = scratch().join(tag);
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

fn audit_file(tag: &str) -> PathBuf {
    dir_for(&format!("audit-{tag}")).join("audit.jsonl")
}

/// Write a manifest for one test; its path.
fn manifest(tag: &str, yaml: &str) -> PathBuf {
    let dir = dir_for(&format!("manifest-{tag}"));
    let m = dir.join("m.yaml");
    std::fs::write(&m, yaml).unwrap();
    m
}

/// Two tools, the same but for a directory mounted "for debugging": the
/// seed's example of a boundary that rots.
const LEAKY: &str = "tools:\n  tidy:\n    profile: P1\n    command: [/usr/bin/wc]\n    limits: {wall_seconds: 2}\n  leaky:\n    profile: P1\n    command: [/usr/bin/wc]\n    limits: {wall_seconds: 2}\n    mounts: [\"/home:/home\"]\n";

fn cordon(who: As, args: &[&str], stdin: &[u8], env: &[(&str, &str)]) -> Output {
    let mut cmd = match who {
        As::Caller => Command::new(CORDON),
        As::Nobody => {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
            c.arg(CORDON);
            c
        }
    };
    cmd.args(args)
        .current_dir(repo())
        .env_remove("CORDON_MANIFEST")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    if !env.iter().any(|(k, _)| *k == "CORDON_AUDIT") {
        // One log per identity: the audit log is fail-closed, and a file
        // one identity made (mode 0600) the other cannot open.
        cmd.env("CORDON_AUDIT", audit_file(&format!("default-{who:?}")));
    }
    let mut child = cmd.spawn().expect("spawn cordon");
    let mut sin = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let w = std::thread::spawn(move || {
        let _ = sin.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    w.join().unwrap();
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// `cordon` as uid 65534 with no `XDG_RUNTIME_DIR` and `TMPDIR` (and
/// `HOME`, unless set again) at `tmp`, from the repository: where the
/// mount point for its sandboxes' roots is made under `tmp`.
fn nobody_with_tmpdir(tmp: &Path) -> Command {
    let mut c = Command::new("/usr/bin/setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(CORDON)
        .current_dir(repo())
        .env_remove("XDG_RUNTIME_DIR")
        .env("TMPDIR", tmp)
        .env("HOME", tmp);
    c
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn check_accepts_the_example_and_refuses_a_typo_with_its_line() {
    let o = cordon(
        As::Caller,
        &["check", "-m", example().to_str().unwrap()],
        b"",
        &[],
    );
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let s = text(&o.stdout);
    assert!(
        s.contains("pdf_to_text") && s.contains("P1") && s.contains("network=none"),
        "{s}"
    );

    let bad = dir_for("bad").join("bad.yaml");
    std::fs::write(
        &bad,
        "tools:\n  a:\n    profile: P1\n    command: [x]\n    netwrok: none\n",
    )
    .unwrap();
    let o = cordon(
        As::Caller,
        &["check", "-m", bad.to_str().unwrap()],
        b"",
        &[],
    );
    assert_eq!(code(&o), 1);
    let e = text(&o.stderr);
    assert!(
        e.contains(&format!("{}:5:5: unknown field `netwrok`", bad.display())),
        "{e}"
    );
}

#[test]
fn explain_prints_the_resolved_policy() {
    let m = example();
    let o = cordon(
        As::Caller,
        &["explain", "word_count", "-m", m.to_str().unwrap(), "--json"],
        b"",
        &[],
    );
    assert_eq!(code(&o), 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["profile"], "P1");
    assert_eq!(v["limits"]["memory_bytes"], 64 << 20);
    assert_eq!(v["network"]["mode"], "none");
    let o = cordon(
        As::Caller,
        &["explain", "word_count", "-m", m.to_str().unwrap()],
        b"",
        &[],
    );
    assert!(text(&o.stdout).contains("profile: P1"));
    // Each mount says whether it is read-only or read-write.
    let mm = manifest(
        "explain-mounts",
        "tools:\n  t:\n    profile: P2\n    network: none\n    command: [/bin/true]\n    mounts: [\"/usr/share:/data\", \"/var/tmp:/scratch:rw\"]\n",
    );
    let o = cordon(
        As::Caller,
        &["explain", "t", "-m", mm.to_str().unwrap(), "--json"],
        b"",
        &[],
    );
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mounts = v["mounts"].as_array().unwrap();
    assert_eq!(mounts[0]["writable"], false, "{v}");
    assert_eq!(mounts[1]["writable"], true, "{v}");
    let o = cordon(
        As::Caller,
        &["explain", "nope", "-m", m.to_str().unwrap()],
        b"",
        &[],
    );
    assert_eq!(code(&o), 2);
    assert!(text(&o.stderr).contains("no tool `nope`"));
}

#[test]
fn diff_exits_1_on_a_weakening_change() {
    let dir = dir_for("diff");
    let a = dir.join("a.yaml");
    let b = dir.join("b.yaml");
    std::fs::write(
        &a,
        "tools:\n  t: {profile: P1, command: [x], limits: {memory: 64M}}\n",
    )
    .unwrap();
    std::fs::write(
        &b,
        "tools:\n  t: {profile: P1, command: [x], limits: {memory: 1G}}\n",
    )
    .unwrap();
    let o = cordon(
        As::Caller,
        &["diff", a.to_str().unwrap(), b.to_str().unwrap()],
        b"",
        &[],
    );
    assert_eq!(code(&o), 1);
    assert!(
        text(&o.stdout).contains("WEAKENS  t: limits.memory: 64M -> 1G"),
        "{}",
        text(&o.stdout)
    );
    let o = cordon(
        As::Caller,
        &["diff", b.to_str().unwrap(), a.to_str().unwrap()],
        b"",
        &[],
    );
    assert_eq!(code(&o), 0);
}

#[test]
fn schema_and_doctor_print_json() {
    let o = cordon(As::Caller, &["schema"], b"", &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["properties"]["tools"].is_object());
    // The bundled example travels in the binary, byte for byte, and the
    // top-level help names the way to it rather than a path in the source.
    let o = cordon(As::Caller, &["schema", "--example"], b"", &[]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    assert_eq!(o.stdout, std::fs::read(example()).unwrap());
    let help = text(&cordon(As::Caller, &["--help"], b"", &[]).stdout);
    assert!(
        help.contains("cordon schema --example > cordon.yaml"),
        "{help}"
    );
    assert!(!help.contains("examples/cordon.yaml"), "{help}");
    for who in modes() {
        let o = cordon(who, &["doctor", "--json"], b"", &[]);
        assert_eq!(code(&o), 0, "{who:?}: {}", text(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let profiles = v["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 3);
        assert!(
            v["checks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["name"] == "landlock")
        );
        let p1 = &profiles[0];
        assert_eq!(p1["profile"], "P1");
        // As root the cgroup pool works here; as nobody it falls back and says so.
        if matches!(who, As::Nobody) {
            assert_eq!(p1["strength"], "partial", "{p1}");
            assert!(
                p1["missing"][0]
                    .as_str()
                    .unwrap()
                    .starts_with("cgroup: partial (")
                    && p1["missing"][0].as_str().unwrap().contains(
                        "rlimit fallback in force: memory capped per process by RLIMIT_DATA"
                    ),
                "{p1}"
            );
            // P2 requires cgroup limits by default.
            assert_eq!(profiles[1]["strength"], "unavailable", "{}", profiles[1]);
        } else {
            assert_eq!(p1["strength"], "full", "{p1}");
        }
    }
}

#[test]
fn run_example_tools_in_both_privilege_modes() {
    let m = example();
    let m = m.to_str().unwrap();
    let pdf = std::fs::read(repo().join("examples/data/report.pdf")).unwrap();
    let png = std::fs::read(repo().join("examples/data/screenshot.png")).unwrap();
    let test = "run_example_tools_in_both_privilege_modes";
    let pdftotext = Path::new("/usr/bin/pdftotext").exists();
    if !pdftotext {
        skip_or_fail(test, "pdf_to_text: poppler-utils not installed");
    }
    let convert = Path::new("/usr/bin/convert-im6.q16").exists();
    if !convert {
        skip_or_fail(test, "thumbnail: imagemagick not installed");
    }
    for who in modes() {
        let o = cordon(
            who,
            &["run", "word_count", "-m", m],
            b"one two three\n",
            &[],
        );
        assert_eq!(code(&o), 0, "{who:?}: {}", text(&o.stderr));
        assert_eq!(
            text(&o.stdout).split_whitespace().collect::<Vec<_>>(),
            ["1", "3", "14"]
        );

        if pdftotext {
            let o = cordon(who, &["run", "pdf_to_text", "-m", m], &pdf, &[]);
            assert_eq!(code(&o), 0, "{who:?}: {}", text(&o.stderr));
            assert!(text(&o.stdout).contains("Quarterly report: revenue up 12 percent."));
        }
        if convert {
            let o = cordon(who, &["run", "thumbnail", "-m", m], &png, &[]);
            assert_eq!(code(&o), 0, "{who:?}: {}", text(&o.stderr));
            assert_eq!(
                &o.stdout[..8],
                b"\x89PNG\r\n\x1a\n",
                "binary output is passed unaltered"
            );
        }
    }
}

#[test]
fn run_json_record_has_every_field() {
    let m = example();
    let o = cordon(
        As::Caller,
        &["run", "word_count", "-m", m.to_str().unwrap(), "--json"],
        b"a b\n",
        &[],
    );
    assert_eq!(code(&o), 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in [
        "status",
        "exit_code",
        "signal",
        "duration_ms",
        "peak_memory_bytes",
        "output_bytes",
        "stderr",
        "reason",
    ] {
        assert!(v.get(k).is_some(), "missing {k}: {v}");
    }
    assert_eq!(v["status"], "ok");
    assert_eq!(v["output"]["envelope"]["trust"], "untrusted");
}

/// Each failure class: its exit status and the message a person acts on.
#[test]
fn every_failure_class_has_its_status_and_reason() {
    let cases: &[(&[&str], i32, &str)] = &[
        (&["exec", "--", "/bin/true"], 0, ""),
        (
            &["exec", "--", "/bin/sh", "-c", "echo bad >&2; exit 3"],
            10,
            "exec: exit 3",
        ),
        (
            &[
                "exec",
                "--wall",
                "1",
                "--",
                "/bin/sh",
                "-c",
                "while :; do :; done",
            ],
            11,
            "exec: timed out after 1s",
        ),
        (
            &[
                "exec",
                "--memory",
                "64M",
                "--",
                "/usr/bin/python3",
                "-c",
                "b = bytearray(512 << 20)",
            ],
            12,
            "exec: memory limit 64M exceeded (OOM kill)",
        ),
        (
            &[
                "exec",
                "--tasks",
                "8",
                "--",
                "/bin/sh",
                "-c",
                "for i in $(seq 40); do sleep 3 & done; wait",
            ],
            13,
            "exec: task limit 8 reached",
        ),
        (
            &["exec", "--output-bytes", "1M", "--", "/usr/bin/yes"],
            14,
            "exec: output over cap (1048576 bytes)",
        ),
        (
            &["exec", "--", "/nonexistent/tool"],
            21,
            "exec: program /nonexistent/tool does not exist inside the sandbox",
        ),
    ];
    for who in modes() {
        for (args, want, msg) in cases {
            if matches!(who, As::Nobody) && *want == 13 {
                // Unprivileged here there is no cgroup delegation: tasks
                // fall back to RLIMIT_NPROC, whose refusals are not counted
                // (checked in `unprivileged_fallback_is_announced`).
                continue;
            }
            // Memory falls back to RLIMIT_DATA: the tool's MemoryError is
            // the memory limit, reported as such.
            let msg = if matches!(who, As::Nobody) && *want == 12 {
                "exec: memory limit 64M exceeded (an allocation failed under RLIMIT_DATA, the limit without cgroups: \"MemoryError\")"
            } else {
                msg
            };
            let o = cordon(who, args, b"", &[]);
            let e = text(&o.stderr);
            assert_eq!(code(&o), *want, "{who:?} {args:?}: {e}");
            assert!(e.contains(msg), "{who:?} {args:?}: `{e}` lacks `{msg}`");
        }
    }
}

#[test]
fn unprivileged_fallback_is_announced() {
    if !modes().iter().any(|m| matches!(m, As::Nobody)) {
        return;
    }
    let o = cordon(As::Nobody, &["exec", "--", "/bin/true"], b"", &[]);
    assert_eq!(code(&o), 0);
    let e = text(&o.stderr);
    assert!(
        e.contains("cordon: warning: cgroup: partial (")
            && e.contains("memory capped per process by RLIMIT_DATA")
            && e.contains("tasks by RLIMIT_NPROC"),
        "no warning about the weaker mechanism: {e}"
    );
}

#[test]
fn the_jail_hides_host_secrets_files_and_processes() {
    for who in modes() {
        // Positive control: the same shell prints what it can see.
        let o = cordon(
            who,
            &[
                "exec",
                "--",
                "/bin/sh",
                "-c",
                "echo ctl; env; cat /etc/shadow; ls /root /home; ls /proc | grep -c '^[0-9]'",
            ],
            b"",
            &[("HOST_SECRET_TOKEN", "s3cr3t-canary")],
        );
        let out = text(&o.stdout);
        assert!(
            out.starts_with("ctl\n"),
            "{who:?}: control did not run: {out}"
        );
        assert!(
            !out.contains("s3cr3t-canary") && !out.contains("HOST_SECRET_TOKEN"),
            "{who:?}: {out}"
        );
        assert!(
            !out.contains("root:"),
            "{who:?}: /etc/shadow readable: {out}"
        );
        let e = text(&o.stderr);
        assert!(e.contains("/etc/shadow: No such file"), "{who:?}: {e}");
        // The control: the host has /root.
        assert!(Path::new("/root").is_dir());
        assert!(
            e.contains("ls: cannot access '/root': No such file"),
            "{who:?}: {e}"
        );
        // Only the sandbox's own processes (sh and ls, maybe grep).
        let n: usize = out
            .lines()
            .last()
            .unwrap_or("99")
            .trim()
            .parse()
            .unwrap_or(99);
        assert!(n <= 3, "{who:?}: sees {n} processes");
    }
}

#[test]
fn the_gate_strips_escapes_from_tool_output() {
    let o = cordon(
        As::Caller,
        &[
            "exec",
            "--",
            "/usr/bin/printf",
            "\\033[31mred\\033[0m \\342\\200\\256evil\\n",
        ],
        b"",
        &[],
    );
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "red evil\n");
    // The control: without the gate those bytes are there.
    let raw = Command::new("/usr/bin/printf")
        .arg("\\033[31mred\\033[0m \\342\\200\\256evil\\n")
        .output()
        .unwrap();
    assert!(raw.stdout.contains(&0x1b));
}

#[test]
fn calls_are_audited_and_queryable() {
    let audit = audit_file("audit");
    let a = audit.to_str().unwrap();
    let m = example();
    let o = cordon(
        As::Caller,
        &["run", "word_count", "-m", m.to_str().unwrap()],
        b"x\n",
        &[("CORDON_AUDIT", a)],
    );
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let o = cordon(
        As::Caller,
        &["exec", "--wall", "1", "--", "/bin/sleep", "5"],
        b"",
        &[("CORDON_AUDIT", a)],
    );
    assert_eq!(code(&o), 11);
    let o = cordon(
        As::Caller,
        &["audit", "query", "--tool", "word_count", "--json"],
        b"",
        &[("CORDON_AUDIT", a)],
    );
    let lines: Vec<serde_json::Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["status"], "ok");
    assert_eq!(lines[0]["input"]["bytes"], 2);
    assert_eq!(lines[0]["input"]["sha256"].as_str().unwrap().len(), 64);
    let o = cordon(
        As::Caller,
        &["audit", "query", "--since", "10m"],
        b"",
        &[("CORDON_AUDIT", a)],
    );
    let s = text(&o.stdout);
    assert!(
        s.contains("limit_hit") && s.contains("timed out after 1s"),
        "{s}"
    );
}

/// Egress through the doors, against a loopback upstream the test runs.
#[test]
fn exec_egress_reaches_only_the_allowlist() {
    if !Path::new("/usr/bin/curl").exists() {
        skip_or_fail(
            "exec_egress_reaches_only_the_allowlist",
            "curl not installed",
        );
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = std::io::Read::read(&mut s, &mut buf);
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
            );
        }
    });
    let allow = format!("api.test:{port}");
    let url = format!("http://api.test:{port}/");
    let evil = format!("http://evil.test:{port}/");
    let base = [
        "exec",
        "--egress",
        &allow,
        "--resolve",
        "api.test=127.0.0.1",
        "--allow-cidr",
        "127.0.0.1/32",
        "--",
    ];
    for who in modes() {
        // Both doors reach the allowed host.
        for extra in [&[][..], &["--noproxy", "*"][..]] {
            let mut args: Vec<&str> = base.to_vec();
            args.extend(["/usr/bin/curl", "-s", "--max-time", "5"]);
            args.extend(extra);
            args.push(&url);
            let o = cordon(who, &args, b"", &[]);
            assert_eq!(
                text(&o.stdout),
                "hello",
                "{who:?} {extra:?}: {}",
                text(&o.stderr)
            );
        }
        // An unlisted host is refused, with the reason, and the audit
        // record of the call lists the attempt and its decision.
        let audit = audit_file(&format!("egress-{who:?}"));
        let _ = std::fs::remove_file(&audit);
        let mut args: Vec<&str> = base.to_vec();
        args.extend(["/usr/bin/curl", "-s", "--max-time", "5", &evil]);
        let o = cordon(
            who,
            &args,
            b"",
            &[("CORDON_AUDIT", audit.to_str().unwrap())],
        );
        let rec: serde_json::Value = serde_json::from_str(
            std::fs::read_to_string(&audit)
                .unwrap()
                .lines()
                .last()
                .unwrap(),
        )
        .unwrap();
        let eg = rec["egress"]
            .as_array()
            .expect("egress attempts in the audit record");
        assert!(
            eg.iter()
                .any(|e| e["name"] == "evil.test" && e["decision"] == "deny"),
            "{who:?}: {rec}"
        );
        assert!(
            text(&o.stderr).contains(&format!(
                "egress to evil.test:{port} refused: not in the allowlist of exec"
            )),
            "{who:?}: {}",
            text(&o.stderr)
        );
        // Without --allow-cidr the loopback upstream is refused by vetting.
        let o = cordon(
            who,
            &[
                "exec",
                "--egress",
                &allow,
                "--resolve",
                "api.test=127.0.0.1",
                "--",
                "/usr/bin/curl",
                "-s",
                "--max-time",
                "5",
                &url,
            ],
            b"",
            &[],
        );
        assert!(
            text(&o.stderr).contains("a loopback address, not in allow_cidrs"),
            "{who:?}: {}",
            text(&o.stderr)
        );
        // No network at all without a grant: curl cannot connect (its exit
        // 7, cordon's status 10 for a failed tool), and what refuses is
        // seccomp, at the IP socket itself (EPERM); with a grant the same
        // socket is made (the control).
        let o = cordon(
            who,
            &[
                "exec",
                "--",
                "/usr/bin/curl",
                "-sS",
                "--max-time",
                "5",
                &format!("http://127.0.0.1:{port}/"),
            ],
            b"",
            &[],
        );
        let e = text(&o.stderr);
        assert_eq!(code(&o), 10, "{who:?}: {e}");
        assert!(o.stdout.is_empty(), "{who:?}: {}", text(&o.stdout));
        assert!(
            e.contains(&format!(
                "curl: (7) Failed to connect to 127.0.0.1 port {port}"
            )) && e.contains("exec: exit 7"),
            "{who:?}: {e}"
        );
        let socket = "import errno, socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n    print('ok')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])";
        let o = cordon(
            who,
            &["exec", "--", "/usr/bin/python3", "-c", socket],
            b"",
            &[],
        );
        assert_eq!(text(&o.stdout), "EPERM\n", "{who:?}: {}", text(&o.stderr));
        let mut args: Vec<&str> = base.to_vec();
        args.extend(["/usr/bin/python3", "-c", socket]);
        let o = cordon(who, &args, b"", &[]);
        assert_eq!(text(&o.stdout), "ok\n", "{who:?}: {}", text(&o.stderr));
    }
}

/// Fail closed: a tool whose sandbox has a probe that does not hold is not
/// started. The seed's example of rot: a directory mounted for debugging.
#[test]
fn probe_first_refuses_a_tool_whose_boundary_leaks() {
    if !Path::new("/home").is_dir() {
        skip_or_fail(
            "probe_first_refuses_a_tool_whose_boundary_leaks",
            "no /home on this host",
        );
        return;
    }
    let m = manifest("pf", LEAKY);
    let m = m.to_str().unwrap();
    // Control: the same tool without the mount is probed, holds, and runs.
    let o = cordon(
        As::Caller,
        &["run", "tidy", "-m", m, "--probe-first"],
        b"a\n",
        &[],
    );
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let o = cordon(
        As::Caller,
        &["run", "leaky", "-m", m, "--probe-first"],
        b"a\n",
        &[],
    );
    assert_eq!(code(&o), 21, "{}", text(&o.stderr));
    let e = text(&o.stderr);
    assert!(
        e.contains("leaky: refusing to start") && e.contains("host_fs Escaped"),
        "{e}"
    );
    assert!(o.stdout.is_empty(), "the tool ran anyway");
    // And `cordon probe` reports the escape with exit 1.
    let o = cordon(
        As::Caller,
        &["probe", "-m", m, "--tool", "leaky", "--only", "host_fs"],
        b"",
        &[],
    );
    assert_eq!(code(&o), 1, "{}", text(&o.stdout));
    assert!(text(&o.stdout).contains("ESCAPED"), "{}", text(&o.stdout));
}

/// Fail closed at the front door: `cordon serve` does not serve a tool
/// whose sandbox has a probe that does not hold, and says which.
#[test]
fn serve_does_not_serve_a_tool_whose_boundary_leaks() {
    use std::io::{BufRead, BufReader};
    if !Path::new("/home").is_dir() {
        skip_or_fail(
            "serve_does_not_serve_a_tool_whose_boundary_leaks",
            "no /home on this host",
        );
        return;
    }
    let m = manifest("serve-pf", LEAKY);
    let mut child = Command::new(CORDON)
        .args(["serve", "-m", m.to_str().unwrap()])
        .env("CORDON_AUDIT", audit_file("serve-pf"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut sin = child.stdin.take().unwrap();
    let mut sout = BufReader::new(child.stdout.take().unwrap());
    let send = |sin: &mut std::process::ChildStdin, v: serde_json::Value| {
        writeln!(sin, "{v}").unwrap();
        sin.flush().unwrap();
    };
    send(
        &mut sin,
        serde_json::json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"cli-test","version":"0"}}}),
    );
    let mut line = String::new();
    sout.read_line(&mut line).unwrap();
    assert!(line.contains("\"id\":1"), "{line}");
    send(
        &mut sin,
        serde_json::json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    );
    send(
        &mut sin,
        serde_json::json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}),
    );
    line.clear();
    sout.read_line(&mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let names: Vec<&str> = v["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    drop(sin);
    let out = child.wait_with_output().unwrap();
    let e = text(&out.stderr);
    // The control: the tool without the mount is served.
    assert_eq!(names, ["tidy"], "{e}");
    assert!(
        e.contains("leaky: refusing to start") && e.contains("host_fs"),
        "{e}"
    );
}

/// `cordon serve` proves each tool at start and remembers a proof that
/// held: the next start with nothing changed serves it without proving it
/// again, saying so; a refusal is never remembered; a change to the tool's
/// policy, or `--reprove`, proves it again.
#[test]
fn serve_remembers_a_proof_until_what_it_depended_on_changes() {
    if !Path::new("/home").is_dir() {
        skip_or_fail(
            "serve_remembers_a_proof_until_what_it_depended_on_changes",
            "no /home on this host",
        );
        return;
    }
    let m = manifest("proofs", LEAKY);
    let state = m.parent().unwrap().join("state");
    let st = state.to_str().unwrap();
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", "-m", m.to_str().unwrap()];
        args.extend(extra);
        let o = cordon(As::Caller, &args, b"", &[("CORDON_STATE_DIR", st)]);
        text(&o.stderr)
    };
    let e = serve(&[]);
    assert!(e.contains("proving 2 tools, "), "{e}");
    assert!(e.contains("cordon: tidy: held ("), "{e}");
    assert!(e.contains("leaky: refusing to start"), "{e}");
    assert!(state.join("proofs.json").is_file(), "{e}");
    // Nothing changed: tidy's proof is remembered, leaky proved again.
    let e = serve(&[]);
    assert!(
        e.contains("cordon: tidy: held (proved ") && e.contains("unchanged)"),
        "{e}"
    );
    assert!(e.contains("proving 1 tool, "), "{e}");
    assert!(e.contains("leaky: refusing to start"), "{e}");
    assert!(e.contains("1 of 2 tools proved"), "{e}");
    // --reprove proves every tool.
    let e = serve(&["--reprove"]);
    assert!(e.contains("proving 2 tools, "), "{e}");
    assert!(!e.contains("held (proved "), "{e}");
    // A changed limit is another policy: proved again.
    std::fs::write(&m, LEAKY.replacen("wall_seconds: 2", "wall_seconds: 3", 1)).unwrap();
    let e = serve(&[]);
    assert!(e.contains("proving 2 tools, "), "{e}");
    assert!(!e.contains("held (proved "), "{e}");
    // A changed CORDON_* setting is another host: proved again.
    let e = serve(&[]);
    assert!(e.contains("tidy: held (proved "), "{e}");
    let o = cordon(
        As::Caller,
        &["serve", "-m", m.to_str().unwrap()],
        b"",
        &[
            ("CORDON_STATE_DIR", st),
            ("CORDON_UNPACK_MAX_ENTRIES", "999"),
        ],
    );
    let e = text(&o.stderr);
    assert!(e.contains("proving 2 tools, "), "{e}");
}

/// `cordon probe` runs the catalogue inside a tool's own sandbox with its
/// egress doors: the doors lead only to the broker, so the outside,
/// metadata and private targets stay unreachable. Run in a network
/// namespace with stand-ins bound on loopback, so nothing can leave.
#[test]
fn probe_covers_a_tool_with_egress_doors() {
    if !is_root() {
        skip_or_fail(
            "probe_covers_a_tool_with_egress_doors",
            "the stand-in network namespace needs root",
        );
        return;
    }
    let m = manifest(
        "probe-eg",
        "tools:\n  fetcher:\n    profile: P2\n    command: [/usr/bin/curl, -s]\n    limits: {wall_seconds: 3}\n    egress: [\"api.test:18080\"]\n    resolve: {api.test: 127.0.0.1}\n    allow_cidrs: [127.0.0.1/32]\n",
    );
    let o = Command::new(repo().join("scripts/probe-standins.sh"))
        .args([
            CORDON,
            "probe",
            "-m",
            m.to_str().unwrap(),
            "--only",
            "escape",
            "--json",
        ])
        .env("CORDON_AUDIT", audit_file("probe-eg"))
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}{}", text(&o.stdout), text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = &v["reports"][0];
    assert!(
        r["sandbox"].as_str().unwrap().contains("egress doors"),
        "{r}"
    );
    let verdict = |name: &str| {
        r["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["probe"] == name)
            .map(|p| p["verdict"].as_str().unwrap_or("").to_string())
            .unwrap_or_default()
    };
    assert_eq!(verdict("control"), "held", "{r}");
    for p in ["network", "metadata", "private", "dns", "host_fs", "env"] {
        assert_eq!(verdict(p), "held", "{p}: {r}");
    }
}

/// The gate is configurable per tool: a class turned off in the manifest
/// passes through, the others are still removed.
#[test]
fn gate_classes_are_configurable_per_tool() {
    let m = manifest(
        "gatecfg",
        "tools:\n  strict:\n    profile: P1\n    command: [/usr/bin/printf, \"\\\\033[1mX\\\\033[0m\\\\342\\\\200\\\\213Y\"]\n  colour:\n    profile: P1\n    command: [/usr/bin/printf, \"\\\\033[1mX\\\\033[0m\\\\342\\\\200\\\\213Y\"]\n    output: {strip: {ansi: false, control: false}}\n",
    );
    let m = m.to_str().unwrap();
    let o = cordon(As::Caller, &["run", "strict", "-m", m], b"", &[]);
    assert_eq!(text(&o.stdout), "XY", "{}", text(&o.stderr));
    let o = cordon(As::Caller, &["run", "colour", "-m", m], b"", &[]);
    // Escapes kept (ESC is a control character too), the zero-width space still removed.
    assert_eq!(
        text(&o.stdout),
        "\u{1b}[1mX\u{1b}[0mY",
        "{}",
        text(&o.stderr)
    );
}

/// `cordon proxy`: the same door on a host address, same checks, same
/// audit records.
#[test]
fn proxy_serves_the_door_on_a_host_address() {
    use std::io::Read;
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let up = upstream.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in upstream.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let audit = audit_file("proxy");
    let _ = std::fs::remove_file(&audit);
    let mut child = Command::new(CORDON)
        .args([
            "proxy",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--egress",
            &format!("api.test:{up}"),
            "--resolve",
            "api.test=127.0.0.1",
            "--allow-cidr",
            "127.0.0.1/32",
            "--name",
            "tproxy",
            "--audit",
            audit.to_str().unwrap(),
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ask = |host: &str| -> String {
        for _ in 0..100 {
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                let _ = write!(
                    s,
                    "GET http://{host}:{up}/x HTTP/1.1\r\nHost: {host}:{up}\r\nConnection: close\r\n\r\n"
                );
                let mut out = String::new();
                let _ = s.read_to_string(&mut out);
                return out;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        String::new()
    };
    let ok = ask("api.test");
    let evil = ask("evil.test");
    // An allowed request's record is written once its upstream connection
    // has closed, which may be after the client has its answer.
    for _ in 0..200 {
        let n = std::fs::read_to_string(&audit)
            .map(|l| l.lines().count())
            .unwrap_or(0);
        if n >= 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("ok"), "{ok}");
    assert!(evil.starts_with("HTTP/1.1 403"), "{evil}");
    assert!(
        evil.contains(&format!(
            "egress to evil.test:{up} refused: not in the allowlist of tproxy"
        )),
        "{evil}"
    );
    let log = std::fs::read_to_string(&audit).unwrap();
    assert_eq!(log.lines().count(), 2, "{log}");
    assert!(
        log.contains("\"decision\":\"deny\"") && log.contains("\"decision\":\"allow\""),
        "{log}"
    );
}

/// `cordon proxy` honours fail-closed audit: a log that cannot be opened
/// refuses to start it, and a record that cannot be written (the log is
/// /dev/full) stops it with status 22 after the connection it records;
/// `--audit-fail-open` goes on. Every record not written is counted, and
/// `cordon doctor` says so.
#[test]
fn proxy_fails_closed_when_its_audit_record_cannot_be_written() {
    use std::io::Read;
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let up = upstream.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in upstream.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    let dir = audit_file("proxy-full").parent().unwrap().to_path_buf();
    let state = dir.join("state");
    let _ = std::fs::remove_dir_all(&state);
    let unwritten = state.join("audit-unwritten.jsonl");
    let proxy = |audit: &Path, extra: &[&str]| {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut args = vec![
            "proxy".to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--egress".into(),
            format!("api.test:{up}"),
            "--resolve".into(),
            "api.test=127.0.0.1".into(),
            "--allow-cidr".into(),
            "127.0.0.1/32".into(),
            "--name".into(),
            "tproxy".into(),
            "--audit".into(),
            audit.to_str().unwrap().into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = Command::new(CORDON)
            .args(&args)
            .env("CORDON_STATE_DIR", &state)
            .env_remove("CORDON_AUDIT_FAIL_OPEN")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        (child, port)
    };
    let ask = |port: u16| -> String {
        for _ in 0..200 {
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                let _ = write!(
                    s,
                    "GET http://api.test:{up}/x HTTP/1.1\r\nHost: api.test:{up}\r\nConnection: close\r\n\r\n"
                );
                let mut out = String::new();
                let _ = s.read_to_string(&mut out);
                return out;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        String::new()
    };
    let count = || cordon_audit::read_unwritten(&unwritten).unwrap().count;

    // A log that cannot be opened (its directory is a file): not started.
    let blocker = dir.join("a-file");
    std::fs::write(&blocker, b"").unwrap();
    let (child, _) = proxy(&blocker.join("audit.jsonl"), &[]);
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(22), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("cannot be opened")
            && text(&o.stderr).contains("--audit-fail-open"),
        "{}",
        text(&o.stderr)
    );

    // /dev/full, fail-closed: the request is served (its record comes once
    // its connection has closed), then the proxy stops with status 22.
    let (mut child, port) = proxy(Path::new("/dev/full"), &[]);
    let ok = ask(port);
    assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("ok"), "{ok}");
    let mut status = None;
    for _ in 0..400 {
        status = child.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if status.is_none() {
        let _ = child.kill();
    }
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(22), "{err}");
    assert!(
        err.contains("stopped: an audit record could not be written"),
        "{err}"
    );
    assert!(err.contains("the audit record of egress (tproxy"), "{err}");
    assert_eq!(count(), 1);
    let last = cordon_audit::read_unwritten(&unwritten)
        .unwrap()
        .last
        .unwrap();
    assert_eq!(
        (last.what.as_str(), last.tool.as_str()),
        ("egress", "tproxy")
    );

    // --audit-fail-open: it goes on, each record still counted.
    let (mut child, port) = proxy(Path::new("/dev/full"), &["--audit-fail-open"]);
    for _ in 0..2 {
        let ok = ask(port);
        assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("ok"), "{ok}");
    }
    for _ in 0..400 {
        if count() >= 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the fail-open proxy stopped"
    );
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(count(), 3);

    // `cordon doctor` says how many were not written.
    let o = Command::new(CORDON)
        .arg("doctor")
        .env("CORDON_STATE_DIR", &state)
        .output()
        .unwrap();
    let out = text(&o.stdout);
    assert!(
        out.contains("3 audit record(s) could not be written; first: egress at"),
        "{out}"
    );
    // The positive control: a state directory with none is clean.
    let o = Command::new(CORDON)
        .arg("doctor")
        .env("CORDON_STATE_DIR", dir.join("clean-state"))
        .output()
        .unwrap();
    assert!(
        text(&o.stdout).contains("every audit record was written"),
        "{}",
        text(&o.stdout)
    );
}

/// A root broker without CAP_SYS_ADMIN (a restricted container) cannot make
/// the pooled network namespaces; it says so and each sandbox makes its own
/// inside its user namespace: still no network, never the host's.
#[test]
fn root_without_cap_sys_admin_still_gets_a_private_network() {
    if !is_root() || !Path::new("/usr/bin/setpriv").exists() {
        skip_or_fail(
            "root_without_cap_sys_admin_still_gets_a_private_network",
            "needs root and /usr/bin/setpriv",
        );
        return;
    }
    let host_ns = std::fs::read_link("/proc/self/ns/net").unwrap();
    let script = "readlink /proc/self/ns/net; cat /proc/net/dev | tail -n +3 | cut -d: -f1";
    let run = |drop_admin: bool| {
        let mut cmd = Command::new("/usr/bin/setpriv");
        if drop_admin {
            cmd.arg("--bounding-set=-sys_admin");
        }
        let o = cmd
            .args([CORDON, "exec", "--", "/bin/sh", "-c", script])
            .env("CORDON_AUDIT", audit_file("capsysadmin"))
            .output()
            .unwrap();
        assert_eq!(code(&o), 0, "{}\n{}", text(&o.stdout), text(&o.stderr));
        text(&o.stdout)
    };
    for drop_admin in [false, true] {
        let out = run(drop_admin);
        let mut lines = out.lines();
        let ns = lines.next().unwrap_or_default();
        assert!(ns.starts_with("net:["), "{out}");
        assert_ne!(
            ns,
            host_ns.to_string_lossy(),
            "sandbox in the host's namespace"
        );
        // Only a loopback device, whoever made the namespace.
        let devs: Vec<&str> = lines.map(str::trim).collect();
        assert_eq!(devs, ["lo"], "{out}");
    }
    let o = Command::new("/usr/bin/setpriv")
        .args(["--bounding-set=-sys_admin", CORDON, "doctor"])
        .output()
        .unwrap();
    let report = text(&o.stdout);
    assert!(
        report.contains("cannot create network namespaces (EPERM"),
        "{report}"
    );
    assert!(
        report.contains("a new network namespace per sandbox"),
        "{report}"
    );
    // Control: with CAP_SYS_ADMIN the pool is in use.
    let o = Command::new(CORDON).arg("doctor").output().unwrap();
    assert!(
        text(&o.stdout).contains("from a pool"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
/// A broker whose own v2 cgroup was once killed through cgroup.kill: the
/// kernel kills every process born from it into another cgroup with
/// CLONE_INTO_CGROUP (6.18). The broker detects it and moves its sandboxes
/// in by themselves; without that, every call here dies with SIGKILL.
fn broker_in_a_once_killed_cgroup_still_runs_tools() {
    if !is_root() {
        skip_or_fail(
            "broker_in_a_once_killed_cgroup_still_runs_tools",
            "needs root",
        );
        return;
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let Some(v2) = mounts
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&"cgroup2"))
        .and_then(|f| f.get(1).map(|m| m.to_string()))
    else {
        skip_or_fail(
            "broker_in_a_once_killed_cgroup_still_runs_tools",
            "no cgroup v2 hierarchy mounted",
        );
        return;
    };
    let own = Path::new(&v2).join(format!("cordon-killed-once-{}", std::process::id()));
    std::fs::create_dir_all(&own).unwrap();
    if std::fs::write(own.join("cgroup.kill"), "1").is_err() {
        skip_or_fail(
            "broker_in_a_once_killed_cgroup_still_runs_tools",
            "no cgroup.kill (kernel before 5.14)",
        );
        let _ = std::fs::remove_dir(&own);
        return;
    }
    let in_own = |args: &str| {
        Command::new("/bin/sh")
            .args([
                "-c",
                &format!(
                    "echo $$ > {}/cgroup.procs && exec {CORDON} {args}",
                    own.display()
                ),
            ])
            .env("CORDON_AUDIT", audit_file("killedonce"))
            .output()
            .unwrap()
    };
    let o = in_own("exec -- /bin/sh -c 'echo alive'");
    let doctor = in_own("doctor");
    // Clean up before asserting: the broker's directories under our cgroup.
    fn rm_tree(d: &Path) {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    rm_tree(&e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(d);
    }
    rm_tree(&own);
    assert_eq!(code(&o), 0, "{}\n{}", text(&o.stdout), text(&o.stderr));
    assert_eq!(text(&o.stdout), "alive\n");
    assert!(
        text(&doctor.stdout).contains("killed at birth"),
        "{}",
        text(&doctor.stdout)
    );
}

/// A one-shot run leaves nothing on the host: where no shared mount point
/// for sandbox roots can be used (uid 65534 without `XDG_RUNTIME_DIR`),
/// cordon makes its own `cordon-root-*` under `TMPDIR`; it is there while
/// the tool runs (the control) and gone when cordon has exited, for a run
/// that succeeds and one whose tool fails.
#[test]
fn a_one_shot_run_leaves_no_root_directory_behind() {
    if !is_root() || !Path::new("/usr/bin/setpriv").exists() {
        skip_or_fail(
            &this_test(),
            "the run as uid 65534 needs root and /usr/bin/setpriv",
        );
        return;
    }
    let tmp = dir_for("own-tmp");
    let roots = || -> Vec<String> {
        names_in(&tmp)
            .into_iter()
            .filter(|n| n.starts_with("cordon-root-"))
            .collect()
    };
    let audit = audit_file("own-tmp");
    let run = |script: &str| {
        let mut c = nobody_with_tmpdir(&tmp);
        c.args(["exec", "--audit"])
            .arg(&audit)
            .args(["--", "/bin/sh", "-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    // The control: the directory exists while a tool runs.
    let child = run("sleep 3");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while roots().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no cordon-root-* appeared in {}",
            tmp.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(roots(), Vec::<String>::new(), "left behind after a run");
    let out = run("exit 3").wait_with_output().unwrap();
    assert!(
        text(&out.stderr).contains("exit 3"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        roots(),
        Vec::<String>::new(),
        "left behind after a failed run"
    );
}

/// `cordon serve` as uid 65534 without `XDG_RUNTIME_DIR`, with a sticky
/// `TMPDIR` (as `/tmp` is): its sandboxes' roots are mounted on the one
/// reused `TMPDIR/cordon-65534/root` (made on the first run, owned by
/// 65534, mode 0755), and nothing else is left when it ends at its stdin's
/// end: before, each such broker made a `cordon-root-*` it never removed.
#[test]
fn serve_as_an_unprivileged_user_leaves_only_its_reused_root_directory() {
    if !is_root() || !Path::new("/usr/bin/setpriv").exists() {
        skip_or_fail(
            &this_test(),
            "the run as uid 65534 needs root and /usr/bin/setpriv",
        );
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = dir_for("sticky-tmp");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let m = manifest(
        "sticky-tmp",
        "accept: [cgroup]\ntools:\n  count:\n    profile: P1\n    command: [/usr/bin/wc, -c]\n    input: {stdin: text}\n    input_schema: {type: object, properties: {text: {type: string}}, required: [text]}\n",
    );
    let audit = audit_file("sticky-tmp");
    let requests = concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        "\n",
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        "\n",
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"count","arguments":{"text":"abcd"}}}"#,
        "\n",
    );
    for round in 0..2 {
        let mut child = nobody_with_tmpdir(&tmp)
            .args(["serve", "-m"])
            .arg(&m)
            .args(["--audit"])
            .arg(&audit)
            .env_remove("CORDON_MANIFEST")
            .env("HOME", dir_for("sticky-home"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The answer is read before stdin ends: the call has run.
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(requests.as_bytes()).unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
        let answer = lines
            .find(|l| l.as_ref().map(|l| l.contains(r#""id":2"#)).unwrap_or(true))
            .expect("no answer to the call")
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
        let said = v["result"]["content"][0]["text"].as_str().unwrap_or("");
        assert!(
            said.lines().any(|l| l == "4") && v["result"]["isError"] == false,
            "round {round}: {answer}"
        );
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "round {round}: {}", text(&out.stderr));
        assert_eq!(
            names_in(&tmp),
            vec!["cordon-65534".to_owned()],
            "round {round}: left in TMPDIR"
        );
        let root = tmp.join("cordon-65534/root");
        let md = std::fs::symlink_metadata(&root).unwrap();
        assert!(md.is_dir());
        assert_eq!((md.uid(), md.mode() & 0o7777), (65534, 0o755));
    }
}
