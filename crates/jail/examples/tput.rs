//! Quick throughput probe: `tput [calls] [concurrency] [nocg]`.
use cordon_jail::*;
use std::time::Instant;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let calls: usize = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(200);
    let conc: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let nocg = a.iter().any(|x| x == "nocg");
    let jail = Jail::with_options(JailOptions {
        cgroups: !nocg,
        ..Default::default()
    })
    .unwrap();
    let mut spec = JailSpec::new("true", ["/bin/true"]);
    spec.limits.cpu_percent = None;
    if a.iter().any(|x| x == "noll") {
        spec.landlock = false;
    }
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..conc {
            s.spawn(|| {
                for _ in 0..calls / conc {
                    jail.run(&spec, Stdin::Null).unwrap();
                }
            });
        }
    });
    let e = t.elapsed();
    println!(
        "{} calls/s, {:.2} ms/call (cgroups {})",
        calls as f64 / e.as_secs_f64(),
        e.as_secs_f64() * 1000.0 / calls as f64,
        jail.uses_cgroups()
    );
}
