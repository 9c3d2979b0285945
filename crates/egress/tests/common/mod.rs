//! Test rig: a thread in a fresh network namespace (the sandbox as the jail will build it),
//! a loopback HTTP upstream and a loopback DNS upstream in the host namespace.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use cordon_egress::{DoorPlan, Doors, EgressEvent, LocalAddresses};
use hickory_resolver::proto::op::{Message, MessageType, ResponseCode};
use hickory_resolver::proto::rr::rdata::{A, AAAA};
use hickory_resolver::proto::rr::{RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use cordon_testkit::skip;
#[allow(unused_imports)] // not every test binary skips
pub use skip::{skip_or_fail, this_test};

type Job = Box<dyn FnOnce() + Send>;

/// A thread that lives in its own network namespace, with `lo` up and 198.18.0.0/15 on it.
/// Everything it runs (sockets it creates, processes it forks) is inside that namespace.
pub struct Netns {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Netns {
    /// `Err(reason)` when this machine cannot do it (not root, no namespaces).
    pub fn new(local_cidrs: &[String]) -> Result<Netns, String> {
        if !cordon_testkit::is_root() {
            return Err("not root: cannot create a network namespace".into());
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let cidrs = local_cidrs.to_vec();
        let thread = std::thread::spawn(move || {
            let setup = (|| -> Result<(), String> {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("unshare(CLONE_NEWNET): {e}"))?;
                run_ok(&["ip", "link", "set", "lo", "up"])?;
                for c in &cidrs {
                    run_ok(&["ip", "addr", "add", c, "dev", "lo"])?;
                }
                Ok(())
            })();
            let ok = setup.is_ok();
            let _ = ready_tx.send(setup);
            if !ok {
                return;
            }
            while let Ok(job) = rx.recv() {
                job();
            }
        });
        ready_rx
            .recv()
            .map_err(|_| "netns thread died".to_string())??;
        Ok(Netns {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Run `f` on the namespace thread and return its result.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (rtx, rrx) = mpsc::channel();
        let job: Job = Box::new(move || {
            let _ = rtx.send(f());
        });
        self.tx
            .as_ref()
            .expect("netns sender")
            .send(job)
            .expect("netns thread alive");
        rrx.recv().expect("netns job result")
    }

    /// Create the door sockets of `plan` inside the namespace, and an rtnetlink socket there
    /// with which the DNS door makes the addresses it answers local (as the jail does).
    pub fn doors(&self, plan: &DoorPlan) -> Doors {
        let mut d = self.doors_without_local(plan);
        let nl = self.run(|| cordon_sys::net::route_socket().expect("rtnetlink socket"));
        d.local = Some(Arc::new(NsRoute(Mutex::new((nl, 0)))));
        d
    }

    /// The door sockets only: the DNS door then answers from the door range.
    pub fn doors_without_local(&self, plan: &DoorPlan) -> Doors {
        let tcp = plan.tcp.clone();
        let udp = plan.udp.clone();
        self.run(move || Doors {
            tcp: tcp
                .iter()
                .map(|a| std::net::TcpListener::bind(a).expect("bind tcp door"))
                .collect(),
            udp: udp
                .iter()
                .map(|a| std::net::UdpSocket::bind(a).expect("bind udp door"))
                .collect(),
            local: None,
        })
    }

    /// Run a program inside the namespace with a private mount namespace where
    /// /etc/resolv.conf says `nameserver 127.0.0.1` (the DNS door), and exactly `env` as the
    /// proxy-related environment (every other proxy variable removed).
    pub fn exec(&self, env: &[(String, String)], argv: &[&str]) -> Output {
        let resolv = resolv_conf();
        let env = env.to_vec();
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        self.run(move || {
            let mut c = Command::new("unshare");
            c.arg("--mount")
                .arg("sh")
                .arg("-c")
                .arg("mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"")
                .arg(&resolv)
                .args(&argv);
            for k in PROXY_VARS {
                c.env_remove(k);
            }
            for (k, v) in &env {
                c.env(k, v);
            }
            c.output().expect("spawn unshare")
        })
    }
}

/// An rtnetlink socket of a test namespace.
#[derive(Debug)]
pub struct NsRoute(Mutex<(std::os::fd::OwnedFd, u32)>);

impl LocalAddresses for NsRoute {
    fn add(&self, ip: std::net::Ipv4Addr) -> Result<(), String> {
        let mut g = self.0.lock().unwrap();
        g.1 += 1;
        let seq = g.1;
        cordon_sys::net::add_local_address(std::os::fd::AsFd::as_fd(&g.0), ip.into(), 32, seq)
            .map_err(|e| format!("add {ip}/32 to lo: {e}"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub const PROXY_VARS: [&str; 8] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
];

fn run_ok(argv: &[&str]) -> Result<(), String> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .map_err(|e| format!("{argv:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{argv:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn resolv_conf() -> PathBuf {
    let p = std::env::temp_dir().join(format!("cordon-egress-resolv-{}.conf", std::process::id()));
    if !p.exists() {
        // Tests run in parallel: each writes its own temporary name, and
        // the rename (atomic) lets the last one win with the same bytes.
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = p.with_extension(format!("tmp{n}"));
        std::fs::write(&tmp, "nameserver 127.0.0.1\noptions timeout:2 attempts:1\n")
            .expect("write resolv.conf");
        std::fs::rename(&tmp, &p).expect("rename resolv.conf");
    }
    p
}

/// A loopback HTTP/1.1 upstream in the host namespace. Answers every request with
/// `upstream ok: <request line>` (or `n` bytes for `/bytes/<n>`) and records request heads.
pub struct Upstream {
    pub addr: SocketAddr,
    pub heads: Arc<Mutex<Vec<String>>>,
}

impl Upstream {
    pub async fn start(addr: &str) -> Upstream {
        let l = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = l.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let h = heads.clone();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = l.accept().await else {
                    continue;
                };
                let h = h.clone();
                tokio::spawn(async move {
                    let _ = serve_http(s, h).await;
                });
            }
        });
        Upstream { addr, heads }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

async fn serve_http(
    mut s: tokio::net::TcpStream,
    heads: Arc<Mutex<Vec<String>>>,
) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        // Read one request head.
        let end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        buf.drain(..end);
        let line = head.lines().next().unwrap_or("").to_string();
        let lower = head.to_ascii_lowercase();
        // Discard a request body with Content-Length.
        if let Some(cl) = lower
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
        {
            while buf.len() < cl {
                let n = s.read(&mut chunk).await?;
                if n == 0 {
                    return Ok(());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            buf.drain(..cl);
        }
        heads.lock().unwrap().push(head.clone());
        let close = lower.contains("connection: close");
        let path = line.split_whitespace().nth(1).unwrap_or("/");
        if let Some(n) = path
            .strip_prefix("/bytes/")
            .and_then(|n| n.parse::<u64>().ok())
        {
            let hdr = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nContent-Type: application/octet-stream\r\n\r\n"
            );
            s.write_all(hdr.as_bytes()).await?;
            let block = vec![b'x'; 256 * 1024];
            let mut left = n;
            while left > 0 {
                let k = left.min(block.len() as u64) as usize;
                s.write_all(&block[..k]).await?;
                left -= k as u64;
            }
        } else {
            let body = format!("upstream ok: {line}\n");
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\nConnection: keep-alive\r\n\r\n{body}",
                body.len()
            );
            s.write_all(resp.as_bytes()).await?;
        }
        if close {
            return Ok(());
        }
    }
}

/// A loopback DNS server in the host namespace standing in for the broker's upstream
/// resolver. Answers from a fixed table and counts every query by name.
pub struct DnsUpstream {
    pub addr: SocketAddr,
    pub queries: Arc<Mutex<HashMap<String, usize>>>,
}

impl DnsUpstream {
    pub async fn start(table: Vec<(&str, IpAddr)>) -> DnsUpstream {
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        let table: Vec<(String, IpAddr)> =
            table.into_iter().map(|(n, a)| (n.to_string(), a)).collect();
        let queries = Arc::new(Mutex::new(HashMap::new()));
        let q = queries.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                    continue;
                };
                let Ok(req) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let Some(query) = req.queries.first().cloned() else {
                    continue;
                };
                let name = query
                    .name()
                    .to_ascii()
                    .trim_end_matches('.')
                    .to_ascii_lowercase();
                *q.lock().unwrap().entry(name.clone()).or_insert(0) += 1;
                let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
                resp.metadata.message_type = MessageType::Response;
                resp.metadata.recursion_desired = req.metadata.recursion_desired;
                resp.metadata.recursion_available = true;
                resp.add_query(query.clone());
                let hits: Vec<IpAddr> = table
                    .iter()
                    .filter(|(n, _)| *n == name)
                    .map(|(_, a)| *a)
                    .collect();
                if hits.is_empty() {
                    resp.metadata.response_code = ResponseCode::NXDomain;
                } else {
                    for a in hits {
                        match (a, query.query_type()) {
                            (IpAddr::V4(v4), RecordType::A) => {
                                resp.add_answer(Record::from_rdata(
                                    query.name().clone(),
                                    5,
                                    RData::A(A(v4)),
                                ));
                            }
                            (IpAddr::V6(v6), RecordType::AAAA) => {
                                resp.add_answer(Record::from_rdata(
                                    query.name().clone(),
                                    5,
                                    RData::AAAA(AAAA(v6)),
                                ));
                            }
                            _ => {}
                        }
                    }
                }
                if let Ok(bytes) = resp.to_vec() {
                    let _ = sock.send_to(&bytes, peer).await;
                }
            }
        });
        DnsUpstream { addr, queries }
    }

    pub fn count(&self, name: &str) -> usize {
        self.queries.lock().unwrap().get(name).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.queries.lock().unwrap().values().sum()
    }
}

/// Receive events until `want` of them match `pred`, or panic after a generous wait.
/// Returns every event received meanwhile (matching or not).
pub async fn wait_events(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<EgressEvent>,
    want: usize,
    pred: impl Fn(&EgressEvent) -> bool,
) -> Vec<EgressEvent> {
    let mut got = Vec::new();
    let mut matched = 0;
    while matched < want {
        match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
            Ok(Some(e)) => {
                if pred(&e) {
                    matched += 1;
                }
                got.push(e);
            }
            Ok(None) => panic!("event channel closed; got {got:#?}"),
            Err(_) => panic!("waited for {want} events, {matched} matched; got {got:#?}"),
        }
    }
    got
}

/// Everything already queued.
pub fn drain(rx: &mut tokio::sync::mpsc::UnboundedReceiver<EgressEvent>) -> Vec<EgressEvent> {
    let mut v = Vec::new();
    while let Ok(e) = rx.try_recv() {
        v.push(e);
    }
    v
}

pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}
