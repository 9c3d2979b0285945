//! Stand-in "outside" hosts in a network namespace of their own, linked by a
//! veth pair to the namespace the probes run in. The network probes have
//! something real (and really remote from their namespace) to reach, and no
//! packet can leave this machine: the stand-ins' namespace has no other
//! interface and does not forward.
#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::process::Command;
use std::sync::mpsc;
use std::thread;

use cordon_probes::Targets;

/// Addresses the stand-ins answer on.
pub const OUTSIDE: &str = "1.1.1.1:443";
pub const METADATA: &str = "169.254.169.254:80";
pub const METADATA_V6: &str = "[fd00:ec2::254]:80";
pub const PRIVATE: &str = "10.0.0.1:80";
pub const DNS: &str = "1.1.1.1:53";
/// The probes' side of the link.
const PROBE_V4: &str = "198.51.100.2";
const PROBE_V6: &str = "fd00:1::2";

pub fn require_root() {
    assert!(
        cordon_testkit::is_root(),
        "this test creates network namespaces and must run as root"
    );
}

fn run(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("run {cmd}: {e}"));
    assert!(st.success(), "{cmd} {args:?} failed: {st}");
}

fn ip(args: &[&str]) {
    run("ip", args);
}

fn tcp_standin(addr: &str) {
    let l = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind stand-in {addr}: {e}"));
    thread::spawn(move || {
        for c in l.incoming().flatten() {
            let mut c = c;
            let _ = c.write_all(b"stand-in\n");
        }
    });
}

fn udp_standin(addr: &str) {
    let s = UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind stand-in {addr}: {e}"));
    thread::spawn(move || {
        let mut b = [0u8; 512];
        while let Ok((n, from)) = s.recv_from(&mut b) {
            // Echo the query back with the QR bit set: an answer.
            if n > 2 {
                b[2] |= 0x80;
            }
            let _ = s.send_to(&b[..n], from);
        }
    });
}

fn new_netns() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
    run(
        "sysctl",
        &["-q", "-w", "net.ipv6.conf.default.accept_dad=0"],
    );
    run("sysctl", &["-q", "-w", "net.ipv6.conf.all.accept_dad=0"]);
    ip(&["link", "set", "lo", "up"]);
}

/// The stand-ins' namespace: a thread that owns it, builds the veth pair,
/// moves one end to the probes' namespace (named by a thread id) and keeps
/// the stand-ins listening.
fn standin_host(probe_tid: mpsc::Receiver<i32>, ready: mpsc::Sender<()>) {
    new_netns();
    ip(&["link", "add", "cp0", "type", "veth", "peer", "name", "cp1"]);
    for a in ["1.1.1.1/32", "169.254.169.254/32", "10.0.0.1/32"] {
        ip(&["addr", "add", a, "dev", "cp0"]);
    }
    ip(&[
        "-6",
        "addr",
        "add",
        "fd00:ec2::254/128",
        "dev",
        "cp0",
        "nodad",
    ]);
    for a in [OUTSIDE, METADATA, PRIVATE] {
        tcp_standin(a);
    }
    udp_standin(DNS);
    let tid = probe_tid.recv().expect("probe namespace thread id");
    ip(&["link", "set", "cp1", "netns", &tid.to_string()]);
    ip(&["link", "set", "cp0", "up"]);
    ip(&["route", "add", &format!("{PROBE_V4}/32"), "dev", "cp0"]);
    ip(&[
        "-6",
        "route",
        "add",
        &format!("{PROBE_V6}/128"),
        "dev",
        "cp0",
    ]);
    // The IPv6 stand-in binds once its address is usable.
    tcp_standin(METADATA_V6);
    // Nothing but loopback and the link to the probes, and no forwarding.
    let links = Command::new("ip")
        .args(["-o", "link"])
        .output()
        .expect("ip link");
    let links = String::from_utf8_lossy(&links.stdout).to_string();
    assert_eq!(links.lines().count(), 2, "unexpected links: {links}");
    let fwd = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap_or_default();
    assert_eq!(fwd.trim(), "0", "the stand-in namespace must not forward");
    let _ = ready.send(());
}

