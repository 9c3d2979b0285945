//! Providers: what mints (and revokes) a token for one tool, session,
//! scope and lifetime. A token is a `Zeroizing<String>` from the moment it
//! is read; no error message ever contains one (nor a provider's output,
//! which might).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use zeroize::Zeroizing;

use crate::config::{ClientAuth, Grant, Kind, ProviderSpec, read_private};

/// What a token is asked for.
#[derive(Debug, Clone, Serialize)]
pub struct MintRequest {
    pub tool: String,
    pub session: String,
    pub scope: String,
    /// Seconds.
    pub ttl: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
}

/// A minted token and when it stops being valid.
pub struct Minted {
    pub token: Zeroizing<String>,
    pub expires_at: SystemTime,
}

impl std::fmt::Debug for Minted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minted")
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// What revocation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoked {
    /// The provider revoked it.
    Done,
    /// The provider has no revocation: the token lives until it expires.
    NotOffered,
}

/// A source of tokens.
pub trait Provider: Send + Sync {
    /// `exec`, `oauth2` or `static`.
    fn kind(&self) -> Kind;
    /// A token for `req`.
    fn mint(&self, req: &MintRequest) -> Result<Minted, String>;
    /// Revoke `token`.
    fn revoke(&self, token: &Zeroizing<String>) -> Result<Revoked, String>;
}

/// The `exec` provider a spec describes.
pub(crate) fn exec(name: &str, spec: &ProviderSpec, timeout: Duration) -> Box<dyn Provider> {
    Box::new(Exec {
        name: name.to_string(),
        command: spec.command.clone().unwrap_or_default(),
        revoke: spec.revoke.clone(),
        timeout,
    })
}

/// The `static` provider a spec describes.
pub(crate) fn fixed(name: &str, spec: &ProviderSpec) -> Box<dyn Provider> {
    Box::new(Static {
        name: name.to_string(),
        file: spec.file.clone(),
        env: spec.env.clone(),
    })
}

/// Never later than `now + ttl`: the manifest's lifetime bounds how long
/// the broker uses a token, whatever the provider says.
pub(crate) fn clamp_expiry(expires_at: SystemTime, ttl: u64) -> SystemTime {
    let cap = SystemTime::now() + Duration::from_secs(ttl);
    expires_at.min(cap)
}

/// `expires_at` as RFC 3339 or seconds since the epoch.
fn parse_expiry(v: &serde_json::Value) -> Result<SystemTime, String> {
    match v {
        serde_json::Value::Number(n) => n
            .as_u64()
            .map(|s| UNIX_EPOCH + Duration::from_secs(s))
            .ok_or_else(|| "`expires_at` is not a whole number of seconds".to_string()),
        serde_json::Value::String(s) => {
            let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                .map_err(|_| "`expires_at` is not an RFC 3339 time".to_string())?;
            let nanos = u64::try_from(t.unix_timestamp_nanos())
                .map_err(|_| "`expires_at` is before 1970 or too far ahead".to_string())?;
            Ok(UNIX_EPOCH + Duration::from_nanos(nanos))
        }
        _ => Err("`expires_at` is neither a time nor a number".into()),
    }
}

/// `exec`: a command given the request as JSON on stdin, answering
/// `{"token": ..., "expires_at": ...}` on stdout, like AWS's
/// `credential_process`. Never run through a shell; the token is never on
/// an argument list (revocation gets it on stdin).
struct Exec {
    name: String,
    command: Vec<String>,
    revoke: Option<Vec<String>>,
    timeout: Duration,
}

