//! Pulling `NAME@sha256:HEX` from an OCI distribution registry.
//!
//! HTTPS, always, except for a registry on a loopback address
//! (`localhost`, `127.0.0.0/8`, `[::1]`) or one named in
//! [`PullOptions::insecure`]: those are tried over HTTPS first, then over
//! plain HTTP if that cannot connect. Credentials come from Docker's
//! `config.json` (`$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`): the registry's credential helper
//! (`credHelpers`, else `credsStore`: `docker-credential-NAME get`), else
//! its `auths` entry (`auth`, base64 `user:password`); none means
//! anonymous. A registry's bearer-token challenge is answered by
//! `oci-client` with those credentials.
//!
//! Every blob is verified against its digest and size while it is written
//! into the store (see [`crate::store`]), and the image is unpacked before
//! it is recorded; a pull killed at any point leaves no image that looks
//! complete, and the next pull reuses the verified blobs and fetches the
//! rest. Manifests are requested by cordon itself, with the credentials
//! `oci-client` negotiates, and streamed: one over
//! [`MAX_MANIFEST_BYTES`] (4 MiB) is refused as soon as that is known,
//! never read whole into memory.

use std::ffi::OsString;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use futures_util::StreamExt as _;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{DigestError, OciDistributionError};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::token_cache::RegistryOperation;
use oci_client::{Client, Reference};

use crate::digest::{Digest, VerifyError};
use crate::manifest::media;
use crate::reference::{DEFAULT_REGISTRY, ImageRef};
use crate::store::{
    Fetcher, Ingested, MAX_MANIFEST_BYTES, Progress, Store, StoreError, Want, io_err,
};

/// How to reach registries.
#[derive(Clone, Debug, Default)]
pub struct PullOptions {
    /// Registries (`host` or `host:port`) that may be reached over plain
    /// HTTP when HTTPS fails (loopback registries always may).
    pub insecure: Vec<String>,
    /// The directory of Docker's `config.json`; default `$DOCKER_CONFIG`,
    /// else `~/.docker`.
    pub docker_config: Option<PathBuf>,
    /// Where to look for `docker-credential-*` helpers; default `$PATH`.
    pub helper_path: Option<OsString>,
}

fn registry_err(registry: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Source(format!("registry {registry}: {e}"))
}

/// The host of `host[:port]` or `[v6][:port]`.
fn host_of(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match registry.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => registry,
    }
}

