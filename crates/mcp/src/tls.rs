//! The TLS configuration of `cordon serve --tls-cert FILE --tls-key FILE`:
//! rustls on ring, HTTP/1.1 by ALPN.
//!
//! The private key file is opened once; its owner and mode are checked on
//! the open descriptor and the key is read from that same descriptor
//! (`cordon_config::read_checked`), so a file swapped between the check and
//! the read is never the one used. It must be a regular file owned by
//! cordon's user or root, not readable or writable by group or others.

use std::path::Path;
use std::sync::Arc;

use crate::gateway::GatewayError;

/// The TLS configuration of a certificate chain and its private key (PEM
/// files), or why they cannot be used (naming the file).
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, GatewayError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: &Path, m: String| GatewayError::Transport(format!("{}: {m}", what.display()));
    let pem = cordon_config::read_checked(key, cordon_config::Privacy::Private)
        .map_err(|m| bad(key, format!("the TLS key {m}")))?;
    let k = PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| bad(key, format!("not a PEM private key: {e}")))?;
    drop(pem);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad(cert, format!("cannot be read as PEM: {e}")))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(cert, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(bad(cert, "holds no certificate".into()));
    }
    crate::client::install_crypto_provider();
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| GatewayError::Transport(format!("TLS: {e}")))?
    .with_no_client_auth()
    .with_single_cert(certs, k)
    .map_err(|e| {
        GatewayError::Transport(format!(
            "{} and {}: not a usable certificate and key: {e}",
            cert.display(),
            key.display()
        ))
    })?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