/// Run `argv` with `input` on stdin; its stdout (kept zeroised), or why
/// not. Its stderr is discarded: it could echo a token.
fn run_command(
    what: &str,
    argv: &[String],
    input: &[u8],
    timeout: Duration,
) -> Result<Zeroizing<Vec<u8>>, String> {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{what}: {} cannot be started: {e}", argv[0]))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| format!("{what}: no stdin"))?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| format!("{what}: no stdout"))?;
    let input = Zeroizing::new(input.to_vec());
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let reader = std::thread::spawn(move || {
        let mut out = Zeroizing::new(Vec::new());
        let r = stdout.by_ref().take(1 << 20).read_to_end(&mut out);
        r.map(|_| out)
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = writer.join();
                let _ = reader.join();
                return Err(format!(
                    "{what}: {} did not answer within {}s; killed",
                    argv[0],
                    timeout.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("{what}: waiting for {}: {e}", argv[0])),
        }
    };
    let _ = writer.join();
    let out = reader
        .join()
        .map_err(|_| format!("{what}: reading {}'s output failed", argv[0]))?
        .map_err(|e| format!("{what}: reading {}'s output: {e}", argv[0]))?;
    if !status.success() {
        return Err(format!(
            "{what}: {} failed ({status}; its output is not shown, it may hold a secret)",
            argv[0]
        ));
    }
    Ok(out)
}

impl Provider for Exec {
    fn kind(&self) -> Kind {
        Kind::Exec
    }

    fn mint(&self, req: &MintRequest) -> Result<Minted, String> {
        let what = format!("provider {}", self.name);
        let input = serde_json::to_vec(req).map_err(|e| format!("{what}: {e}"))?;
        let out = run_command(&what, &self.command, &input, self.timeout)?;
        #[derive(serde::Deserialize)]
        struct Answer {
            token: String,
            #[serde(default)]
            expires_at: Option<serde_json::Value>,
        }
        let a: Answer = serde_json::from_slice(&out).map_err(|_| {
            format!(
                "{what}: {} did not answer one JSON object {{\"token\": ..., \"expires_at\": ...}}",
                self.command[0]
            )
        })?;
        let token = Zeroizing::new(a.token);
        if token.is_empty() || token.chars().any(|c| c.is_control()) {
            return Err(format!(
                "{what}: the token is empty or has control characters"
            ));
        }
        let expires_at = match &a.expires_at {
            None => SystemTime::now() + Duration::from_secs(req.ttl),
            Some(v) => parse_expiry(v).map_err(|m| format!("{what}: {m}"))?,
        };
        Ok(Minted {
            token,
            expires_at: clamp_expiry(expires_at, req.ttl),
        })
    }

    fn revoke(&self, token: &Zeroizing<String>) -> Result<Revoked, String> {
        let Some(argv) = &self.revoke else {
            return Ok(Revoked::NotOffered);
        };
        let what = format!("provider {} revoke", self.name);
        run_command(&what, argv, token.as_bytes(), self.timeout)?;
        Ok(Revoked::Done)
    }
}

/// `static`: a fixed value from a file or the broker's environment. For
/// development: nothing about it is scoped or short-lived, and `cordon
/// check` says so.
struct Static {
    name: String,
    file: Option<PathBuf>,
    env: Option<String>,
}

impl Provider for Static {
    fn kind(&self) -> Kind {
        Kind::Static
    }

    fn mint(&self, req: &MintRequest) -> Result<Minted, String> {
        let what = format!("provider {}", self.name);
        let raw = match (&self.file, &self.env) {
            (Some(f), _) => read_private(f).map_err(|e| format!("{what}: {e}"))?,
            (None, Some(v)) => Zeroizing::new(
                std::env::var(v)
                    .map_err(|_| format!("{what}: the broker's ${v} is not set (or not UTF-8)"))?,
            ),
            (None, None) => return Err(format!("{what}: neither `file` nor `env`")),
        };
        let token = Zeroizing::new(raw.trim_end_matches(['\n', '\r']).to_string());
        if token.is_empty() || token.chars().any(|c| c.is_control()) {
            return Err(format!(
                "{what}: the value is empty or has control characters"
            ));
        }
        Ok(Minted {
            token,
            expires_at: SystemTime::now() + Duration::from_secs(req.ttl),
        })
    }

    fn revoke(&self, _token: &Zeroizing<String>) -> Result<Revoked, String> {
        Ok(Revoked::NotOffered)
    }
}

/// Whether a grant needs a subject token.
pub(crate) fn is_exchange(g: Option<Grant>) -> bool {
    g == Some(Grant::TokenExchange)
}

/// The client authentication method, default `client_secret_basic`.
pub(crate) fn client_auth(a: Option<ClientAuth>) -> ClientAuth {
    a.unwrap_or(ClientAuth::Basic)
}