/// Whether `registry` is on a loopback address.
pub fn is_loopback(registry: &str) -> bool {
    let host = host_of(registry);
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl PullOptions {
    /// Whether `registry` may be reached over plain HTTP.
    pub fn allows_plain_http(&self, registry: &str) -> bool {
        is_loopback(registry)
            || self
                .insecure
                .iter()
                .any(|i| i == registry || (!i.contains(':') && i == host_of(registry)))
    }

    fn config_dir(&self) -> Option<PathBuf> {
        if let Some(d) = &self.docker_config {
            return Some(d.clone());
        }
        if let Some(d) = std::env::var_os("DOCKER_CONFIG").filter(|v| !v.is_empty()) {
            return Some(PathBuf::from(d));
        }
        std::env::var_os("HOME")
            .filter(|v| !v.is_empty())
            .map(|h| PathBuf::from(h).join(".docker"))
    }
}

/// Pull `image` into the store (nothing is fetched when it is complete
/// there already). `progress` is called as layers arrive.
pub fn pull(
    store: &Store,
    image: &ImageRef,
    opts: &PullOptions,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<Ingested, StoreError> {
    if tokio::runtime::Handle::try_current().is_ok() {
        // A runtime cannot be started inside another one's thread.
        return std::thread::scope(|s| {
            s.spawn(|| pull_here(store, image, opts, progress))
                .join()
                .unwrap_or_else(|_| Err(StoreError::Source("the pull thread panicked".into())))
        });
    }
    pull_here(store, image, opts, progress)
}

fn pull_here(
    store: &Store,
    image: &ImageRef,
    opts: &PullOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Ingested, StoreError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_err("start the pull's runtime"))?;
    let mut fetcher = RegistryFetcher {
        rt,
        image,
        opts,
        conn: None,
    };
    store.ingest(
        &mut fetcher,
        &image.digest,
        None,
        Some(&image.name()),
        progress,
    )
}

struct Connection {
    client: Client,
    /// For manifests, whose bodies `oci-client` reads whole: read here as
    /// a stream, held to [`MAX_MANIFEST_BYTES`].
    http: reqwest::Client,
    auth: RegistryAuth,
    plain: bool,
}

struct RegistryFetcher<'a> {
    rt: tokio::runtime::Runtime,
    image: &'a ImageRef,
    opts: &'a PullOptions,
    conn: Option<Connection>,
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// The HTTP client of manifest requests: the same timeouts and TLS as
/// `oci-client`'s own.
fn http_client(registry: &str) -> Result<reqwest::Client, StoreError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .user_agent(concat!("cordon/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| registry_err(registry, format!("cannot set up the client: {e}")))
}

fn client(registry: &str, plain: bool) -> Result<Client, StoreError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let protocol = if plain {
        ClientProtocol::HttpsExcept(vec![registry.to_string()])
    } else {
        ClientProtocol::Https
    };
    Client::try_from(ClientConfig {
        protocol,
        connect_timeout: Some(CONNECT_TIMEOUT),
        read_timeout: Some(READ_TIMEOUT),
        platform_resolver: None,
        ..ClientConfig::default()
    })
    .map_err(|e| registry_err(registry, format!("cannot set up the client: {e}")))
}

impl RegistryFetcher<'_> {
    fn reference(&self, digest: &str) -> Reference {
        Reference::with_digest(
            self.image.registry.clone(),
            self.image.repository.clone(),
            digest.to_string(),
        )
    }

    fn connect(&mut self, plain: bool) -> Result<(), StoreError> {
        let auth = match self.conn.take() {
            Some(c) => c.auth,
            None => credentials(&self.image.registry, self.opts)?,
        };
        let reference = self.reference(&self.image.digest.to_string());
        let client = client(reference.resolve_registry(), plain)?;
        let http = http_client(reference.resolve_registry())?;
        self.rt
            .block_on(client.store_auth_if_needed(reference.resolve_registry(), &auth));
        self.conn = Some(Connection {
            client,
            http,
            auth,
            plain,
        });
        Ok(())
    }

    /// GET a manifest (or index) by digest, streamed into `out` (which
    /// verifies it) and refused as soon as it is over
    /// [`MAX_MANIFEST_BYTES`], by its `Content-Length` or by what arrives:
    /// never read whole into memory first, as `oci-client`'s
    /// `pull_manifest_raw` would.
    async fn fetch_manifest(
        conn: &Connection,
        reference: &Reference,
        want: &Want,
        out: &mut dyn Write,
    ) -> Result<(), Failure> {
        let registry = reference.resolve_registry();
        // The token (or the Basic credentials) `oci-client` would send; a
        // connection that fails here falls back to plain HTTP as a blob's
        // would.
        let token = conn
            .client
            .auth(reference, &conn.auth, RegistryOperation::Pull)
            .await
            .map_err(Failure::Registry)?;
        let url = format!(
            "{}://{registry}/v2/{}/manifests/{}",
            if conn.plain { "http" } else { "https" },
            reference.repository(),
            want.digest
        );
        let mut request = conn
            .http
            .get(&url)
            .header(reqwest::header::ACCEPT, media::ACCEPTED.join(", "));
        request = match (token, &conn.auth) {
            (Some(t), _) => request.bearer_auth(t),
            (None, RegistryAuth::Basic(user, password)) => request.basic_auth(user, Some(password)),
            _ => request,
        };
        let mut response = request
            .send()
            .await
            .map_err(|e| Failure::Registry(OciDistributionError::RequestError(e)))?;
        let status = response.status();
        let limit = |detail: String| {
            Failure::Store(StoreError::Source(format!(
                "registry {registry}: manifest {} refused: over the 4 MiB limit on a manifest ({MAX_MANIFEST_BYTES} bytes): {detail}",
                want.digest
            )))
        };
        if !status.is_success() {
            let what = format!("manifest {}", want.digest);
            return Err(Failure::Store(match status.as_u16() {
                401 | 403 => StoreError::Source(format!(
                    "registry {registry}: not authorized to pull {what} (check the credentials in Docker's config.json): HTTP {status}"
                )),
                404 => StoreError::Source(format!(
                    "registry {registry}: {what} is not in {} (HTTP {status})",
                    reference.repository()
                )),
                _ => StoreError::Source(format!("registry {registry}: {what}: HTTP {status}")),
            }));
        }
        if let Some(len) = response.content_length()
            && len > MAX_MANIFEST_BYTES
        {
            return Err(limit(format!("the registry announces {len} bytes")));
        }
        let mut seen = 0u64;
        loop {
            let chunk = response.chunk().await.map_err(|e| {
                Failure::Store(registry_err(
                    registry,
                    format!("receiving manifest {}: {e}", want.digest),
                ))
            })?;
            let Some(chunk) = chunk else { break };
            seen = seen.saturating_add(chunk.len() as u64);
            if seen > MAX_MANIFEST_BYTES {
                return Err(limit(format!("{seen} bytes arrived")));
            }
            out.write_all(&chunk)
                .map_err(|e| Failure::Store(io_err(format!("write {}", want.digest))(e)))?;
        }
        Ok(())
    }

    async fn fetch_once(
        conn: &Connection,
        reference: &Reference,
        want: &Want,
        out: &mut dyn Write,
    ) -> Result<(), Failure> {
        if want.is_manifest {
            return Self::fetch_manifest(conn, reference, want, out).await;
        }
        let size = want.size.unwrap_or(0);
        let desc = OciDescriptor {
            digest: want.digest.to_string(),
            size: i64::try_from(size).unwrap_or(i64::MAX),
            ..OciDescriptor::default()
        };
        let mut stream = conn
            .client
            .pull_blob_stream(reference, &desc)
            .await
            .map_err(Failure::Registry)?;
        if let Some(len) = stream.content_length
            && want.size.is_some_and(|s| s != len)
        {
            return Err(Failure::Store(StoreError::Source(format!(
                "blob {} is {size} bytes, but the registry sends {len}",
                want.digest
            ))));
        }
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                let verify = e
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<DigestError>())
                    .and_then(|d| as_verify(want, d));
                Failure::Store(match verify {
                    Some(v) => StoreError::Verify(v),
                    None => registry_err(
                        reference.registry(),
                        format!("receiving blob {}: {e}", want.digest),
                    ),
                })
            })?;
            out.write_all(&chunk)
                .map_err(|e| Failure::Store(io_err(format!("write blob {}", want.digest))(e)))?;
        }
        Ok(())
    }
}

