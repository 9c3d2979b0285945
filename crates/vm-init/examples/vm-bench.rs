//! Cold boot to result, snapshot, and restore to result, for
//! docs/microvm.md. Needs what `scripts/setup.sh` installs and the static
//! init (`scripts/build-vm-init.sh`).
//!
//!     cargo run -p cordon-vm-init --example vm-bench -- INIT [RUNS] [kvm]
//!
//! Prints one line per run and the medians. CPU is QEMU's user+system time
//! (from this process's reaped children), which a loaded host inflates far
//! less than wall time.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordon_vm_init::image::{self, FsKind, find_tool};
use cordon_vm_init::initramfs;
use cordon_vm_init::protocol::{Limits, Task};
use cordon_vm_init::qemu::{self, Accel, Outcome, Vm, VmConfig};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// User+system CPU of reaped children, from `/proc/self/stat` (USER_HZ 100).
fn children_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // Fields after the command: state is [0], cutime is stat field 16 -> [13].
    let ticks = f.get(13).copied().unwrap_or(0) + f.get(14).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let init = PathBuf::from(args.get(1).ok_or("usage: vm-bench INIT [RUNS] [kvm]")?);
    let runs: usize = args.get(2).map(|r| r.parse()).transpose()?.unwrap_or(5);
    let accel = if args.get(3).map(String::as_str) == Some("kvm") {
        Accel::Kvm
    } else {
        Accel::Tcg
    };
    let kernel = std::fs::read_dir("/boot")?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-") && n.ends_with("-cloud-amd64"))
        })
        .max()
        .ok_or("no /boot/vmlinuz-*-cloud-amd64: run scripts/setup.sh")?;
    let release = initramfs::kernel_release(&kernel)?;
    let dir = tempfile::tempdir()?;
    let initrd = dir.path().join("initramfs.cpio");
    initramfs::build(
        &init,
        Some(Path::new(&format!("/lib/modules/{release}"))),
        &initrd,
    )?;
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin"))?;
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox"))?;
    std::os::unix::fs::symlink("busybox", rootfs.join("bin/true"))?;
    let t = Instant::now();
    let img = image::build(&rootfs, &dir.path().join("images"), FsKind::Erofs)?;
    let built = t.elapsed();
    let t = Instant::now();
    img.verify()?;
    println!(
        "image: {} bytes, built in {}, verified in {}",
        std::fs::metadata(&img.path)?.len(),
        ms(built),
        ms(t.elapsed())
    );
    let qemu_bin = find_tool("qemu-system-x86_64").ok_or("no QEMU: run scripts/setup.sh")?;
    let cfg = VmConfig {
        sandbox: qemu::qemu_has_sandbox(&qemu_bin),
        qemu: qemu_bin,
        kernel,
        initramfs: initrd,
        image: img,
        memory_mib: 256,
        cpus: 1,
        accel,
        tsc_khz: qemu::host_tsc_khz(),
        extra_append: Vec::new(),
        boot_timeout: Duration::from_secs(120),
        image_verified: false,
        carry: None,
    };
    let task = Task {
        argv: vec!["/bin/true".into()],
        env: Vec::new(),
        cwd: "/".into(),
        uid: 1000,
        gid: 1000,
        limits: Limits::default(),
        entropy: String::new(),
        time_ns: 0,
        net: Vec::new(),
        seccomp: Vec::new(),
        trust: None,
        doors: None,
    };
    let run_dir = dir.path().join("run");
    let (mut cold_ready, mut cold_result, mut cold_cpu) = (vec![], vec![], vec![]);
    for i in 0..runs {
        let cpu0 = children_cpu();
        let vm = Vm::boot(&cfg, &run_dir)?;
        let ready = vm.ready_after;
        let r = vm.run(&task, Vec::new(), Duration::from_secs(60), 1 << 16)?;
        if r.outcome != Outcome::Exited(0) {
            return Err(format!("cold run {i}: {:?}", r.outcome).into());
        }
        let cpu = children_cpu().saturating_sub(cpu0);
        println!(
            "cold {i}: ready {}, result {}, QEMU CPU {}",
            ms(ready),
            ms(r.since_start),
            ms(cpu)
        );
        cold_ready.push(ready);
        cold_result.push(r.since_start);
        cold_cpu.push(cpu);
    }
    let vm = Vm::boot_template(&cfg, &run_dir, &dir.path().join("template.ram"), None)?;
    let t = Instant::now();
    let snap = vm.snapshot(&dir.path().join("template.snap"))?;
    let snap_time = t.elapsed();
    let (md, ram) = (
        std::fs::metadata(&snap.state)?,
        std::fs::metadata(&snap.ram)?,
    );
    println!(
        "snapshot: {}, device state {} bytes, RAM file {} bytes apparent, {} bytes allocated",
        ms(snap_time),
        md.len(),
        ram.len(),
        std::os::unix::fs::MetadataExt::blocks(&ram) * 512
    );
    let (mut rs_running, mut rs_result, mut rs_cpu) = (vec![], vec![], vec![]);
    for i in 0..runs {
        let cpu0 = children_cpu();
        let vm = Vm::restore(&cfg, &snap, &run_dir)?;
        let running = vm.ready_after;
        let r = vm.run(&task, Vec::new(), Duration::from_secs(60), 1 << 16)?;
        if r.outcome != Outcome::Exited(0) {
            return Err(format!("restore run {i}: {:?}", r.outcome).into());
        }
        let cpu = children_cpu().saturating_sub(cpu0);
        println!(
            "restore {i}: running {}, result {}, QEMU CPU {}",
            ms(running),
            ms(r.since_start),
            ms(cpu)
        );
        rs_running.push(running);
        rs_result.push(r.since_start);
        rs_cpu.push(cpu);
    }
    let (c, r) = (median(cold_result), median(rs_result));
    println!(
        "median of {runs}: cold ready {}, cold result {} (CPU {}); restore running {}, restore result {} (CPU {}); restore/cold {:.3}",
        ms(median(cold_ready)),
        ms(c),
        ms(median(cold_cpu)),
        ms(median(rs_running)),
        ms(r),
        ms(median(rs_cpu)),
        r.as_secs_f64() / c.as_secs_f64()
    );
    Ok(())
}
