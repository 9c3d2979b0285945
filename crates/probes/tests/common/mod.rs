//! A private network namespace with stand-in "outside" hosts, so the
//! network probes have something real to reach and no packet can leave
//! this machine: the namespace has only a loopback device, carrying the
//! stand-in addresses.
#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::process::Command;
use std::thread;

use cordon_probes::Targets;

/// Addresses the stand-ins answer on.
pub const OUTSIDE: &str = "1.1.1.1:443";
pub const METADATA: &str = "169.254.169.254:80";
pub const METADATA_V6: &str = "[fd00:ec2::254]:80";
pub const PRIVATE: &str = "10.0.0.1:80";
pub const DNS: &str = "1.1.1.1:53";

pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test creates a network namespace and must run as root"
    );
}

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("run ip(8)");
    assert!(st.success(), "ip {args:?} failed: {st}");
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

/// Run `f` on a thread that lives in a fresh network namespace holding the
/// stand-ins. Processes `f` spawns inherit that namespace.
pub fn in_standin_netns<T: Send + 'static>(f: impl FnOnce(Targets) -> T + Send + 'static) -> T {
    require_root();
    thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
        ip(&["link", "set", "lo", "up"]);
        ip(&["addr", "add", "1.1.1.1/32", "dev", "lo"]);
        ip(&["addr", "add", "169.254.169.254/32", "dev", "lo"]);
        ip(&["addr", "add", "10.0.0.1/32", "dev", "lo"]);
        ip(&[
            "-6",
            "addr",
            "add",
            "fd00:ec2::254/128",
            "dev",
            "lo",
            "nodad",
        ]);
        // Nothing but loopback: no packet can leave.
        let links = Command::new("ip")
            .args(["-o", "link"])
            .output()
            .expect("ip link");
        let links = String::from_utf8_lossy(&links.stdout).to_string();
        assert_eq!(links.lines().count(), 1, "unexpected links: {links}");
        for a in [OUTSIDE, METADATA, METADATA_V6, PRIVATE] {
            tcp_standin(a);
        }
        udp_standin(DNS);
        let t = Targets {
            outside: OUTSIDE.parse().unwrap(),
            metadata: METADATA.parse().unwrap(),
            metadata_v6: Some(METADATA_V6.parse::<SocketAddr>().unwrap()),
            private: PRIVATE.parse().unwrap(),
            dns: DNS.parse().unwrap(),
            host_loopback: None,
            home: Some("/root".into()),
            connect_timeout: std::time::Duration::from_millis(500),
        };
        f(t)
    })
    .join()
    .expect("netns thread panicked")
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
