//! The DNS door: answers A queries for allowlisted names with the vetted IPv4 addresses the
//! broker resolved itself (or the `resolve:` pin), each made local in the sandbox first and
//! recorded with the answer's lifetime; a name without IPv4 addresses (or doors without a way
//! to add local addresses) gets an address from 198.18.0.0/15 allocated per name instead. AAAA
//! and other types for allowed names get NOERROR with no data; every other name, and a name
//! whose addresses vetting refuses, gets NXDOMAIN. It never forwards a query anywhere.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_resolver::proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_resolver::proto::rr::rdata::A;
use hickory_resolver::proto::rr::{DNSClass, RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio::task::JoinSet;

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
    let reply = |mut resp: Message, code: ResponseCode| {
        resp.metadata.response_code = code;
        resp.to_vec().ok()
    };
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
        return reply(resp, ResponseCode::NotImp);
    }
    let q = req.queries[0].clone();
    resp.add_query(q.clone());
    let raw = q.name().to_ascii();
    let qtype = q.query_type();
    let host = normalize_host(&raw);
    let label = match &host {
        Ok(Host::Name(n)) => n.clone(),
        _ => clean(raw.strip_suffix('.').unwrap_or(&raw)),
    };
    let up = packet.len() as u64;
    let verdict = match &host {
        Ok(h) => engine.name_allowed(h),
        Err(e) => Err(format!("invalid name: {e}")),
    };
    let why = match verdict {
        Ok(why) => why,
        Err(why) => {
            let msg = format!("dns query {qtype} {label} refused: {why}");
            let out = reply(resp, ResponseCode::NXDomain);
            let down = out.as_ref().map_or(0, |v| v.len() as u64);
            engine.emit(
                Door::Dns,
                &label,
                0,
                None,
                Decision::Refused,
                msg,
                (up, down),
                t0,
            );
            return out;
        }
    };
    if qtype == RecordType::A && q.query_class() == DNSClass::IN {
        let emit = |decision, msg: String, address: Option<IpAddr>, out: &Option<Vec<u8>>| {
            let down = out.as_ref().map_or(0, |v| v.len() as u64);
            engine.emit(
                Door::Dns,
                &label,
                0,
                address,
                decision,
                msg,
                (up, down),
                t0.clone(),
            );
        };
        let mut fallback_note = "door address";
        if let Some(local) = &engine.local {
            let deadline = Instant::now() + engine.policy.connect_timeout;
            let host = Host::Name(label.clone());
            let addrs = match engine.resolve_vetted(&host, deadline).await {
                Ok(a) => a,
                Err(OpenError::Refused { why, address }) => {
                    let msg = format!("dns query A {label} refused: {why}");
                    let out = reply(resp, ResponseCode::NXDomain);
                    emit(Decision::Refused, msg, Some(address), &out);
                    return out;
                }
                Err(OpenError::Failed { why, address }) => {
                    let msg = format!("dns query A {label} failed: {why}");
                    let out = reply(resp, ResponseCode::ServFail);
                    emit(Decision::Allowed, msg, address, &out);
                    return out;
                }
            };
            let v4: Vec<Ipv4Addr> = addrs
                .iter()
                .filter_map(|a| match a.to_canonical() {
                    IpAddr::V4(v) => Some(v),
                    IpAddr::V6(_) => None,
                })
                .collect();
            if !v4.is_empty() {
                for a in &v4 {
                    if let Err(why) = answerable(*a) {
                        let msg = format!(
                            "dns query A {label} refused: {label} resolves to {a}, {why}, which the DNS door never answers"
                        );
                        let out = reply(resp, ResponseCode::NXDomain);
                        emit(Decision::Refused, msg, Some(IpAddr::V4(*a)), &out);
                        return out;
                    }
                }
                let until = Instant::now() + Duration::from_secs(u64::from(TTL));
                for a in &v4 {
                    if let Err(e) = local.add(*a) {
                        let msg = format!(
                            "dns query A {label} failed: cannot make {a} local in the sandbox: {e}"
                        );
                        let out = reply(resp, ResponseCode::ServFail);
                        emit(Decision::Allowed, msg, Some(IpAddr::V4(*a)), &out);
                        return out;
                    }
                    if !engine.answers.record(*a, &label, until) {
                        let msg = format!(
                            "dns query A {label} refused: the sandbox has {} live answers already",
                            crate::engine::BOOK_CAPACITY
                        );
                        let out = reply(resp, ResponseCode::ServFail);
                        emit(Decision::Refused, msg, None, &out);
                        return out;
                    }
                }
                for a in &v4 {
                    resp.add_answer(Record::from_rdata(q.name().clone(), TTL, RData::A(A(*a))));
                }
                let out = reply(resp, ResponseCode::NoError);
                let shown: Vec<String> = v4.iter().map(|a| a.to_string()).collect();
                let msg = format!("A {label} -> {}; {why}", shown.join(", "));
                emit(Decision::Allowed, msg, Some(IpAddr::V4(v4[0])), &out);
                return out;
            }
            fallback_note = "door address: no IPv4 address";
        }
        match engine.book.assign(&label) {
            Some(a) => {
                resp.add_answer(Record::from_rdata(q.name().clone(), TTL, RData::A(A(a))));
                let out = reply(resp, ResponseCode::NoError);
                let msg = format!("A {label} -> {a} ({fallback_note}); {why}");
                emit(Decision::Allowed, msg, Some(a.into()), &out);
                out
            }
            None => {
                let msg = format!(
                    "dns query A {label} refused: the sandbox has used all {} door addresses",
                    crate::engine::BOOK_CAPACITY
                );
                let out = reply(resp, ResponseCode::ServFail);
                emit(Decision::Refused, msg, None, &out);
                out
            }
        }
    } else {
        let out = reply(resp, ResponseCode::NoError);
        let down = out.as_ref().map_or(0, |v| v.len() as u64);
        let msg = format!("{qtype} {label}: no data (the doors are IPv4 only); {why}");
        engine.emit(
            Door::Dns,
            &label,
            0,
            None,
            Decision::Allowed,
            msg,
            (up, down),
            t0,
        );
        out
    }
}