enum Failure {
    Registry(OciDistributionError),
    Store(StoreError),
}

impl Fetcher for RegistryFetcher<'_> {
    fn fetch(&mut self, want: &Want, out: &mut dyn Write) -> Result<(), StoreError> {
        if self.conn.is_none() {
            self.connect(false)?;
        }
        let registry = self.image.registry.clone();
        let reference = self.reference(&want.digest.to_string());
        loop {
            let Some(conn) = self.conn.as_ref() else {
                return Err(registry_err(&registry, "not connected"));
            };
            let result = self
                .rt
                .block_on(Self::fetch_once(conn, &reference, want, &mut *out));
            match result {
                Ok(()) => return Ok(()),
                Err(Failure::Store(e)) => return Err(e),
                // Could not connect over HTTPS (nothing was written): a
                // registry allowed plain HTTP is tried over it.
                Err(Failure::Registry(OciDistributionError::RequestError(_)))
                    if !conn.plain && self.opts.allows_plain_http(&registry) =>
                {
                    self.connect(true)?;
                }
                Err(Failure::Registry(e)) => return Err(describe(&registry, want, e)),
            }
        }
    }
}

/// oci-client's digest mismatch as the store's.
fn as_verify(want: &Want, e: &DigestError) -> Option<VerifyError> {
    match e {
        DigestError::VerificationError { actual, .. } => actual
            .parse::<Digest>()
            .ok()
            .filter(|a| *a != want.digest)
            .map(|actual| VerifyError::WrongDigest {
                expected: want.digest,
                actual,
            }),
        _ => None,
    }
}

