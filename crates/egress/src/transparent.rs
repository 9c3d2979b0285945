//! The transparent door: a listener on `0.0.0.0:PORT` inside the sandbox. The address the tool
//! dialled is the accepted socket's local address; the DNS door answered it for one or more
//! names (the connection's TLS server name or HTTP `Host` picks which, see
//! [`Engine::dialled`]), so it maps back to a name. Then the same check as the proxy door, and
//! a connect to the answered address, vetted, with no second lookup.

use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::engine::{Engine, OpenError};
use crate::event::{Decision, Door, refusal, started};
use crate::intercept::{self, Dest};
use crate::io::{Meter, tunnel};
use crate::name::Host;

/// Serve one connection accepted on a transparent listener.
pub(crate) async fn serve_conn(
    engine: Arc<Engine>,
    client: TcpStream,
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
    let (host, to) = match engine.dialled(&client, local.ip()).await {
        Ok(d) => (d.host, d.to),
        Err((label, why, ip)) => {
            let msg = refusal(&label, port, &why);
            engine.emit(
                Door::Transparent,
                &label,
                port,
                ip,
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
    let opened = match to {
        Some(ip) => engine.open_to(&host, ip, port).await,
        None => engine.open(&host, port).await,
    };
    let (upstream, addr) = match opened {
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
    let note = tunnel(
        &client,
        &upstream,
        meter.clone(),
        engine.policy.idle_timeout,
    )
    .await;
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
        Ok(local) => {
            let (label, address) = engine.label_of(local.ip());
            (label, local.port(), address)
        }
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
