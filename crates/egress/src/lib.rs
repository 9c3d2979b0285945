//! cordon-egress: the network doors of a sandbox.
//!
//! A tool with egress runs in an empty network namespace. The jail brings `lo` up there,
//! assigns the reserved range 198.18.0.0/15 to it, creates the listening sockets that [`plan`]
//! asks for and hands over an rtnetlink socket of the namespace ([`Doors::local`]); this crate
//! serves them from the broker's side:
//!
//! - the **proxy door** (`127.0.0.1:3128`): HTTP/1.1 CONNECT and absolute-form requests;
//! - the **DNS door** (`127.0.0.1:53`, UDP): answers A queries for allowlisted names with the
//!   vetted public IPv4 addresses the broker resolved itself (or the `resolve:` pin), after
//!   adding each to the sandbox's `lo`, and NXDOMAIN for everything else, never forwarding a
//!   query. AAAA queries get no data (the doors are IPv4 only). A name with no IPv4 address,
//!   or doors served without [`Doors::local`], gets an address from 198.18.0.0/15 instead;
//! - **transparent doors** (`0.0.0.0:PORT` per allowed port): a tool that ignores the proxy
//!   variables dials the address the DNS door gave it, which is local in the sandbox, so the
//!   connection lands on a door with that address as its local address. An address leads
//!   somewhere only if the DNS door answered it for an allowed name in this sandbox and the
//!   answer's lifetime has not ended; the connection's TLS server name (SNI) or HTTP `Host`,
//!   read without consuming it, must be one of the names it was answered for (and decides
//!   between them when several share it; without either, only a single name is unambiguous).
//!   Any other address has no route at all in the sandbox (ENETUNREACH), the metadata address
//!   169.254.169.254 included: it is never answered.
//!
//! Every door checks the normalised name and port against the allowlist **before** any DNS
//! lookup (a name that is not a valid host name is refused, see [`normalize_host`]), resolves
//! allowed names itself (or uses `resolve:` pins), refuses non-public addresses unless
//! `allow_cidrs` names them, and connects to the vetted address with no second lookup. Each
//! connection attempt and DNS query produces one [`EgressEvent`].
//!
//! A sandbox with secrets delivered by the proxy is served with an [`Interception`]
//! ([`serve_with`]): the doors read its HTTP, terminating TLS with its [`SessionCa`] (except
//! for `passthrough` destinations), substitute each token only on requests to the endpoint its
//! secret is bound to, and refuse the placeholder anywhere else as an exfiltration attempt
//! (an event naming the secret, [`EgressEvent::exfiltration`]).
#![forbid(unsafe_code)]

mod ca;
mod dns;
mod engine;
mod event;
pub mod harness;
mod http;
mod inject;
mod intercept;
mod interception;
mod io;
mod name;
mod peek;
mod plan;
mod policy;
mod proxy;
mod scan;
mod transparent;
mod vet;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

pub use ca::{SessionCa, UpstreamTrust, der_to_pem};
pub use event::{Decision, Door, EgressEvent, EventSink};
pub use inject::{Binding, Injection, Injections, Placement, TokenSource};
pub use interception::Interception;
pub use name::{Host, NameError, normalize_host, parse_ipv4_literal};
pub use plan::{DNS_DOOR, DOOR_RANGE, DoorPlan, METADATA, PROXY_DOOR, plan};
pub use policy::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, EgressPolicy,
    HostPattern, HostPort, HostPortError, PolicyError,
};
pub use vet::{Forbidden, classify, vet};

use engine::Engine;
use event::{clean, refusal, started};

/// Who the doors serve: carried into every event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoorContext {
    /// Tool name.
    pub tool: String,
    /// Session id.
    pub session: String,
}

/// The sockets the jail created inside the sandbox's network namespace, as [`plan`] asked.
#[derive(Debug, Default)]
pub struct Doors {
    /// The proxy door and the transparent listeners.
    pub tcp: Vec<std::net::TcpListener>,
    /// The DNS door.
    pub udp: Vec<std::net::UdpSocket>,
    /// Adds the addresses the DNS door answers to the sandbox's `lo`. Without it the DNS door
    /// answers addresses from [`DOOR_RANGE`] (already local) instead of the real ones.
    pub local: Option<Arc<dyn LocalAddresses>>,
}

