//! The DNS door: answers A queries for allowlisted names with the vetted IPv4 addresses the
//! broker resolved itself (or the `resolve:` pin), each made local in the sandbox first and
//! recorded with the answer's lifetime; a name without IPv4 addresses (or doors without a way
//! to add local addresses) gets an address from 198.18.0.0/15 allocated per name instead. AAAA
//! and other types for allowed names get NOERROR with no data; every other name, and a name
//! whose addresses vetting refuses, gets NXDOMAIN. It never forwards a query anywhere.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_resolver::proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_resolver::proto::rr::rdata::A;
use hickory_resolver::proto::rr::{DNSClass, Name, RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio::task::JoinSet;

use crate::LocalAddresses;
use crate::engine::{Engine, OpenError};
use crate::event::{Decision, Door, clean, started};
use crate::name::{Host, normalize_host};
use crate::plan::{DOOR_RANGE, METADATA};
use crate::vet::{Forbidden, classify};

/// TTL of the answers. A transparent connection to a real address is allowed for as long as
/// the answer lives (each answer renews it); door addresses are stable for the sandbox's life.
const TTL: u32 = 300;

/// Queries answered at once (each may wait for the broker's resolver); more wait their turn.
const CONCURRENT: usize = 64;

/// Serve the DNS door on one UDP socket until the task is dropped.
pub(crate) async fn serve(engine: Arc<Engine>, sock: UdpSocket) {
    let sock = Arc::new(sock);
    let mut buf = vec![0u8; 4096];
    let mut pending: JoinSet<()> = JoinSet::new();
    loop {
        while pending.try_join_next().is_some() {}
        if pending.len() >= CONCURRENT {
            pending.join_next().await;
        }
        let (n, peer) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "dns door: receive failed");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
        };
        let packet = buf[..n].to_vec();
        let engine = engine.clone();
        let sock = sock.clone();
        pending.spawn(async move {
            if let Some(resp) = answer(&engine, &packet).await
                && let Err(e) = sock.send_to(&resp, peer).await
            {
                tracing::warn!(error = %e, "dns door: send failed");
            }
        });
    }
}

/// An address the DNS door may answer (and make local in the sandbox): vetted already; never
/// the metadata address, an address of the door range, or one that cannot be a destination.
fn answerable(a: Ipv4Addr) -> Result<(), String> {
    if a == METADATA {
        return Err("the cloud metadata address".into());
    }
    if DOOR_RANGE.contains(&a) {
        return Err(format!("in the door range {DOOR_RANGE}"));
    }
    match classify(IpAddr::V4(a)) {
        Some(f @ (Forbidden::Unspecified | Forbidden::Multicast | Forbidden::Broadcast)) => {
            Err(f.to_string())
        }
        _ => Ok(()),
    }
}

/// Answer one query packet (and report it). `None` for packets that are not queries.
pub(crate) async fn answer(engine: &Engine, packet: &[u8]) -> Option<Vec<u8>> {
    let t0 = started();
    let req = match Message::from_vec(packet) {
        Ok(m) => m,
        Err(_) => {
            engine.emit(
                Door::Dns,
                "",
                0,
                None,
                Decision::Refused,
                "dns query refused: malformed packet".into(),
                (packet.len() as u64, 0),
                t0,
            );
            return None;
        }
    };
    if req.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
    resp.metadata.recursion_desired = req.metadata.recursion_desired;
    resp.metadata.recursion_available = true;
    resp.metadata.authoritative = true;
    if req.metadata.op_code != OpCode::Query || req.queries.len() != 1 {
        engine.emit(
            Door::Dns,
            "",
            0,
            None,
            Decision::Refused,
            "dns query refused: only single-question standard queries are answered".into(),
            (packet.len() as u64, 0),
            t0,
        );
        resp.metadata.response_code = ResponseCode::NotImp;
        return resp.to_vec().ok();
    }
    let q = req.queries[0].clone();
    resp.add_query(q.clone());
    answer_question(engine, &q, resp, packet.len() as u64, t0).await
}

/// One question being answered: the response so far, and what every event of it carries.
struct Asked<'a> {
    engine: &'a Engine,
    /// The response, its question added.
    resp: Message,
    /// The name asked for, as the events show it.
    label: String,
    /// Bytes of the query.
    up: u64,
    t0: (Instant, String),
}

/// How an answer ends when it ends early: the response code, the decision, the reason and the
/// address the event names.
struct Ending {
    code: ResponseCode,
    decision: Decision,
    msg: String,
    address: Option<IpAddr>,
}

impl Asked<'_> {
    /// The response with `code`, reported with its size.
    fn finish(
        self,
        code: ResponseCode,
        decision: Decision,
        msg: String,
        address: Option<IpAddr>,
    ) -> Option<Vec<u8>> {
        let mut resp = self.resp;
        resp.metadata.response_code = code;
        let out = resp.to_vec().ok();
        let down = out.as_ref().map_or(0, |v| v.len() as u64);
        self.engine.emit(
            Door::Dns,
            &self.label,
            0,
            address,
            decision,
            msg,
            (self.up, down),
            self.t0,
        );
        out
    }

    /// [`Asked::finish`] with an [`Ending`].
    fn end(self, e: Ending) -> Option<Vec<u8>> {
        self.finish(e.code, e.decision, e.msg, e.address)
    }
}

