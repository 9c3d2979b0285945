//! The transparent door: a listener on `0.0.0.0:PORT` inside the sandbox. The address the tool
//! dialled is the accepted socket's local address; the DNS door handed it out for one name, so
//! it maps back to that name. Then the same check, vetting and connect as the proxy door.

use std::net::IpAddr;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::engine::{Engine, OpenError, refusal, started};
use crate::event::{Decision, Door};
use crate::intercept::{self, Dest};
use crate::io::{Meter, Metered, splice};
use crate::name::Host;
use crate::plan::DOOR_RANGE;
use crate::policy::HostPattern;

/// What the tool dialled: the name behind a door address, an allowlisted IP literal, or
/// `Err(address)` when the address means nothing here.
pub(crate) fn dialled(engine: &Engine, ip: IpAddr) -> Result<Host, IpAddr> {
    let ip = ip.to_canonical();
    if let IpAddr::V4(a) = ip
        && DOOR_RANGE.contains(&a)
    {
        return engine.book.name_of(a).map(Host::Name).ok_or(ip);
    }
    let listed = engine
        .policy
        .allow
        .iter()
        .any(|hp| hp.host == HostPattern::Ip(ip));
    if listed { Ok(Host::Ip(ip)) } else { Err(ip) }
}

/// Serve one connection accepted on a transparent listener.
pub(crate) async fn serve_conn(
    engine: Arc<Engine>,
    mut client: TcpStream,
    permit: OwnedSemaphorePermit,
) {
    let _permit = permit;
    let t0 = started();
    let local = match client.local_addr() {
        Ok(a) => a,
        Err(e) => {
            let msg = format!("egress refused: cannot read the dialled address: {e}");
            engine.emit(
                Door::Transparent,
                "",
                0,
                None,
                Decision::Refused,
                msg,
                (0, 0),
                t0,
            );
            return;
        }
    };
    let port = local.port();
    let host = match dialled(&engine, local.ip()) {
        Ok(h) => h,
        Err(ip) => {
            let why = format!(
                "{ip} is not an address the DNS door handed out to {}",
                engine.policy.tool
            );
            let label = ip.to_string();
            let msg = refusal(&label, port, &why);
            engine.emit(
                Door::Transparent,
                &label,
                port,
                Some(ip),
                Decision::Refused,
                msg,
                (0, 0),
                t0,
            );
            return;
        }
    };
    let label = match &host {
        Host::Name(n) => n.clone(),
        Host::Ip(ip) => ip.to_string(),
    };
    let allowed_why = match engine.check(&host, &label, port) {
        Ok(w) => w,
        Err(why) => {
            let msg = refusal(&label, port, &why);
            engine.emit(
                Door::Transparent,
                &label,
                port,
                None,
                Decision::Refused,
                msg,
                (0, 0),
                t0,
            );
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let (upstream, addr) = match engine.open(&host, port).await {
        Ok(ok) => ok,
        Err(OpenError::Refused { why, address }) => {
            let msg = refusal(&label, port, &why);
            engine.emit(
                Door::Transparent,
                &label,
                port,
                Some(address),
                Decision::Refused,
                msg,
                (0, 0),
                t0,
            );
            return;
        }
        Err(OpenError::Failed { why, address }) => {
            let msg = format!("egress to {label}:{port} failed: {why}");
            engine.emit(
                Door::Transparent,
                &label,
                port,
                address,
                Decision::Allowed,
                msg,
                (0, 0),
                t0,
            );
            return;
        }
    };
    if let Some(icpt) = engine.interception(&host, port) {
        let dest = Dest {
            host,
            port,
            label,
            allowed_why,
            addr,
            door: Door::Transparent,
        };
        intercept::serve(engine.clone(), icpt, dest, client, upstream, t0).await;
        return;
    }
    let meter = Meter::new();
    let mut up = Metered::new(upstream, meter.clone());
    let note = splice(&mut client, &mut up, engine.policy.idle_timeout).await;
    let reason = match note {
        Some(n) => format!("{allowed_why}; {n}"),
        None => allowed_why,
    };
    engine.emit(
        Door::Transparent,
        &label,
        port,
        Some(addr),
        Decision::Allowed,
        reason,
        (meter.written_bytes(), meter.read_bytes()),
        t0,
    );
}

/// A connection beyond the limit: report what it was for, then close it.
pub(crate) fn over_limit(engine: &Engine, client: TcpStream) {
    let t0 = started();
    let (label, port, address) = match client.local_addr() {
        Ok(local) => match dialled(engine, local.ip()) {
            Ok(Host::Name(n)) => (n, local.port(), None),
            Ok(Host::Ip(ip)) | Err(ip) => (ip.to_string(), local.port(), Some(ip)),
        },
        Err(_) => (String::new(), 0, None),
    };
    let msg = refusal(&label, port, &engine.limit_reason());
    engine.emit(
        Door::Transparent,
        &label,
        port,
        address,
        Decision::Refused,
        msg,
        (0, 0),
        t0,
    );
}
