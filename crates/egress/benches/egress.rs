//! Egress door overhead: a 100 MB download and 1,000 small requests (one connection each)
//! through the proxy door (absolute-form and CONNECT) and the transparent door, against a
//! direct connection to the same loopback upstream, all in one run: several rounds, the paths
//! interleaved within each, so each round's door figures are compared with that round's
//! direct run (a loaded machine moves all of them together).
//!
//! The doors run as in production: their sockets live in a fresh network namespace (a thread
//! that unshared CLONE_NEWNET, with 198.18.0.0/15 on lo) and the client runs on that thread;
//! the broker serves them from tokio workers in the host namespace. The direct baseline runs
//! from a host-namespace thread. Needs root; prints SKIP otherwise.
//!
//! `cargo bench -p cordon-egress` (env EGRESS_BENCH_MB, EGRESS_BENCH_SMALL and
//! EGRESS_BENCH_ROUNDS change sizes).

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Netns, Upstream};
use cordon_egress::{DoorContext, EgressPolicy, EventSink, plan, serve};
use hickory_resolver::proto::op::{Message, Query};
use hickory_resolver::proto::rr::{Name, RData, RecordType};

const NAME: &str = "api.bench.test";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Direct,
    Proxy,
    Connect,
    Transparent,
}

/// One HTTP/1.1 GET with `Connection: close`; returns the bytes of the response.
fn get(mode: Mode, to: SocketAddr, port: u16, path: &str) -> u64 {
    let mut s = TcpStream::connect(to).expect("connect");
    s.set_nodelay(true).ok();
    let host = format!("{NAME}:{port}");
    match mode {
        Mode::Proxy => {
            write!(
                s,
                "GET http://{host}{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            )
            .expect("write");
        }
        Mode::Connect => {
            write!(s, "CONNECT {host} HTTP/1.1\r\nHost: {host}\r\n\r\n").expect("write");
            // The door sends nothing after its 200 until the request goes out, so reading
            // in chunks cannot swallow response bytes.
            let mut head = Vec::new();
            let mut b = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut b).expect("CONNECT response");
                assert!(n > 0, "CONNECT: connection closed");
                head.extend_from_slice(&b[..n]);
            }
            assert!(head.starts_with(b"HTTP/1.1 200"), "CONNECT refused");
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            )
            .expect("write");
        }
        Mode::Direct | Mode::Transparent => {
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            )
            .expect("write");
        }
    }
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    let mut first = true;
    loop {
        let n = s.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        if first {
            assert!(buf.starts_with(b"HTTP/1.1 200"), "request failed");
            first = false;
        }
        total += n as u64;
    }
    total
}

struct Result {
    mode: Mode,
    /// CPU seconds of the whole process per GiB downloaded.
    cpu_per_gib: f64,
    cpu_ratio: f64,
    mb_per_s: f64,
    small_us: f64,
    rate_ratio: f64,
    rate_range: (f64, f64),
    lat_ratio: f64,
    added_us: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// One download of `mb` MiB: MiB/s.
fn download(mode: Mode, to: SocketAddr, port: u16, mb: u64) -> f64 {
    let bytes = mb * 1024 * 1024;
    let path = format!("/bytes/{bytes}");
    let t = Instant::now();
    let got = get(mode, to, port, &path);
    assert!(got >= bytes, "short download: {got}");
    bytes as f64 / (1024.0 * 1024.0) / t.elapsed().as_secs_f64()
}

/// `small` small requests: microseconds per request.
fn smalls(mode: Mode, to: SocketAddr, port: u16, small: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..small {
        get(mode, to, port, "/small");
    }
    t.elapsed().as_secs_f64() * 1e6 / small as f64
}

/// User and system CPU time of this process so far, in seconds.
fn cpu_seconds() -> f64 {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    t(u.user_time()) + t(u.system_time())
}

fn warm_up(mode: Mode, to: SocketAddr, port: u16) {
    for _ in 0..20 {
        get(mode, to, port, "/small");
    }
}

fn door_address(ns: &Netns) -> IpAddr {
    ns.run(|| {
        let mut q = Message::query();
        q.add_query(Query::query(
            Name::from_ascii(format!("{NAME}.")).expect("name"),
            RecordType::A,
        ));
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        s.send_to(&q.to_vec().expect("encode"), "127.0.0.1:53")
            .expect("send");
        let mut buf = vec![0u8; 2048];
        let n = s.recv(&mut buf).expect("dns door answer");
        let m = Message::from_vec(&buf[..n]).expect("decode");
        m.answers
            .iter()
            .find_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                _ => None,
            })
            .expect("an A answer")
    })
}