/// Answer the one question of a standard query: NXDOMAIN for a name the policy refuses, an
/// A answer for A/IN, no data for any other type.
async fn answer_question(
    engine: &Engine,
    q: &Query,
    resp: Message,
    up: u64,
    t0: (Instant, String),
) -> Option<Vec<u8>> {
    let raw = q.name().to_ascii();
    let qtype = q.query_type();
    let host = normalize_host(&raw);
    let label = match &host {
        Ok(Host::Name(n)) => n.clone(),
        _ => clean(raw.strip_suffix('.').unwrap_or(&raw)),
    };
    let verdict = match &host {
        Ok(h) => engine.name_allowed(h),
        Err(e) => Err(format!("invalid name: {e}")),
    };
    let asked = Asked {
        engine,
        resp,
        label,
        up,
        t0,
    };
    let why = match verdict {
        Ok(why) => why,
        Err(why) => {
            let msg = format!("dns query {qtype} {} refused: {why}", asked.label);
            return asked.finish(ResponseCode::NXDomain, Decision::Refused, msg, None);
        }
    };
    if qtype == RecordType::A && q.query_class() == DNSClass::IN {
        answer_a(asked, q.name(), &why).await
    } else {
        let msg = format!(
            "{qtype} {}: no data (the doors are IPv4 only); {why}",
            asked.label
        );
        asked.finish(ResponseCode::NoError, Decision::Allowed, msg, None)
    }
}

/// Answer an A question for an allowed name: its real addresses when the sandbox can make
/// them local and the name has IPv4 ones, a door address otherwise.
async fn answer_a(mut asked: Asked<'_>, name: &Name, why: &str) -> Option<Vec<u8>> {
    let engine = asked.engine;
    let mut fallback_note = "door address";
    if let Some(local) = &engine.local {
        match real_addresses(engine, local.as_ref(), &asked.label).await {
            Err(e) => return asked.end(e),
            Ok(v4) if !v4.is_empty() => {
                for a in &v4 {
                    asked
                        .resp
                        .add_answer(Record::from_rdata(name.clone(), TTL, RData::A(A(*a))));
                }
                let shown: Vec<String> = v4.iter().map(|a| a.to_string()).collect();
                let msg = format!("A {} -> {}; {why}", asked.label, shown.join(", "));
                let address = Some(IpAddr::V4(v4[0]));
                return asked.finish(ResponseCode::NoError, Decision::Allowed, msg, address);
            }
            Ok(_) => fallback_note = "door address: no IPv4 address",
        }
    }
    door_address(asked, name, why, fallback_note)
}

/// The vetted IPv4 addresses the broker resolves `label` to, each made local in the sandbox
/// and recorded with the answer's lifetime; empty when the name has none.
async fn real_addresses(
    engine: &Engine,
    local: &dyn LocalAddresses,
    label: &str,
) -> Result<Vec<Ipv4Addr>, Ending> {
    let deadline = Instant::now() + engine.policy.connect_timeout;
    let host = Host::Name(label.to_string());
    let addrs = match engine.resolve_vetted(&host, deadline).await {
        Ok(a) => a,
        Err(OpenError::Refused { why, address }) => {
            return Err(Ending {
                code: ResponseCode::NXDomain,
                decision: Decision::Refused,
                msg: format!("dns query A {label} refused: {why}"),
                address: Some(address),
            });
        }
        Err(OpenError::Failed { why, address }) => {
            return Err(Ending {
                code: ResponseCode::ServFail,
                decision: Decision::Allowed,
                msg: format!("dns query A {label} failed: {why}"),
                address,
            });
        }
    };
    let v4: Vec<Ipv4Addr> = addrs
        .iter()
        .filter_map(|a| match a.to_canonical() {
            IpAddr::V4(v) => Some(v),
            IpAddr::V6(_) => None,
        })
        .collect();
    if v4.is_empty() {
        return Ok(v4);
    }
    for a in &v4 {
        if let Err(why) = answerable(*a) {
            return Err(Ending {
                code: ResponseCode::NXDomain,
                decision: Decision::Refused,
                msg: format!(
                    "dns query A {label} refused: {label} resolves to {a}, {why}, which the DNS door never answers"
                ),
                address: Some(IpAddr::V4(*a)),
            });
        }
    }
    let until = Instant::now() + Duration::from_secs(u64::from(TTL));
    for a in &v4 {
        if let Err(e) = local.add(*a) {
            return Err(Ending {
                code: ResponseCode::ServFail,
                decision: Decision::Allowed,
                msg: format!(
                    "dns query A {label} failed: cannot make {a} local in the sandbox: {e}"
                ),
                address: Some(IpAddr::V4(*a)),
            });
        }
        if !engine.answers.record(*a, label, until) {
            return Err(Ending {
                code: ResponseCode::ServFail,
                decision: Decision::Refused,
                msg: format!(
                    "dns query A {label} refused: the sandbox has {} live answers already",
                    crate::engine::BOOK_CAPACITY
                ),
                address: None,
            });
        }
    }
    Ok(v4)
}

/// Answer an A question with the door address allocated to the name.
fn door_address(
    mut asked: Asked<'_>,
    name: &Name,
    why: &str,
    fallback_note: &str,
) -> Option<Vec<u8>> {
    match asked.engine.book.assign(&asked.label) {
        Some(a) => {
            asked
                .resp
                .add_answer(Record::from_rdata(name.clone(), TTL, RData::A(A(a))));
            let msg = format!("A {} -> {a} ({fallback_note}); {why}", asked.label);
            asked.finish(
                ResponseCode::NoError,
                Decision::Allowed,
                msg,
                Some(a.into()),
            )
        }
        None => {
            let msg = format!(
                "dns query A {} refused: the sandbox has used all {} door addresses",
                asked.label,
                crate::engine::BOOK_CAPACITY
            );
            asked.finish(ResponseCode::ServFail, Decision::Refused, msg, None)
        }
    }
}
