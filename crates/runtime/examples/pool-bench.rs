//! The warm pool's figures for `scripts/bench-gvisor.py` and
//! `scripts/bench-microvm.py`: how long after a task is handed over its
//! program runs (a pooled sandbox against a cold one), and the memory of
//! an idle pooled sandbox. Prints one JSON object. Run as root: `cargo run
//! --release -p cordon-runtime --example pool-bench -- [ROUNDS]` (gVisor),
//! or `... -- ROUNDS microvm ROOTFS` (a microVM of the unpacked image at
//! ROOTFS, which needs busybox; the microVM runtime's variables apply).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cordon_runtime::gvisor::{Gvisor, Options};
use cordon_runtime::pool::{Pool, Settings};
use cordon_runtime::{Context, Runtime, SandboxSpec};

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Milliseconds from `before` (ns since the epoch) to the time the tool
/// printed (`date +%s%N`, its first act).
fn started_after(before: u128, out: &[u8]) -> f64 {
    let t: u128 = String::from_utf8_lossy(out).trim().parse().unwrap_or(0);
    (t.saturating_sub(before)) as f64 / 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Proportional set size, in KiB, of every process whose command line
/// names a bundle of this process.
fn pss_kib() -> u64 {
    let tag = format!("cordon-{}-", std::process::id());
    let mut total = 0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let p = e.path();
        let Ok(c) = std::fs::read(p.join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&c).contains(&tag) {
            continue;
        }
        if let Ok(s) = std::fs::read_to_string(p.join("smaps_rollup")) {
            for l in s.lines() {
                if let Some(v) = l.strip_prefix("Pss:") {
                    total += v
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .unwrap_or(0);
                }
            }
        }
    }
    total
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    let args: Vec<String> = std::env::args().collect();
    let mut spec = SandboxSpec::new("bench", ["/bin/date", "+%s%N"]);
    spec.profile = cordon_policy::policy::Profile::P3;
    spec.limits = cordon_policy::resolve::default_limits(spec.profile).expect("P3 limits");
    let g: Arc<dyn Runtime> = if args.get(2).map(String::as_str) == Some("microvm") {
        let rootfs = args
            .get(3)
            .expect("usage: pool-bench ROUNDS microvm ROOTFS");
        spec.root = cordon_runtime::Root::Image {
            rootfs: rootfs.into(),
            digest: String::new(),
        };
        // busybox's date has no %N: the kernel's time in microseconds.
        spec.argv = vec![
            "/bin/busybox".into(),
            "sh".into(),
            "-c".into(),
            "/bin/busybox adjtimex | /bin/busybox awk '/tv_sec/{s=$2} /tv_usec/{u=$2} END{printf \"%d%06d000\\n\", s, u}'".into(),
        ];
        spec.limits.memory_bytes = 128 << 20;
        spec.limits.cpu_percent = Some(100);
        Arc::new(
            cordon_runtime::microvm::Microvm::new(Default::default(), Default::default())
                .expect("microvm"),
        )
    } else {
        Arc::new(Gvisor::new(Options::default(), Default::default()).expect("gvisor"))
    };
    let problems = g.check(&spec).problems;
    assert!(problems.is_empty(), "{problems:?}");
    let ctx = Context::discard("bench");

    // Cold: a new sandbox per task.
    let mut cold = Vec::new();
    let mut cold_total = Vec::new();
    for _ in 0..rounds {
        let t0 = Instant::now();
        let before = now_ns();
        let o = g.run(&spec, Vec::new(), &ctx).expect("cold run");
        cold_total.push(t0.elapsed().as_secs_f64() * 1e3);
        cold.push(started_after(before, &o.stdout));
    }

    // Pooled: one idle sandbox taken per task.
    let pool = Pool::new(
        g.clone(),
        spec.clone(),
        Settings {
            size: 1,
            refill: true,
        },
        None,
    )
    .expect("pool");
    let mut take = Vec::new();
    let mut pooled_total = Vec::new();
    let mut idle_pss = Vec::new();
    for _ in 0..rounds {
        assert!(
            pool.wait_idle(1, Duration::from_secs(60)),
            "{:?}",
            pool.stopped()
        );
        // Let it settle before measuring an idle sandbox's memory.
        std::thread::sleep(Duration::from_millis(500));
        idle_pss.push(pss_kib() as f64 / 1024.0);
        let t0 = Instant::now();
        let before = now_ns();
        let (o, pooled) = pool.run(Vec::new(), &ctx).expect("pooled run");
        assert!(pooled, "the pool was empty");
        pooled_total.push(t0.elapsed().as_secs_f64() * 1e3);
        take.push(started_after(before, &o.stdout));
    }
    println!(
        "{{\"rounds\": {rounds}, \"cold_start_ms\": {:.2}, \"cold_total_ms\": {:.2}, \"pool_take_to_start_ms\": {:.2}, \"pool_total_ms\": {:.2}, \"idle_pooled_pss_mib\": {:.1}}}",
        median(cold),
        median(cold_total),
        median(take),
        median(pooled_total),
        median(idle_pss)
    );
}
