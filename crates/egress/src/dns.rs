//! The DNS door: answers A queries for allowlisted names with an address from 198.18.0.0/15
//! that it allocates per name; AAAA and other types for allowed names get NOERROR with no data;
//! every other name gets NXDOMAIN. It never forwards a query anywhere.

use std::sync::Arc;

use hickory_resolver::proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_resolver::proto::rr::rdata::A;
use hickory_resolver::proto::rr::{DNSClass, RData, Record, RecordType};
use tokio::net::UdpSocket;

use crate::engine::{Engine, clean, started};
use crate::event::{Decision, Door};
use crate::name::{Host, normalize_host};

/// TTL of the answers: addresses are stable for the sandbox's lifetime.
const TTL: u32 = 300;

/// Serve the DNS door on one UDP socket until the task is dropped.
pub(crate) async fn serve(engine: Arc<Engine>, sock: UdpSocket) {
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "dns door: receive failed");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
        };
        if let Some(resp) = answer(&engine, &buf[..n])
            && let Err(e) = sock.send_to(&resp, peer).await
        {
            tracing::warn!(error = %e, "dns door: send failed");
        }
    }
}

/// Answer one query packet (and report it). `None` for packets that are not queries.
pub(crate) fn answer(engine: &Engine, packet: &[u8]) -> Option<Vec<u8>> {
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
        match engine.book.assign(&label) {
            Some(a) => {
                resp.add_answer(Record::from_rdata(q.name().clone(), TTL, RData::A(A(a))));
                let out = reply(resp, ResponseCode::NoError);
                let down = out.as_ref().map_or(0, |v| v.len() as u64);
                let msg = format!("A {label} -> {a} (door address); {why}");
                engine.emit(
                    Door::Dns,
                    &label,
                    0,
                    Some(a.into()),
                    Decision::Allowed,
                    msg,
                    (up, down),
                    t0,
                );
                out
            }
            None => {
                let msg = format!(
                    "dns query A {label} refused: the sandbox has used all {} door addresses",
                    crate::engine::BOOK_CAPACITY
                );
                let out = reply(resp, ResponseCode::ServFail);
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
