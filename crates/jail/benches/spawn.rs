//! Spawn latency, throughput and leak check of the native jail, against
//! bare fork/exec and bubblewrap baselines measured in the same run.
//!
//! Run: `cargo bench -p cordon-jail --bench spawn` (as root for the cgroup
//! rows). Environment:
//! - `CORDON_BENCH_RUNS` (default 300): samples per latency row.
//! - `CORDON_BENCH_LEAK_CALLS` (default 10000; 0 skips): calls of the leak check.
//! - `CORDON_BIN`: a built `cordon` binary; adds `cordon exec -- /bin/true`.
//! - `CORDON_BIN_BASELINE`: an earlier build of `cordon`; adds its `exec`
//!   row to the same rounds (an A/B of two builds).
//!
//! Prints a markdown report (docs/benchmarks/jail.md has the last one).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cordon_jail::{Jail, JailSpec, Limits, Stdin};

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Row {
    name: String,
    samples: Vec<Duration>,
    note: String,
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Row {
    fn median(&self) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        pct(&s, 0.5)
    }
    fn p95(&self) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        pct(&s, 0.95)
    }
}

/// One latency row to measure.
struct Case<'a> {
    name: String,
    note: String,
    f: Box<dyn FnMut() + 'a>,
}

fn case<'a>(name: &str, note: &str, f: impl FnMut() + 'a) -> Case<'a> {
    Case {
        name: name.to_string(),
        note: note.to_string(),
        f: Box::new(f),
    }
}

/// Interleaved: each round takes one sample of every row, so load that
/// comes and goes (the machine is shared) hits all rows alike. With a
/// non-zero `idle`, a sleep before every sample (sparse calls) and one
/// warm-up call per row instead of five.
fn measure(mut cases: Vec<Case<'_>>, runs: usize, idle: Duration) -> Vec<Row> {
    let warm = if idle.is_zero() { 5 } else { 1 };
    for c in cases.iter_mut() {
        for _ in 0..warm {
            (c.f)();
        }
    }
    let mut samples: Vec<Vec<Duration>> = cases.iter().map(|_| Vec::with_capacity(runs)).collect();
    for round in 0..runs {
        for (c, s) in cases.iter_mut().zip(samples.iter_mut()) {
            if !idle.is_zero() {
                std::thread::sleep(idle);
            }
            let t = Instant::now();
            (c.f)();
            s.push(t.elapsed());
        }
        if idle.is_zero() && round % 50 == 49 {
            eprintln!("  round {}", round + 1);
        }
    }
    cases
        .into_iter()
        .zip(samples)
        .map(|(c, samples)| Row {
            name: c.name,
            samples,
            note: c.note,
        })
        .collect()
}

/// bwrap with the seed's flags, in a fresh v1 memory+pids cgroup, with the
/// same deny list as a seccomp filter: what a user would assemble by hand.
fn bwrap_cgroup_case<'a>(bw: &Path, mem: PathBuf, pids: PathBuf) -> Case<'a> {
    let bw = bw.to_path_buf();
    let bpf = cordon_jail::seccomp::reference_deny(false).expect("filter");
    let mut bytes = Vec::with_capacity(bpf.len() * 8);
    for i in &bpf {
        bytes.extend_from_slice(&i.code.to_ne_bytes());
        bytes.push(i.jt);
        bytes.push(i.jf);
        bytes.extend_from_slice(&i.k.to_ne_bytes());
    }
    let mut f = tempfile::NamedTempFile::new().expect("tmp");
    f.write_all(&bytes).expect("write bpf");
    let bpf_path = f.path().to_path_buf();
    let mut n = 0u64;
    let mut bw_args: Vec<String> = BWRAP_SEED.iter().map(|s| s.to_string()).collect();
    bw_args.extend([
        "--seccomp".into(),
        "3".into(),
        "--".into(),
        "/bin/true".into(),
    ]);
    let quoted = bw_args
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    case(
        "bwrap + fresh v1 memory+pids cgroup + --seccomp",
        "mkdir, limits, `sh` moves itself in and execs bwrap with the BPF on fd 3, rmdir with 50 µs backoff",
        move || {
            let _keep_bpf_file = f.path();
            n += 1;
            let name = format!("cordon-bench-{}-{n}", std::process::id());
            let m = mem.join(&name);
            let p = pids.join(&name);
            std::fs::create_dir(&m).expect("mkdir memory");
            std::fs::create_dir(&p).expect("mkdir pids");
            std::fs::write(m.join("memory.limit_in_bytes"), "536870912").expect("limit");
            std::fs::write(m.join("memory.memsw.limit_in_bytes"), "536870912").ok();
            std::fs::write(p.join("pids.max"), "32").expect("pids.max");
            let script = format!(
                "echo $$ > {m}/cgroup.procs && echo $$ > {p}/cgroup.procs && exec {bw} {quoted} 3<{bpf}",
                m = m.display(),
                p = p.display(),
                bw = bw.display(),
                bpf = bpf_path.display()
            );
            run_quiet(Command::new("/bin/sh").args(["-c", &script]));
            rmdir_backoff(&m);
            rmdir_backoff(&p);
        },
    )
}