fn main() {
    let mb: u64 = std::env::var("EGRESS_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let small: usize = std::env::var("EGRESS_BENCH_SMALL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let up = rt.block_on(Upstream::start("127.0.0.1:0"));
    let port = up.port();
    let mut policy = EgressPolicy::allowlist("bench", [format!("{NAME}:{port}")]).expect("policy");
    policy
        .resolve
        .insert(NAME.into(), IpAddr::from([127, 0, 0, 1]));
    policy
        .allow_cidrs
        .push("127.0.0.1/32".parse().expect("cidr"));
    policy.upstream_dns = Some("127.0.0.1:9".parse().expect("addr"));
    policy.max_connections = 1024;
    let plan = plan(&policy);
    let cidrs: Vec<String> = plan.local_cidrs.iter().map(|c| c.to_string()).collect();
    let ns = match Netns::new(&cidrs) {
        Ok(ns) => ns,
        Err(why) => {
            eprintln!("SKIP: {why}");
            return;
        }
    };
    let doors = ns.doors(&plan);
    let (sink, mut rx) = EventSink::channel();
    let ctx = DoorContext {
        tool: "bench".into(),
        session: "bench".into(),
    };
    let handle = rt
        .block_on(serve(Arc::new(policy), ctx, doors, sink))
        .expect("serve");
    // Keep the event channel drained, as the audit log would.
    rt.spawn(async move { while rx.recv().await.is_some() {} });

    let proxy = plan.proxy.expect("proxy door");
    let door = SocketAddr::new(door_address(&ns), port);
    let direct = up.addr;
    let rounds: usize = std::env::var("EGRESS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    println!(
        "egress bench: {rounds} rounds, each a {mb} MiB download and {small} small requests per path, paths interleaved; medians, and the median of each round's ratio to that round's direct run"
    );
    const MODES: [Mode; 4] = [Mode::Direct, Mode::Proxy, Mode::Connect, Mode::Transparent];
    // Run `f(mode, to)` where the mode's client lives: the direct baseline on a host-namespace
    // thread (it never goes through a door), the others in the sandbox's namespace.
    let on = |mode: Mode, f: fn(Mode, SocketAddr, u16, u64) -> f64, arg: u64| -> f64 {
        match mode {
            Mode::Direct => std::thread::spawn(move || f(mode, direct, port, arg))
                .join()
                .expect("direct run"),
            Mode::Proxy | Mode::Connect => ns.run(move || f(mode, proxy, port, arg)),
            Mode::Transparent => ns.run(move || f(mode, door, port, arg)),
        }
    };
    for mode in MODES {
        on(
            mode,
            |m, to, p, _| {
                warm_up(m, to, p);
                0.0
            },
            0,
        );
    }
    let mut rates = vec![Vec::new(); MODES.len()];
    let mut cpus = vec![Vec::new(); MODES.len()];
    let mut lats = vec![Vec::new(); MODES.len()];
    for _ in 0..rounds {
        for (i, mode) in MODES.iter().enumerate() {
            let c0 = cpu_seconds();
            rates[i].push(on(*mode, download, mb));
            // The whole process: client, upstream and (for the doors) the broker's workers.
            cpus[i].push((cpu_seconds() - c0) * 1024.0 / mb as f64);
        }
        for (i, mode) in MODES.iter().enumerate() {
            lats[i].push(on(
                *mode,
                |m, to, p, n| smalls(m, to, p, n as usize),
                small as u64,
            ));
        }
    }
    let mut results = Vec::new();
    for (i, mode) in MODES.iter().enumerate() {
        let rate_ratio: Vec<f64> = rates[i].iter().zip(&rates[0]).map(|(r, d)| r / d).collect();
        let lat_ratio: Vec<f64> = lats[i].iter().zip(&lats[0]).map(|(l, d)| l / d).collect();
        let added: Vec<f64> = lats[i].iter().zip(&lats[0]).map(|(l, d)| l - d).collect();
        let r = Result {
            cpu_per_gib: median(cpus[i].clone()),
            cpu_ratio: median(cpus[i].iter().zip(&cpus[0]).map(|(c, d)| c / d).collect()),
            mode: *mode,
            mb_per_s: median(rates[i].clone()),
            small_us: median(lats[i].clone()),
            rate_ratio: median(rate_ratio.clone()),
            rate_range: (
                rate_ratio.iter().cloned().fold(f64::INFINITY, f64::min),
                rate_ratio.iter().cloned().fold(0.0, f64::max),
            ),
            lat_ratio: median(lat_ratio),
            added_us: median(added),
        };
        println!(
            "{:?}: {:.0} MiB/s, {:.0} us/request",
            r.mode, r.mb_per_s, r.small_us
        );
        results.push(r);
    }
    println!();
    println!(
        "| path | download MiB/s | throughput vs direct (min-max over rounds) | CPU s per GiB (vs direct) | small request (us) | latency vs direct | added per request (us) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {:?} | {:.0} | {:.2}x ({:.2}-{:.2}) | {:.2} ({:.2}x) | {:.0} | {:.2}x | {:+.0} |",
            r.mode,
            r.mb_per_s,
            r.rate_ratio,
            r.rate_range.0,
            r.rate_range.1,
            r.cpu_per_gib,
            r.cpu_ratio,
            r.small_us,
            r.lat_ratio,
            r.added_us
        );
    }
    rt.block_on(handle.shutdown());
}
