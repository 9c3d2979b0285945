//! TLS on both sides of an intercepted connection: the tool's TLS is
//! terminated with a leaf of the session CA for the destination (its SNI,
//! when given, must name it), and the door opens its own verified TLS to the
//! real upstream (ALPN `h2` offered only when the tool negotiated it).

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::{client, server};

use super::report::Dest;
use crate::engine::Engine;
use crate::event::{clean, refusal};
use crate::interception::Interception;
use crate::name::{Host, normalize_host};

/// Why the tool's TLS was not terminated.
pub(super) enum Ended {
    /// The handshake did not complete: the connection closes with this note.
    Closed(String),
    /// The tool named another server: refused with this message.
    Refused(String),
}

/// Terminate the tool's TLS with a leaf for `dest`. Returns the stream and
/// whether the tool negotiated h2.
pub(super) async fn terminate<S>(
    engine: &Engine,
    icpt: &Interception,
    dest: &Dest,
    client: S,
) -> Result<(server::TlsStream<S>, bool), Ended>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let leaf_name = match &dest.host {
        Host::Name(n) => n.clone(),
        Host::Ip(ip) => ip.to_string(),
    };
    let cfg = icpt
        .ca
        .server_config(&leaf_name, true)
        .map_err(|e| Ended::Closed(format!("TLS not intercepted: {e}")))?;
    let accepted = tokio::time::timeout(
        engine.policy.connect_timeout,
        tokio_rustls::TlsAcceptor::from(cfg).accept(client),
    )
    .await;
    let stream = match accepted {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return Err(Ended::Closed(format!(
                "the tool's TLS handshake with the door failed (does it trust the session CA?): {e}"
            )));
        }
        Err(_) => {
            return Err(Ended::Closed(
                "the tool's TLS handshake with the door timed out".into(),
            ));
        }
    };
    let (sni, h2) = {
        let (_, c) = stream.get_ref();
        (
            c.server_name().map(str::to_string),
            c.alpn_protocol() == Some(b"h2"),
        )
    };
    if let Some(sni) = &sni {
        let same = normalize_host(sni).is_ok_and(|h| h == dest.host);
        if !same {
            let why = format!(
                "the TLS server name {} is not the destination of this connection",
                clean(sni)
            );
            return Err(Ended::Refused(refusal(&dest.label, dest.port, &why)));
        }
    }
    Ok((stream, h2))
}

/// Open the door's own TLS to `dest` over `tcp`, verified against the
/// upstream trust (plus the binding's extra CA). Returns the stream and
/// whether the upstream chose h2.
pub(super) async fn connect<S>(
    engine: &Engine,
    icpt: &Interception,
    dest: &Dest,
    tcp: S,
    h2: bool,
) -> Result<(client::TlsStream<S>, bool), String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let extra = icpt
        .extra_ca
        .get(&(dest.host.clone(), dest.port))
        .map(String::as_str);
    let alpn: &[&[u8]] = if h2 {
        &[b"h2", b"http/1.1"]
    } else {
        &[b"http/1.1"]
    };
    let cfg = icpt.trust.client_config(extra, alpn)?;
    let name = match &dest.host {
        Host::Name(n) => {
            ServerName::try_from(n.clone()).map_err(|e| format!("TLS server name {n}: {e}"))?
        }
        Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
    };
    let tls = tokio::time::timeout(
        engine.policy.connect_timeout,
        tokio_rustls::TlsConnector::from(cfg).connect(name, tcp),
    )
    .await
    .map_err(|_| "the upstream TLS handshake timed out".to_string())?
    .map_err(|e| format!("upstream TLS: {e}"))?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    Ok((tls, h2))
}