fn true_spec() -> JailSpec {
    let mut s = JailSpec::new("true", ["/bin/true"]);
    s.limits = Limits {
        cpu_percent: None,
        ..Limits::default()
    };
    s
}

const BWRAP_SEED: &[&str] = &[
    "--unshare-all",
    "--die-with-parent",
    "--new-session",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--symlink",
    "usr/sbin",
    "/sbin",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
    "--clearenv",
    "--setenv",
    "PATH",
    "/usr/bin",
];

fn run_quiet(cmd: &mut Command) {
    let st = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    assert!(st.success(), "{cmd:?} failed: {st}");
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Own cgroup directory in a v1 hierarchy.
fn own_v1(controller: &str) -> Option<PathBuf> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cg.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, c, p) = (it.next()?, it.next()?, it.next()?);
        c.split(',').any(|x| x == controller).then(|| p.to_string())
    })?;
    let d = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(path.trim_start_matches('/'));
    d.is_dir().then_some(d)
}

fn rmdir_backoff(d: &Path) {
    let mut pause = Duration::from_micros(50);
    for _ in 0..200 {
        match std::fs::remove_dir(d) {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(10));
            }
            Err(e) => panic!("rmdir {}: {e}", d.display()),
        }
    }
}

fn count_dirs(d: &Path, prefix: &str) -> usize {
    std::fs::read_dir(d)
        .map(|r| {
            r.flatten()
                .filter(|e| {
                    e.path().is_dir() && e.file_name().to_string_lossy().starts_with(prefix)
                })
                .count()
        })
        .unwrap_or(0)
}

#[derive(Debug, PartialEq, Eq)]
struct Resources {
    fds: usize,
    mounts: usize,
    cgroups: usize,
    processes: usize,
    threads: usize,
}

fn resources(jail: &Jail) -> Resources {
    let me = std::process::id().to_string();
    let fds = std::fs::read_dir("/proc/self/fd")
        .map(|r| r.count())
        .unwrap_or(0);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|s| s.lines().count())
        .unwrap_or(0);
    let l = &jail.host().cgroup_layout;
    // Only this broker's slots (`<pid>-...`): other brokers share the
    // parent directories.
    let cgroups = [&l.memory, &l.pids, &l.cpu]
        .into_iter()
        .flatten()
        .map(|p| count_dirs(&p.base, &format!("{me}-")))
        .sum::<usize>();
    // Processes whose parent is this process (sandboxes not reaped).
    let mut processes = 0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(stat) = std::fs::read_to_string(e.path().join("stat"))
            && let Some(rest) = stat.rsplit_once(") ").map(|x| x.1)
            && rest.split(' ').nth(1) == Some(me.as_str())
        {
            processes += 1;
        }
    }
    let threads = std::fs::read_dir("/proc/self/task")
        .map(|r| r.count())
        .unwrap_or(0);
    Resources {
        fds,
        mounts,
        cgroups,
        processes,
        threads,
    }
}