fn describe(registry: &str, want: &Want, e: OciDistributionError) -> StoreError {
    let what = if want.is_manifest { "manifest" } else { "blob" };
    match e {
        OciDistributionError::DigestError(d) => match as_verify(want, &d) {
            Some(v) => StoreError::Verify(v),
            None => StoreError::Source(format!(
                "registry {registry}: {what} {} does not match its digest: {d}",
                want.digest
            )),
        },
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_) => StoreError::Source(format!(
            "registry {registry}: not authorized to pull {what} {} (check the credentials in Docker's config.json): {e}",
            want.digest
        )),
        other => registry_err(registry, format!("{what} {}: {other}", want.digest)),
    }
}

/// The keys a registry's credentials may be stored under in `config.json`.
fn config_keys(registry: &str) -> Vec<String> {
    if registry == DEFAULT_REGISTRY {
        vec![
            "https://index.docker.io/v1/".into(),
            "index.docker.io".into(),
            "docker.io".into(),
            "registry-1.docker.io".into(),
        ]
    } else {
        vec![registry.to_string()]
    }
}

/// `https://host:port/v1/` as `host:port`.
fn key_host(key: &str) -> &str {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key)
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct DockerConfig {
    #[serde(default)]
    auths: std::collections::HashMap<String, AuthEntry>,
    #[serde(default)]
    cred_helpers: std::collections::HashMap<String, String>,
    #[serde(default)]
    creds_store: Option<String>,
}

#[derive(serde::Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
    #[serde(default)]
    registrytoken: Option<String>,
}

/// The credentials for `registry` from Docker's `config.json`.
pub fn credentials(registry: &str, opts: &PullOptions) -> Result<RegistryAuth, StoreError> {
    let Some(dir) = opts.config_dir() else {
        return Ok(RegistryAuth::Anonymous);
    };
    let path = dir.join("config.json");
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(RegistryAuth::Anonymous),
        Err(e) => return Err(io_err(format!("read {}", path.display()))(e)),
    };
    let config: DockerConfig = serde_json::from_slice(&bytes)
        .map_err(|e| StoreError::Source(format!("{}: {e}", path.display())))?;
    let keys = config_keys(registry);
    let matches = |k: &String| keys.iter().any(|x| x == k || key_host(x) == key_host(k));
    let helper = config
        .cred_helpers
        .iter()
        .find(|(k, _)| matches(k))
        .map(|(_, v)| v.clone())
        .or_else(|| config.creds_store.clone());
    if let Some(helper) = helper
        && let Some(auth) = from_helper(&helper, registry, opts)?
    {
        return Ok(auth);
    }
    let Some((_, entry)) = config.auths.iter().find(|(k, _)| matches(k)) else {
        return Ok(RegistryAuth::Anonymous);
    };
    if entry
        .identitytoken
        .as_deref()
        .is_some_and(|t| !t.is_empty())
    {
        return Err(StoreError::Source(format!(
            "{}: the entry for {registry} holds an identity token, which is not supported; log in with a username and password",
            path.display()
        )));
    }
    if let Some(token) = entry.registrytoken.as_deref().filter(|t| !t.is_empty()) {
        return Ok(RegistryAuth::Bearer(token.to_string()));
    }
    if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|e| {
                StoreError::Source(format!(
                    "{}: the auth of {registry} is not base64: {e}",
                    path.display()
                ))
            })?;
        let text = String::from_utf8(decoded).map_err(|_| {
            StoreError::Source(format!(
                "{}: the auth of {registry} is not UTF-8",
                path.display()
            ))
        })?;
        let Some((user, pass)) = text.split_once(':') else {
            return Err(StoreError::Source(format!(
                "{}: the auth of {registry} is not user:password",
                path.display()
            )));
        };
        return Ok(RegistryAuth::Basic(user.to_string(), pass.to_string()));
    }
    if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
        return Ok(RegistryAuth::Basic(u.clone(), p.clone()));
    }
    Ok(RegistryAuth::Anonymous)
}

