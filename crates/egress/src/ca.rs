//! The session CA: made in memory for one sandbox whose tool has secrets
//! delivered by the proxy, so the doors can terminate its TLS and substitute
//! tokens. Its key never leaves this process (it is never serialised); the
//! sandbox gets only the certificate ([`SessionCa::cert_pem`]), in its trust
//! bundle. Leaf certificates are minted per host on first use and cached.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Most leaf certificates cached per CA (a sandbox reaches few hosts).
const LEAF_CACHE: usize = 1024;

/// A CA of one sandbox (or session).
pub struct SessionCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pem: String,
    leaves: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

impl fmt::Debug for SessionCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionCa").finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl SessionCa {
    /// A new CA whose subject names `label` (the tool and session, for
    /// whoever inspects the sandbox's trust bundle). Valid from a day ago
    /// (clock skew) for 30 days; it lives only as long as this value.
    pub fn new(label: &str) -> Result<SessionCa, String> {
        let key = KeyPair::generate().map_err(|e| format!("session CA key: {e}"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "cordon");
        let cn: String = format!("cordon session CA {label}")
            .chars()
            .filter(|c| c.is_ascii_graphic() || *c == ' ')
            .take(64)
            .collect();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(30);
        let issuer = CertifiedIssuer::self_signed(params, key)
            .map_err(|e| format!("session CA certificate: {e}"))?;
        let pem = issuer.pem();
        Ok(SessionCa {
            issuer,
            pem,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM: what the sandbox trusts.
    pub fn cert_pem(&self) -> &str {
        &self.pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        self.issuer.der()
    }

    /// The leaf certificate and key for `host` (a normalised name or an IP
    /// literal), minted on first use.
    pub(crate) fn leaf(&self, host: &str) -> Result<Arc<CertifiedKey>, String> {
        let mut cache = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache.get(host) {
            return Ok(k.clone());
        }
        let key = KeyPair::generate().map_err(|e| format!("leaf key for {host}: {e}"))?;
        let mut params = CertificateParams::new(vec![host.to_string()])
            .map_err(|e| format!("leaf certificate for {host}: {e}"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(30);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| format!("leaf certificate for {host}: {e}"))?;
        let der_key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing = provider()
            .key_provider
            .load_private_key(der_key)
            .map_err(|e| format!("leaf key for {host}: {e}"))?;
        let ck = Arc::new(CertifiedKey::new(
            vec![cert.der().clone(), self.issuer.der().clone()],
            signing,
        ));
        if cache.len() >= LEAF_CACHE {
            cache.clear();
        }
        cache.insert(host.to_string(), ck.clone());
        Ok(ck)
    }

    /// A TLS server configuration presenting the leaf of `host` whatever
    /// the client's SNI says (the caller checks the SNI), offering `h2` and
    /// `http/1.1` (or only `http/1.1`) by ALPN.
    pub(crate) fn server_config(
        &self,
        host: &str,
        h2: bool,
    ) -> Result<Arc<rustls::ServerConfig>, String> {
        let leaf = self.leaf(host)?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS server configuration: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Fixed(leaf)));
        cfg.alpn_protocols = if h2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        Ok(Arc::new(cfg))
    }
}

#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// How the doors verify the real upstreams of intercepted connections: the
/// host's trust store (read once, as `rustls-native-certs` finds it:
/// `SSL_CERT_FILE`, else the distribution's bundle under /etc/ssl), plus a
/// binding's own CA file for an internal service.
#[derive(Clone)]
pub struct UpstreamTrust {
    roots: Arc<rustls::RootCertStore>,
    ders: Arc<Vec<CertificateDer<'static>>>,
}

impl fmt::Debug for UpstreamTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTrust")
            .field("roots", &self.roots.len())
            .finish()
    }
}

impl UpstreamTrust {
    /// The host's system roots. Fails when none can be read (every
    /// intercepted upstream would then fail to verify).
    pub fn system() -> Result<UpstreamTrust, String> {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = rustls::RootCertStore::empty();
        let mut ders = Vec::new();
        for c in found.certs {
            if roots.add(c.clone()).is_ok() {
                ders.push(c);
            }
        }
        if roots.is_empty() {
            let errs: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
            return Err(format!(
                "no trusted root certificates on this host ({})",
                errs.join("; ")
            ));
        }
        Ok(UpstreamTrust {
            roots: Arc::new(roots),
            ders: Arc::new(ders),
        })
    }

    /// Exactly these roots (PEM), e.g. a test CA.
    pub fn from_pem(pem: &str) -> Result<UpstreamTrust, String> {
        let mut roots = rustls::RootCertStore::empty();
        let mut ders = Vec::new();
        for c in parse_pem_certs(pem)? {
            roots
                .add(c.clone())
                .map_err(|e| format!("trusted root certificate: {e}"))?;
            ders.push(c);
        }
        if roots.is_empty() {
            return Err("no certificate in the PEM text".into());
        }
        Ok(UpstreamTrust {
            roots: Arc::new(roots),
            ders: Arc::new(ders),
        })
    }

    /// The roots as PEM, for a sandbox's trust bundle.
    pub fn pem(&self) -> String {
        self.ders.iter().map(|d| der_to_pem(d)).collect()
    }

    /// A client configuration trusting these roots plus those of
    /// `extra_ca` (PEM text), offering `alpn`.
    pub(crate) fn client_config(
        &self,
        extra_ca: Option<&str>,
        alpn: &[&[u8]],
    ) -> Result<Arc<rustls::ClientConfig>, String> {
        let roots = match extra_ca {
            None => self.roots.clone(),
            Some(pem) => {
                let mut r = (*self.roots).clone();
                for c in parse_pem_certs(pem)? {
                    r.add(c)
                        .map_err(|e| format!("upstream CA certificate: {e}"))?;
                }
                Arc::new(r)
            }
        };
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS client configuration: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(cfg))
    }
}

/// Every `CERTIFICATE` block of a PEM text.
pub(crate) fn parse_pem_certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("PEM certificates: {e}"))
}

/// PEM text of one DER certificate.
pub fn der_to_pem(der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}