/// Run `f` on a thread in a fresh network namespace whose only way out is a
/// veth link to the stand-ins' namespace (default routes point at it).
/// Processes `f` spawns inherit the namespace.
pub fn in_standin_netns<T: Send + 'static>(f: impl FnOnce(Targets) -> T + Send + 'static) -> T {
    require_root();
    let (tid_tx, tid_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let host = thread::spawn(move || standin_host(tid_rx, ready_tx));
    let probe = thread::spawn(move || {
        new_netns();
        tid_tx
            .send(nix::unistd::gettid().as_raw())
            .expect("stand-in thread alive");
        ready_rx.recv().expect("stand-in namespace ready");
        ip(&["link", "set", "cp1", "up"]);
        ip(&["addr", "add", &format!("{PROBE_V4}/32"), "dev", "cp1"]);
        ip(&[
            "-6",
            "addr",
            "add",
            &format!("{PROBE_V6}/128"),
            "dev",
            "cp1",
            "nodad",
        ]);
        ip(&["route", "add", "default", "dev", "cp1", "src", PROBE_V4]);
        ip(&[
            "-6", "route", "add", "default", "dev", "cp1", "src", PROBE_V6,
        ]);
        let t = Targets {
            outside: OUTSIDE.parse().unwrap(),
            metadata: METADATA.parse().unwrap(),
            metadata_v6: Some(METADATA_V6.parse::<SocketAddr>().unwrap()),
            private: PRIVATE.parse().unwrap(),
            dns: DNS.parse().unwrap(),
            host_loopback: None,
            home: Some("/root".into()),
            connect_timeout: std::time::Duration::from_millis(1500),
        };
        f(t)
    });
    let out = probe.join();
    let _ = host.join();
    out.expect("probe namespace thread panicked")
}

pub fn agent() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_cordon-probe-agent").into()
}

/// In the current (stand-in) network namespace, reject every TCP packet to
/// `ip` except to `port` (new connections only: replies from the stand-in
/// also go to `ip`), with ICMP admin-prohibited: an egress filter that
/// allows one host:port.
pub fn nft_allow_only(ip: &str, port: u16) {
    let nft = |args: &[&str]| {
        let st = Command::new("nft")
            .args(args)
            .status()
            .expect("nft is needed: apt-get install -y nftables");
        assert!(st.success(), "nft {args:?} failed: {st}");
    };
    nft(&["add", "table", "inet", "cordonprobe"]);
    nft(&[
        "add",
        "chain",
        "inet",
        "cordonprobe",
        "out",
        "{ type filter hook output priority 0; policy accept; }",
    ]);
    let port = port.to_string();
    nft(&[
        "add",
        "rule",
        "inet",
        "cordonprobe",
        "out",
        "ip",
        "daddr",
        ip,
        "tcp",
        "dport",
        "!=",
        &port,
        "ct",
        "state",
        "new",
        "reject",
        "with",
        "icmp",
        "type",
        "admin-prohibited",
    ]);
}

/// Every probe of `report` held (its control first), but `egress` skipped
/// for a profile granted none; a failure lists what did not.
pub fn assert_all_held(report: &cordon_probes::Report) {
    let human = report.to_human();
    assert!(report.control_ok(), "{human}");
    let not_held: Vec<_> = report
        .results
        .iter()
        .filter(|r| {
            !(r.verdict == cordon_probes::Verdict::Held
                || (r.probe == "egress" && r.verdict == cordon_probes::Verdict::Skipped))
        })
        .map(|r| format!("{} {}: {}", r.verdict.label(), r.probe, r.evidence))
        .collect();
    assert!(
        not_held.is_empty(),
        "not held:\n{}\n\n{human}",
        not_held.join("\n")
    );
}
