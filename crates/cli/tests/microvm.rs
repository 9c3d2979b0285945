//! `runtime: microvm` from the CLI, as a user runs it: `cordon exec
//! --runtime microvm --image`, a manifest's microvm tool through `cordon
//! run` and `cordon serve`, as root and as uid 65534, and `cordon doctor`'s
//! microvm lines. Real QEMU under TCG (`CORDON_VM_ACCEL=tcg`: the host
//! decides emulation, so a tool must accept `kvm` by name), Debian's cloud
//! kernel and the static guest init. A missing piece fails the test.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cordon_mcp::rmcp::model::CallToolRequestParams;
use cordon_testkit::Scratch;
use cordon_testkit::vm::{init, processes_naming};

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A store of its own with the busybox image, for root or for uid 65534.
struct Store {
    dir: Scratch,
    reference: String,
    nobody: bool,
}

impl Store {
    fn path(&self) -> PathBuf {
        self.dir.join("store")
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn command(store: &Store, args: &[&str]) -> Command {
    let mut c = if store.nobody {
        let mut c = Command::new("/usr/bin/setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            CORDON,
        ]);
        c.env("CORDON_RUN_DIR", store.dir.join("run"));
        c
    } else {
        Command::new(CORDON)
    };
    c.args(args)
        .env("CORDON_STORE", store.path())
        .env("CORDON_AUDIT", store.dir.join("audit.jsonl"))
        .env("CORDON_VM_INIT", init())
        .env("CORDON_VM_ACCEL", "tcg")
        .env_remove("CORDON_MANIFEST")
        .env_remove("XDG_RUNTIME_DIR")
        .current_dir("/");
    c
}

fn cordon(store: &Store, args: &[&str], input: &[u8]) -> Output {
    let mut child = command(store, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cordon");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// `tests/images/build.sh KIND` into `layout`.
fn build_image(kind: &str, layout: &Path) {
    let o = Command::new(repo().join("tests/images/build.sh"))
        .arg(kind)
        .arg(layout)
        .output()
        .unwrap();
    assert!(o.status.success(), "build.sh {kind}: {}", text(&o.stderr));
}

/// `cordon image load LAYOUT --name NAME` into `s`'s store: the pinned
/// reference it prints.
fn load_image(s: &Store, layout: &Path, name: &str) -> String {
    let o = cordon(
        s,
        &["image", "load", layout.to_str().unwrap(), "--name", name],
        b"",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    text(&o.stdout).trim().to_string()
}

/// How many template snapshots the store holds.
fn templates(s: &Store) -> usize {
    std::fs::read_dir(s.path().join("vm/snapshots"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "snap"))
                .count()
        })
        .unwrap_or(0)
}

fn store(nobody: bool) -> Store {
    let dir = cordon_testkit::scratch::named(if nobody {
        "cordon-vm-cli-nobody-"
    } else {
        "cordon-vm-cli-"
    });
    let layout = dir.join("layout");
    build_image("busybox", &layout);
    if nobody {
        std::fs::create_dir_all(dir.join("run")).unwrap();
        for p in [dir.path().to_path_buf(), dir.join("run"), layout.clone()] {
            Command::new("chown")
                .args(["-R", "65534:65534"])
                .arg(&p)
                .status()
                .unwrap();
        }
    }
    let mut s = Store {
        dir,
        reference: String::new(),
        nobody,
    };
    s.reference = load_image(&s, &layout, "busybox");
    s
}

#[test]
fn exec_runtime_microvm_runs_an_image_in_a_guest_and_says_what_it_refuses() {
    let s = store(false);
    let r = s.reference.clone();
    let script = "cat; cat /proc/cmdline; id -u; exit 4";
    // Emulation is not accepted by default: refused, naming kvm.
    let o = cordon(
        &s,
        &[
            "exec",
            "--runtime",
            "microvm",
            "--image",
            &r,
            "--",
            "/bin/sh",
            "-c",
            script,
        ],
        b"in\n",
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(21), "{err}");
    assert!(
        err.contains("kvm: missing") && err.contains("accept: [kvm]"),
        "{err}"
    );
    assert!(o.stdout.is_empty());
    // Accepted by name: it runs in a guest kernel of its own.
    let o = cordon(
        &s,
        &[
            "exec",
            "--runtime",
            "microvm",
            "--accept",
            "kvm",
            "--image",
            &r,
            "--",
            "/bin/sh",
            "-c",
            script,
        ],
        b"in\n",
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(10), "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "in", "{out}");
    assert!(
        lines[1].contains("panic=-1"),
        "not the guest's kernel: {out}"
    );
    assert_eq!(lines[2], "0", "{out}");
    assert!(
        err.contains("kvm: missing") && err.contains("[accepted]"),
        "{err}"
    );
    // The run record says so too.
    let o = cordon(
        &s,
        &[
            "exec",
            "--json",
            "--runtime",
            "microvm",
            "--accept",
            "kvm",
            "--image",
            &r,
            "--",
            "/bin/sh",
            "-c",
            "exit 4",
        ],
        b"",
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json record");
    assert_eq!(v["exit_code"], 4, "{v}");
    // `--boot cold`: the guest boots from nothing and no template is made
    // (the runs above made one: the count below is of a directory that
    // holds them; another memory size would be another template).
    let before = templates(&s);
    assert!(before >= 1, "no template in the store's vm/snapshots");
    let cold = |wall: &str, script: &str| {
        cordon(
            &s,
            &[
                "exec",
                "--runtime",
                "microvm",
                "--boot",
                "cold",
                "--accept",
                "kvm",
                "--memory",
                "96M",
                "--wall",
                wall,
                "--image",
                &r,
                "--",
                "/bin/sh",
                "-c",
                script,
            ],
            b"",
        )
    };
    // The tool's wall clock is counted from the task's start: a cold boot
    // under emulation takes longer than this 1 s and the task still runs.
    let t = std::time::Instant::now();
    let o = cold("1", "cat /proc/cmdline; echo cold");
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    // The premise, or the test proves nothing: the call outlasted the 1 s.
    assert!(
        t.elapsed() > std::time::Duration::from_secs(1),
        "the cold call took {:?}, within the wall clock it is to outlast",
        t.elapsed()
    );
    assert!(out.contains("panic=-1") && out.ends_with("cold\n"), "{out}");
    assert_eq!(templates(&s), before, "a cold boot made a template");
    // And it holds: a task past it is stopped (its output withheld, as
    // for every runtime); the reason is the guest's, sent once the task
    // had started.
    let o = cold("1", "echo started; sleep 30");
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(11), "{out}{err}");
    assert_eq!(out, "", "{err}");
    assert!(
        err.contains("exec: timed out after 1s") && err.contains("booted cold"),
        "{err}"
    );
    // `--boot` is the microVM's alone.
    let o = cordon(&s, &["exec", "--boot", "cold", "--", "/bin/true"], b"");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--boot applies only with `--runtime microvm`"),
        "{err}"
    );
    // No image: the guest shares nothing of the host's file system.
    let o = cordon(
        &s,
        &[
            "exec",
            "--runtime",
            "microvm",
            "--accept",
            "kvm",
            "--",
            "/bin/true",
        ],
        b"",
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(21), "{err}");
    assert!(err.contains("runtime microvm runs an image"), "{err}");
}

#[test]
fn a_manifest_microvm_tool_runs_and_is_served() {
    let s = store(false);
    let r = &s.reference;
    let m = s.dir.join("m.yaml");
    std::fs::write(
        &m,
        format!(
            "tools:\n  vm_count:\n    profile: P3\n    runtime: microvm\n    accept: [kvm]\n    image: {r}\n    command: [/bin/sh, -c, \"wc -c; grep -c panic=-1 /proc/cmdline\"]\n    network: none\n    limits: {{wall_seconds: 60, memory: 128M}}\n    input: {{stdin: text}}\n    input_schema:\n      type: object\n      properties: {{text: {{type: string}}}}\n      required: [text]\n  vm_strict:\n    profile: P3\n    runtime: microvm\n    image: {r}\n    command: [/bin/true]\n    network: none\n"
        ),
    )
    .unwrap();
    let ms = m.to_str().unwrap();
    // `boot: cold` as a manifest says it: explained, and run in a guest
    // booted for the task (a manifest of its own: `serve` below probes
    // every tool, and a cold tool's probes each boot a guest).
    let cold = s.dir.join("cold.yaml");
    std::fs::write(
        &cold,
        format!(
            "tools:\n  vm_cold:\n    profile: P3\n    runtime: microvm\n    accept: [kvm]\n    boot: cold\n    image: {r}\n    command: [/bin/sh, -c, \"grep -c panic=-1 /proc/cmdline\"]\n    network: none\n"
        ),
    )
    .unwrap();
    let cs = cold.to_str().unwrap();
    let o = cordon(&s, &["explain", "vm_cold", "-m", cs], b"");
    assert!(
        text(&o.stdout).contains("boot: cold"),
        "{}",
        text(&o.stdout)
    );
    let o = cordon(&s, &["run", "vm_cold", "-m", cs], b"");
    assert_eq!(text(&o.stdout).trim(), "1", "{}", text(&o.stderr));
    let o = cordon(&s, &["run", "vm_count", "-m", ms], b"abcd");
    assert_eq!(
        text(&o.stdout).split_whitespace().collect::<Vec<_>>(),
        ["4", "1"],
        "{}",
        text(&o.stderr)
    );
    // Without `accept: [kvm]`, the same image is refused, saying why.
    let o = cordon(&s, &["run", "vm_strict", "-m", ms], b"");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(21), "{err}");
    assert!(err.contains("kvm: missing"), "{err}");
    // `cordon probe` runs the catalogue inside the guest, the agent carried
    // in on a disk of its own: every escape probe holds (the resource ones
    // run at `serve`'s start below, and in crates/probes' guest suite).
    let o = cordon(
        &s,
        &["probe", "--tool", "vm_count", "--only", "escape", "-m", ms],
        b"",
    );
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    assert!(
        out.contains("HELD     processes") && out.contains(" 0 escaped, 0 error"),
        "{out}"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Served, probed at start like any tool (no `--no-probe`).
        let c = cordon_testkit::serve::Serve::manifest(CORDON, &m, &s.dir.join("serve.jsonl"))
            .env("CORDON_STORE", s.path())
            .env("CORDON_VM_INIT", init())
            .env("CORDON_VM_ACCEL", "tcg")
            .stdio((), Stdio::inherit())
            .await;
        let mut p = CallToolRequestParams::new("vm_count".to_owned());
        p.arguments = serde_json::json!({"text": "hello"}).as_object().cloned();
        let res = c.peer().call_tool(p).await.unwrap();
        let t: String = res
            .content
            .iter()
            .filter_map(|x| x.as_text().map(|t| t.text.clone()))
            .collect();
        // The gate's envelope around the tool's own output.
        assert!(
            t.contains("tool=\"vm_count\"") && t.contains("\n5\n1\n"),
            "{t}"
        );
        let _ = c.cancel().await;
    });
    // `serve` makes a tool's template at its start, not at its first call:
    // a tool of another memory size (another template) whose guest no call
    // has started, served without start probes (which make templates of
    // their own): one template more once serving, none at the first call.
    let ready = s.dir.join("ready.yaml");
    std::fs::write(
        &ready,
        format!(
            "tools:\n  vm_ready:\n    profile: P3\n    runtime: microvm\n    accept: [kvm]\n    image: {r}\n    command: [/bin/sh, -c, \"echo ready\"]\n    network: none\n    limits: {{wall_seconds: 60, memory: 256M}}\n"
        ),
    )
    .unwrap();
    let before = templates(&s);
    let log = s.dir.join("ready.stderr");
    rt.block_on(async {
        let c = cordon_testkit::serve::Serve::manifest(CORDON, &ready, &s.dir.join("ready.jsonl"))
            .arg("--no-probe")
            .env("CORDON_STORE", s.path())
            .env("CORDON_VM_INIT", init())
            .env("CORDON_VM_ACCEL", "tcg")
            .stdio((), Stdio::from(std::fs::File::create(&log).unwrap()))
            .await;
        let served = templates(&s);
        let res = c
            .peer()
            .call_tool(CallToolRequestParams::new("vm_ready".to_owned()))
            .await
            .unwrap();
        let t: String = res
            .content
            .iter()
            .filter_map(|x| x.as_text().map(|t| t.text.clone()))
            .collect();
        let _ = c.cancel().await;
        let err = std::fs::read_to_string(&log).unwrap();
        assert!(t.contains("\nready\n"), "{t}\n{err}");
        assert_eq!(served, before + 1, "serving made no template: {err}");
        assert_eq!(
            templates(&s),
            served,
            "the first call made a template: {err}"
        );
    });
    // `image gc` after `image rm`: the guest's disk and template go with
    // the image (positive control: both are there before).
    let disks = |s: &Store| {
        std::fs::read_dir(s.path().join("vm/images"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    assert!(disks(&s) > 0);
    let o = cordon(&s, &["image", "gc"], b"");
    assert!(
        text(&o.stdout).contains("microVM: 0 disks, 0 snapshots"),
        "{}",
        text(&o.stdout)
    );
    assert!(
        disks(&s) > 0,
        "gc removed the disk of an image still in the store"
    );
    let o = cordon(&s, &["image", "rm", r], b"");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = cordon(&s, &["image", "gc"], b"");
    let out = text(&o.stdout);
    // The image's disk and its two templates (128 and 256 MiB), and the
    // probes' carried disk and their template: all of the image's.
    assert!(
        out.contains("microVM: 2 disks, 3 snapshots, 1 initramfs"),
        "{out}"
    );
    assert_eq!(disks(&s), 0, "{out}");
}

#[test]
fn an_unprivileged_broker_runs_a_microvm() {
    let s = store(true);
    let r = s.reference.clone();
    // uid 65534 has no cgroup delegation here: P3 requires cgroup limits,
    // so it is refused unless accepted, naming cgroup.
    let o = cordon(
        &s,
        &[
            "exec",
            "--runtime",
            "microvm",
            "--accept",
            "kvm",
            "--image",
            &r,
            "--",
            "/bin/true",
        ],
        b"",
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(21), "{err}");
    assert!(err.contains("cgroup: missing"), "{err}");
    let o = cordon(
        &s,
        &[
            "exec",
            "--runtime",
            "microvm",
            "--accept",
            "kvm",
            "--accept",
            "cgroup",
            "--image",
            &r,
            "--",
            "/bin/sh",
            "-c",
            "cat; grep -c panic=-1 /proc/cmdline",
        ],
        b"from nobody\n",
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert_eq!(out, "from nobody\n1\n", "{err}");
}

#[test]
fn doctor_names_the_microvm_parts_and_the_accelerator() {
    let s = store(false);
    let o = cordon(&s, &["doctor", "--json"], b"");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("doctor --json");
    let check = |name: &str| {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} check: {v}"))
    };
    let parts = check("microvm (qemu)");
    assert_eq!(parts["ok"], true, "{parts}");
    assert!(
        parts["detail"].as_str().unwrap().contains("guest kernel"),
        "{parts}"
    );
    let accel = check("microvm accelerator");
    assert_eq!(accel["ok"], false, "{accel}");
    assert!(
        accel["detail"].as_str().unwrap().starts_with("tcg"),
        "{accel}"
    );
}

#[test]
fn a_broker_killed_mid_task_takes_its_guest_with_it_and_the_next_sweeps() {
    let s = store(false);
    let run = s.dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let state = run.join("microvm");
    let args = [
        "exec",
        "--runtime",
        "microvm",
        "--accept",
        "kvm",
        "--image",
        &s.reference,
        "--",
        "/bin/sh",
        "-c",
        "echo up; sleep 600",
    ];
    let mut child = command(&s, &args)
        .env("CORDON_RUN_DIR", &run)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Positive control: QEMU runs under the state dir (a call's output
    // comes at its end, through the gate, so the process is the signal).
    let needle = state.display().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !processes_naming(&needle).iter().any(|p| p.contains("qemu"))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        processes_naming(&needle).iter().any(|p| p.contains("qemu")),
        "no QEMU seen"
    );
    std::thread::sleep(std::time::Duration::from_secs(2));
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !processes_naming(&needle).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let left = processes_naming(&needle);
    assert!(left.is_empty(), "outlived the broker: {left:?}");
    // Its directory is left (nobody removed it) until the next broker
    // sweeps it.
    let dirs = |p: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(p)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect()
    };
    assert_eq!(dirs(&state).len(), 1, "{:?}", dirs(&state));
    let o = command(&s, &["doctor"])
        .env("CORDON_RUN_DIR", &run)
        .output()
        .unwrap();
    assert!(
        text(&o.stdout).contains("removed a microVM sandbox left by a broker that is gone"),
        "{}",
        text(&o.stdout)
    );
    assert!(dirs(&state).is_empty(), "{:?}", dirs(&state));
}

/// Kills the child (a stand-in server) when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The loopback address the page is served on, in place of the example's
/// 127.0.0.80 (scripts/demo.sh's; the gVisor browse test's), so the test
/// never meets another stand-in on port 80.
const BROWSE_UPSTREAM: &str = "127.0.0.87";

/// The seed's `browse` as written, on a microVM
/// (`examples/browse-microvm.yaml`): an image holding Debian's Chromium
/// (`tests/images/build.sh chromium`), restored per task under TCG;
/// Chromium fetches the page through the proxy door (the only way out of a
/// guest with no network device) and returns its text, and the cookie the
/// page sets is not there for the next task.
#[test]
fn the_seeds_browse_runs_on_a_microvm_through_the_proxy_and_keeps_no_cookie() {
    assert!(
        Path::new("/usr/lib/chromium/chromium").exists(),
        "chromium is not installed (scripts/setup.sh)"
    );
    let s = store(false);
    let layout = s.dir.join("chromium");
    build_image("chromium", &layout);
    let reference = load_image(&s, &layout, "chromium");
    let example = std::fs::read_to_string(repo().join("examples/browse-microvm.yaml")).unwrap();
    assert!(
        example.contains("image: chromium@sha256:DIGEST")
            && example.contains("runtime: microvm")
            && example.contains("news.example: 127.0.0.80"),
        "{example}"
    );
    let m = s.dir.join("browse.yaml");
    std::fs::write(
        &m,
        example
            .replace("chromium@sha256:DIGEST", &reference)
            .replace("127.0.0.80", BROWSE_UPSTREAM),
    )
    .unwrap();
    let _web = KillOnDrop(
        Command::new("python3")
            .args(["-m", "http.server", "80", "--bind", BROWSE_UPSTREAM])
            .arg("--directory")
            .arg(repo().join("examples/data/web"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m http.server"),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::net::TcpStream::connect((BROWSE_UPSTREAM, 80)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the page's stand-in did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for _ in 0..2 {
        let mut c = command(&s, &["run", "browse", "--json", "-m", m.to_str().unwrap()]);
        c.env("CORDON_UPSTREAM_DNS", "127.0.0.1:9")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"http://news.example/\n")
            .unwrap();
        let o = child.wait_with_output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}{}", text(&o.stdout), text(&o.stderr)));
        assert_eq!(v["status"], "ok", "{v}");
        let out = v["output"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"));
        assert!(out.contains("Hello from the local upstream"), "{out}");
        // The page's script ran, and found no cookie of an earlier task.
        assert!(out.contains("cookies before: []"), "{out}");
        let egress = v["egress"].as_array().unwrap();
        assert!(
            egress.iter().any(|e| e["name"] == "news.example"
                && e["decision"] == "allowed"
                && e["door"] == "proxy"),
            "{v}"
        );
    }
}