fn throughput(jail: &Jail, conc: usize, total: usize) -> f64 {
    let per = total.div_ceil(conc);
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..conc {
            s.spawn(|| {
                let spec = true_spec();
                for _ in 0..per {
                    let o = jail.run(&spec, Stdin::Null).expect("run");
                    assert_eq!(o.exit_code, Some(0));
                }
            });
        }
    });
    (per * conc) as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    // `cargo bench` passes --bench; ignore arguments.
    let runs = env_num("CORDON_BENCH_RUNS", 300);
    let leak_calls = env_num("CORDON_BENCH_LEAK_CALLS", 10_000);
    let jail = Jail::new().expect("Jail::new");
    // The same jail without the pool of network namespaces: a new one per
    // call, for a same-run comparison.
    let jail_fresh_net = Jail::with_options(cordon_jail::JailOptions {
        pool_network_namespaces: false,
        ..Default::default()
    })
    .expect("Jail::with_options");
    let root = jail.host().root;
    let mut cases: Vec<Case<'_>> = Vec::new();
    let mut notes: Vec<String> = Vec::new();

    cases.push(case(
        "bare fork/exec /bin/true (std::process::Command)",
        "",
        || {
            run_quiet(&mut Command::new("/bin/true"));
        },
    ));
    let spec = true_spec();
    let jail_ref = &jail;
    cases.push(case("Jail::run /bin/true", "broker path", move || {
        let o = jail_ref.run(&spec, Stdin::Null).expect("run");
        assert_eq!(o.exit_code, Some(0));
    }));
    if jail.pools_network_namespaces() {
        let spec = true_spec();
        let fresh = &jail_fresh_net;
        cases.push(case(
            "Jail::run /bin/true, new network namespace per call",
            "broker path without the namespace pool",
            move || {
                let o = fresh.run(&spec, Stdin::Null).expect("run");
                assert_eq!(o.exit_code, Some(0));
            },
        ));
    }
    let cat = {
        let mut s = JailSpec::new("cat", ["/bin/cat"]);
        s.limits.cpu_percent = None;
        s
    };
    let kib = vec![b'a'; 1024];
    cases.push(case(
        "Jail::run cat, 1 KiB stdin",
        "broker path",
        move || {
            let o = jail_ref.run(&cat, Stdin::Bytes(kib.clone())).expect("run");
            assert_eq!(o.stdout.len(), 1024);
        },
    ));
    cases.push(case(
        "sh -c 'exec /bin/true'",
        "cost of the sh wrapper of the bwrap+cgroup+seccomp row",
        || {
            run_quiet(Command::new("/bin/sh").args(["-c", "exec /bin/true"]));
        },
    ));

    let bwrap = which("bwrap");
    let mut bwrap_full: Option<usize> = None;
    match &bwrap {
        None => notes.push(
            "bwrap not installed: bubblewrap rows skipped (apt-get install -y bubblewrap)".into(),
        ),
        Some(bw) => {
            let bw1 = bw.clone();
            cases.push(case("bwrap (seed flags) /bin/true", "", move || {
                run_quiet(
                    Command::new(&bw1)
                        .args(BWRAP_SEED)
                        .args(["--", "/bin/true"]),
                );
            }));
            let mem = own_v1("memory");
            let pids = own_v1("pids");
            match (root, mem, pids) {
                (true, Some(mem), Some(pids)) => {
                    cases.push(bwrap_cgroup_case(bw, mem, pids));
                    bwrap_full = Some(cases.len() - 1);
                }
                _ => notes.push("bwrap + cgroup + seccomp row skipped: needs root and v1 memory and pids hierarchies".into()),
            }
        }
    }
    if let Ok(bin) = std::env::var("CORDON_BIN") {
        cases.push(case(
            "`$CORDON_BIN exec -- /bin/true` (one-shot CLI)",
            "",
            move || {
                run_quiet(Command::new(&bin).args(["exec", "--", "/bin/true"]));
            },
        ));
    }
    if let Ok(bin) = std::env::var("CORDON_BIN_BASELINE") {
        cases.push(case(
            "`$CORDON_BIN_BASELINE exec -- /bin/true` (an earlier build)",
            "A/B in the same rounds",
            move || {
                run_quiet(Command::new(&bin).args(["exec", "--", "/bin/true"]));
            },
        ));
    }

    let pre = true_spec();
    let dirs = jail.host().system_dirs.clone();
    cases.push(case(
        "preflight of the /bin/true spec",
        "the host check of `cordon check`, `serve` and the gateway (program, loader, binds); a one-shot call runs it only when setup fails",
        move || {
            assert!(cordon_jail::preflight::preflight_on(&pre, &dirs).is_empty());
        },
    ));
    let rows = measure(cases, runs, Duration::ZERO);

    // Sparse calls: an idle pause before each sample, as between an agent's
    // calls. The interleaved rounds above keep the kernel's cgroup-migration
    // state warm (a v1 cgroup.procs write within about one RCU grace period
    // of the previous one does not wait); here every migration starts cold.
    // cordon's sandboxes move themselves thread by thread (`tasks`), which
    // does not wait; the bwrap + cgroup row's `sh` writes cgroup.procs.
    let sparse_idle = Duration::from_millis(env_num("CORDON_BENCH_SPARSE_IDLE_MS", 60) as u64);
    let sparse_runs = env_num("CORDON_BENCH_SPARSE_RUNS", 100);
    let sparse = {
        let mut cases: Vec<Case<'_>> = Vec::new();
        cases.push(case("bare fork/exec /bin/true", "", || {
            run_quiet(&mut Command::new("/bin/true"));
        }));
        let spec = true_spec();
        let jail_ref = &jail;
        cases.push(case("Jail::run /bin/true", "broker path", move || {
            let o = jail_ref.run(&spec, Stdin::Null).expect("run");
            assert_eq!(o.exit_code, Some(0));
        }));
        if let Some(bw) = &bwrap {
            cases.push(case("bwrap (seed flags) /bin/true", "", move || {
                run_quiet(Command::new(bw).args(BWRAP_SEED).args(["--", "/bin/true"]));
            }));
            if let (true, Some(mem), Some(pids)) = (root, own_v1("memory"), own_v1("pids")) {
                cases.push(bwrap_cgroup_case(bw, mem, pids));
            }
        }
        if let Ok(bin) = std::env::var("CORDON_BIN") {
            cases.push(case(
                "`$CORDON_BIN exec -- /bin/true` (one-shot CLI)",
                "",
                move || {
                    run_quiet(Command::new(&bin).args(["exec", "--", "/bin/true"]));
                },
            ));
        }
        if let Ok(bin) = std::env::var("CORDON_BIN_BASELINE") {
            cases.push(case(
                "`$CORDON_BIN_BASELINE exec -- /bin/true` (an earlier build)",
                "A/B in the same rounds",
                move || {
                    run_quiet(Command::new(&bin).args(["exec", "--", "/bin/true"]));
                },
            ));
        }
        measure(cases, sparse_runs, sparse_idle)
    };

    // Throughput.
    let mut tput = Vec::new();
    for conc in [1usize, 2, 8, 32] {
        let total = (runs * 2).max(conc * 10);
        tput.push((conc, throughput(&jail, conc, total)));
        eprintln!("  throughput at {conc}");
    }

    let fresh_tput = jail
        .pools_network_namespaces()
        .then(|| throughput(&jail_fresh_net, 8, (runs * 2).max(80)));

    // Same-run ceiling: bare fork/exec at concurrency 8.
    let bare_tput = {
        let total = (runs * 2).max(80);
        let per = total.div_ceil(8);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..per {
                        run_quiet(&mut Command::new("/bin/true"));
                    }
                });
            }
        });
        (per * 8) as f64 / t.elapsed().as_secs_f64()
    };

    // Same-run reference: bubblewrap at concurrency 8.
    let bwrap_tput = bwrap.as_ref().map(|bw| {
        let total = (runs * 2).max(80);
        let per = total.div_ceil(8);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..per {
                        run_quiet(Command::new(bw).args(BWRAP_SEED).args(["--", "/bin/true"]));
                    }
                });
            }
        });
        (per * 8) as f64 / t.elapsed().as_secs_f64()
    });
    eprintln!("  bwrap throughput");

    // Leak check.
    let leak = if leak_calls > 0 {
        let before = resources(&jail);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let spec = true_spec();
                    for _ in 0..leak_calls / 8 {
                        jail.run(&spec, Stdin::Null).expect("run");
                    }
                });
            }
        });
        let took = t.elapsed();
        let after = resources(&jail);
        Some((before, after, took))
    } else {
        None
    };

    // Report.
    let bare = rows[0].median();
    println!("## Latency ({runs} rounds, each taking one sample of every row in turn)\n");
    println!("| method | median ms | p95 ms | added over bare (median) ms | notes |");
    println!("|---|---:|---:|---:|---|");
    for r in &rows {
        let added = ms(r.median()) - ms(bare);
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {} |",
            r.name,
            ms(r.median()),
            ms(r.p95()),
            added,
            r.note
        );
    }
    println!();
    let jail_added = ms(rows[1].median()) - ms(bare);
    if let Some(i) = bwrap_full {
        let sh_row = rows
            .iter()
            .find(|r| r.name.starts_with("sh -c"))
            .expect("sh row");
        let sh_cost = ms(sh_row.median()) - ms(bare);
        let bw_added = ms(rows[i].median()) - ms(bare);
        let bw_added_no_sh = bw_added - sh_cost;
        println!(
            "Ratio of added cost, `Jail::run /bin/true` / `bwrap + cgroup + seccomp`: **{:.2}** \
             ({:.2} ms / {:.2} ms); with the sh wrapper's own cost ({:.2} ms) taken out of the bwrap row: **{:.2}**. Target: at most 0.25.\n",
            jail_added / bw_added,
            jail_added,
            bw_added,
            sh_cost,
            jail_added / bw_added_no_sh
        );
    }
    println!(
        "## Sparse calls ({} rounds, {} ms idle before each sample)\n",
        sparse_runs,
        sparse_idle.as_millis()
    );
    println!("| method | median ms | p95 ms | added over bare (median) ms | notes |");
    println!("|---|---:|---:|---:|---|");
    let sparse_bare = sparse[0].median();
    for r in &sparse {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {} |",
            r.name,
            ms(r.median()),
            ms(r.p95()),
            ms(r.median()) - ms(sparse_bare),
            r.note
        );
    }
    println!();
    let added = |prefix: &str| {
        sparse
            .iter()
            .find(|r| r.name.starts_with(prefix))
            .map(|r| ms(r.median()) - ms(sparse_bare))
    };
    if let (Some(j), Some(b)) = (added("Jail::run"), added("bwrap + fresh")) {
        println!(
            "Sparse ratio of added cost, `Jail::run /bin/true` / `bwrap + cgroup + seccomp`: **{:.2}** ({j:.2} ms / {b:.2} ms). The bwrap row pays a cold v1 migration (cgroup.procs); cordon's sandbox moves itself thread by thread (tasks), which does not wait.\n",
            j / b
        );
    }
    println!("## Throughput (`Jail::run /bin/true`)\n");
    println!("| concurrency | calls/s |");
    println!("|---:|---:|");
    for (c, r) in &tput {
        println!("| {c} | {r:.0} |");
    }
    println!();
    println!(
        "Same-run ceiling: bare fork/exec of `/bin/true` at concurrency 8: {bare_tput:.0} calls/s.\n"
    );
    if let Some(f) = fresh_tput {
        println!(
            "Same run, concurrency 8, a new network namespace per call instead of the pool: {f:.0} calls/s.\n"
        );
    }
    if let Some(b) = bwrap_tput {
        println!(
            "Same-run reference: `bwrap` (seed flags, no cgroup, no seccomp) `/bin/true` at concurrency 8: {b:.0} calls/s.\n"
        );
    }
    if let Some((before, after, took)) = leak {
        println!(
            "## Leak check: {leak_calls} calls at concurrency 8 ({:.1} s)\n",
            took.as_secs_f64()
        );
        println!("| resource | before | after |");
        println!("|---|---:|---:|");
        println!(
            "| open fds of the broker | {} | {} |",
            before.fds, after.fds
        );
        println!(
            "| mountinfo lines of the broker | {} | {} |",
            before.mounts, after.mounts
        );
        println!(
            "| cgroup directories of this broker under cordon/ | {} | {} |",
            before.cgroups, after.cgroups
        );
        println!(
            "| child processes of the broker | {} | {} |",
            before.processes, after.processes
        );
        println!(
            "| broker threads | {} | {} |",
            before.threads, after.threads
        );
        println!();
        println!(
            "Verdict: {}",
            if before.fds == after.fds
                && before.mounts == after.mounts
                && before.processes == after.processes
            {
                "no fd, mount or process leak; cgroup directories are the pooled slots (bounded by the peak concurrency)"
            } else {
                "LEAK: see the table"
            }
        );
        println!();
    }
    for n in notes {
        println!("Note: {n}\n");
    }
    println!(
        "Host: kernel {}, {} CPUs, broker uid {}, cgroups {}.",
        jail.host().kernel,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        jail.host().euid,
        if jail.uses_cgroups() {
            "in use"
        } else {
            "not in use (rlimit fallback)"
        }
    );
}