/// Makes an address local in the sandbox's network namespace (adds it to `lo` as a /32), so
/// a connect to it lands on a transparent door with it as the local address. The DNS door
/// calls it before it answers with the address; until then the address has no route there.
pub trait LocalAddresses: Send + Sync + std::fmt::Debug {
    /// Add `ip`; an address already there is not an error.
    fn add(&self, ip: Ipv4Addr) -> Result<(), String>;
}

/// Why the doors could not be served.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The policy is not servable.
    #[error("egress policy: {0}")]
    Policy(#[from] PolicyError),
    /// A socket the plan did not ask for.
    #[error("egress door {addr} is not in the door plan of {tool} (plan: {plan})")]
    UnexpectedDoor {
        /// Its local address.
        addr: SocketAddr,
        /// The tool.
        tool: String,
        /// The planned addresses.
        plan: String,
    },
    /// A socket operation failed.
    #[error("egress door: {context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> EgressError {
    let context = context.into();
    move |source| EgressError::Io { context, source }
}

/// The running doors of one sandbox. Dropping the handle stops them too (every task is
/// aborted); [`DoorHandle::shutdown`] also waits until they are gone.
#[derive(Debug)]
pub struct DoorHandle {
    tasks: JoinSet<()>,
}

impl DoorHandle {
    /// Stop every door and every connection they carry, and wait until all are closed.
    pub async fn shutdown(mut self) {
        self.tasks.shutdown().await;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Proxy,
    Transparent,
}

/// Serve the doors of one sandbox until the returned handle is shut down or dropped.
///
/// `doors` must be the sockets [`plan`] asked for (matched by local address): the one at
/// `plan.proxy` is the proxy door, the other TCP listeners are transparent doors, the UDP
/// socket is the DNS door. Must be called inside a tokio runtime; the broker's outbound
/// connections are made from its worker threads, in the broker's network namespace.
pub async fn serve(
    policy: Arc<EgressPolicy>,
    ctx: DoorContext,
    doors: Doors,
    events: EventSink,
) -> Result<DoorHandle, EgressError> {
    serve_with(policy, ctx, doors, events, None).await
}

/// [`serve`], intercepting as `interception` says: for a sandbox with
/// secrets delivered by the proxy, the doors read its HTTP and HTTPS
/// (terminating TLS with the session CA, except for `passthrough`
/// destinations), substitute each token only where its secret is bound and
/// refuse its placeholder anywhere else. `None`: plain tunnels, as [`serve`].
pub async fn serve_with(
    policy: Arc<EgressPolicy>,
    ctx: DoorContext,
    doors: Doors,
    events: EventSink,
    interception: Option<Interception>,
) -> Result<DoorHandle, EgressError> {
    let plan = plan(&policy);
    let engine = Engine::with(
        policy.clone(),
        ctx,
        events,
        doors.local.clone(),
        interception,
    )?;
    let unexpected = |addr: SocketAddr| EgressError::UnexpectedDoor {
        addr,
        tool: policy.tool.clone(),
        plan: plan
            .tcp
            .iter()
            .chain(plan.udp.iter())
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    };
    let mut tasks = JoinSet::new();
    let mut tcp = Vec::new();
    for l in doors.tcp {
        let addr = l.local_addr().map_err(io_err("reading a door's address"))?;
        let kind = if Some(addr) == plan.proxy {
            Kind::Proxy
        } else if plan.tcp.contains(&addr) {
            Kind::Transparent
        } else {
            return Err(unexpected(addr));
        };
        l.set_nonblocking(true)
            .map_err(io_err(format!("making door {addr} non-blocking")))?;
        let l = TcpListener::from_std(l).map_err(io_err(format!("registering door {addr}")))?;
        tcp.push((l, kind));
    }
    let mut udp = Vec::new();
    for s in doors.udp {
        let addr = s.local_addr().map_err(io_err("reading a door's address"))?;
        if !plan.udp.contains(&addr) {
            return Err(unexpected(addr));
        }
        s.set_nonblocking(true)
            .map_err(io_err(format!("making door {addr} non-blocking")))?;
        let s = tokio::net::UdpSocket::from_std(s)
            .map_err(io_err(format!("registering door {addr}")))?;
        udp.push(s);
    }
    for (l, kind) in tcp {
        tasks.spawn(accept_loop(engine.clone(), l, kind));
    }
    for s in udp {
        tasks.spawn(dns::serve(engine.clone(), s));
    }
    Ok(DoorHandle { tasks })
}

/// `cordon proxy --listen ADDR`: the proxy door on a host address, with the same checks and
/// events. Runs until the future is dropped; returns only if the listener cannot be set up.
pub async fn run_proxy(
    listen: SocketAddr,
    policy: Arc<EgressPolicy>,
    ctx: DoorContext,
    events: EventSink,
) -> Result<(), EgressError> {
    run_proxy_with(listen, policy, ctx, events, None).await
}

/// [`run_proxy`], intercepting as [`serve_with`] does.
pub async fn run_proxy_with(
    listen: SocketAddr,
    policy: Arc<EgressPolicy>,
    ctx: DoorContext,
    events: EventSink,
    interception: Option<Interception>,
) -> Result<(), EgressError> {
    let engine = Engine::with(policy, ctx, events, None, interception)?;
    let l = TcpListener::bind(listen)
        .await
        .map_err(io_err(format!("listening on {listen}")))?;
    accept_loop(engine, l, Kind::Proxy).await;
    Ok(())
}

async fn accept_loop(engine: Arc<Engine>, listener: TcpListener, kind: Kind) {
    let mut conns: JoinSet<()> = JoinSet::new();
    // Connections beyond the limit still get a reasoned refusal, but only this many at once.
    let refusals = Arc::new(tokio::sync::Semaphore::new(engine.policy.max_connections));
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _peer)) => match (engine.try_slot(), kind) {
                    (Some(p), Kind::Proxy) => {
                        let _ = stream.set_nodelay(true);
                        conns.spawn(proxy::serve_conn(engine.clone(), stream, p));
                    }
                    (Some(p), Kind::Transparent) => {
                        conns.spawn(transparent::serve_conn(engine.clone(), stream, p));
                    }
                    (None, Kind::Transparent) => transparent::over_limit(&engine, stream),
                    (None, Kind::Proxy) => match refusals.clone().try_acquire_owned() {
                        Ok(p) => {
                            conns.spawn(proxy_over_limit(engine.clone(), stream, p));
                        }
                        Err(_) => {
                            let msg = refusal("", 0, &engine.limit_reason());
                            engine.emit(Door::Proxy, "", 0, None, Decision::Refused, msg, (0, 0), started());
                        }
                    },
                },
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "egress door: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// A proxy connection beyond the limit: read the request line (briefly) to say what was
/// refused, answer 503, close.
async fn proxy_over_limit(
    engine: Arc<Engine>,
    mut stream: TcpStream,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let _permit = permit;
    let t0 = started();
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let read_head = async {
        while buf.len() < 8192 && !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), read_head).await;
    let line = String::from_utf8_lossy(&buf);
    let target = line
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    let (label, port) = target_label(target);
    let msg = refusal(&label, port, &engine.limit_reason());
    let body = format!("{msg}\n");
    let resp = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(resp.as_bytes()).await;
    let _ = stream.shutdown().await;
    engine.emit(
        Door::Proxy,
        &label,
        port,
        None,
        Decision::Refused,
        msg,
        (0, 0),
        t0,
    );
}

/// Best-effort host and port of a request target, for messages only (never for decisions).
fn target_label(target: &str) -> (String, u16) {
    let rest = target.split_once("://").map(|(_, r)| r).unwrap_or(target);
    let authority = rest.split('/').next().unwrap_or("");
    let default_port = if target.starts_with("https://") {
        443
    } else {
        80
    };
    match authority.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && !p.contains(']') => {
            (clean(h), p.parse().unwrap_or(default_port))
        }
        _ => (clean(authority), default_port),
    }
}