fn find_helper(name: &str, path: Option<&OsString>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let search = path.cloned().or_else(|| std::env::var_os("PATH"))?;
    std::env::split_paths(&search)
        .map(|d| d.join(format!("docker-credential-{name}")))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Ask `docker-credential-NAME get`; `None` when it has no credentials.
fn from_helper(
    name: &str,
    registry: &str,
    opts: &PullOptions,
) -> Result<Option<RegistryAuth>, StoreError> {
    if name.is_empty() || name.contains('/') {
        return Err(StoreError::Source(format!(
            "credential helper `{name}` is not a helper name"
        )));
    }
    let Some(program) = find_helper(name, opts.helper_path.as_ref()) else {
        return Err(StoreError::Source(format!(
            "credential helper docker-credential-{name} (for {registry}) is not on the PATH"
        )));
    };
    let server = if registry == DEFAULT_REGISTRY {
        "https://index.docker.io/v1/".to_string()
    } else {
        registry.to_string()
    };
    let output = run_helper(&program, &server)?;
    if !output.status.success() {
        let text = String::from_utf8_lossy(&output.stdout);
        if text.contains("credentials not found") {
            return Ok(None);
        }
        return Err(StoreError::Source(format!(
            "credential helper {} failed for {registry}: {} {}",
            program.display(),
            text.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Reply {
        username: String,
        secret: String,
    }
    let reply: Reply = serde_json::from_slice(&output.stdout).map_err(|e| {
        StoreError::Source(format!(
            "credential helper {} gave an unreadable answer for {registry}: {e}",
            program.display()
        ))
    })?;
    if reply.username == "<token>" {
        return Err(StoreError::Source(format!(
            "credential helper {} gave an identity token for {registry}, which is not supported",
            program.display()
        )));
    }
    Ok(Some(RegistryAuth::Basic(reply.username, reply.secret)))
}

fn run_helper(program: &Path, server: &str) -> Result<std::process::Output, StoreError> {
    let what = || format!("run {} get", program.display());
    let mut child = Command::new(program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err(what()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(server.as_bytes()).map_err(io_err(what()))?;
    }
    child.wait_with_output().map_err(io_err(what()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_insecure() {
        for r in [
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:80",
            "localhost",
        ] {
            assert!(is_loopback(r), "{r}");
        }
        for r in ["registry.internal", "10.0.0.1:5000", "localhost.evil.com"] {
            assert!(!is_loopback(r), "{r}");
        }
        let o = PullOptions {
            insecure: vec!["reg.lan:5000".into(), "other.lan".into()],
            ..PullOptions::default()
        };
        assert!(o.allows_plain_http("reg.lan:5000"));
        assert!(!o.allows_plain_http("reg.lan:5001"));
        assert!(o.allows_plain_http("other.lan:443"));
        assert!(!o.allows_plain_http("docker.io"));
    }

    #[test]
    fn config_json_auths() {
        let dir = tempfile::tempdir().unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        std::fs::write(
            dir.path().join("config.json"),
            format!(
                r#"{{"auths": {{"https://reg.example:5000/v1/": {{"auth": "{b64}"}},
                               "https://index.docker.io/v1/": {{"auth": "{b64}"}}}}}}"#
            ),
        )
        .unwrap();
        let o = PullOptions {
            docker_config: Some(dir.path().to_path_buf()),
            helper_path: Some(OsString::new()),
            ..PullOptions::default()
        };
        let a = credentials("reg.example:5000", &o).unwrap();
        assert!(matches!(a, RegistryAuth::Basic(u, p) if u == "alice" && p == "s3cret"));
        assert!(matches!(
            credentials("docker.io", &o).unwrap(),
            RegistryAuth::Basic(..)
        ));
        assert!(matches!(
            credentials("elsewhere", &o).unwrap(),
            RegistryAuth::Anonymous
        ));
    }
}
