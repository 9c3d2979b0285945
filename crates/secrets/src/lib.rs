//! cordon-secrets: the credential broker.
//!
//! A tool's manifest declares the secrets it needs (`name`, `scope`, `ttl`,
//! and optionally `provider`, `audience`, `deliver`, `bind`); the broker's
//! provider file ([`config`]) says how each provider mints. For every
//! session of a tool (one call of a command tool; one sandbox of an `mcp:`
//! server in a `cordon serve` session) [`CredentialBroker::mint`] mints each
//! secret and returns a [`Lease`]:
//!
//! - `deliver: proxy`: the sandbox's variable holds a placeholder
//!   (`cordon-ph-` and 128 random bits from the OS), unique per session and
//!   secret; the egress doors get an [`Injection`] whose [`TokenSource`] is
//!   the lease's current token, which the door asks at every use;
//! - `deliver: env`: the token itself is in that one variable.
//!
//! A lease re-mints each token before it expires (at 80% of its life; the
//! old one is then revoked), and revokes and zeroises them all when it is
//! dropped or revoked: at the session's end, and at broker shutdown
//! ([`CredentialBroker::revoke_all`], also on SIGTERM). A SIGKILLed
//! broker's tokens expire by their ttl.
//!
//! Tokens are `Zeroizing<String>`, never `Debug`/`Display`-printed, never
//! in messages, events, argv or any environment but the one `deliver: env`
//! names, and never written to disk.
#![forbid(unsafe_code)]

pub mod config;
mod oauth2;
pub mod provider;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use cordon_egress::{Binding, Injection, Injections, Placement, TokenSource};
use cordon_policy::ToolPolicy;
use cordon_policy::policy::{self, Deliver};
use cordon_runtime::Credentials;
use zeroize::Zeroizing;

pub use config::{ConfigError, Kind, ProviderFile};
pub use provider::{MintRequest, Minted, Provider, Revoked};

/// The placeholders' recognisable prefix.
pub const PLACEHOLDER_PREFIX: &str = "cordon-ph-";

/// A fresh placeholder: the prefix and 128 bits from the OS's random
/// number generator, in hex.
pub fn placeholder() -> Result<String, String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| format!("the OS random number generator failed: {e}"))?;
    Ok(format!("{PLACEHOLDER_PREFIX}{}", hex::encode(b)))
}

/// What happened to one secret of a session (for the audit log). Never
/// carries a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Minted at the session's start.
    Minted,
    /// Minted again before the previous token expired.
    Reminted,
    /// Minting failed (the session is refused, or a re-mint will be retried
    /// until the token expires).
    MintFailed,
    /// Revoked at the provider and zeroised.
    Revoked,
    /// Zeroised; the provider has no revocation, so it expires by its ttl.
    Expiring,
    /// The provider refused or failed the revocation; zeroised here.
    RevokeFailed,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Minted => "mint",
            EventKind::Reminted => "remint",
            EventKind::MintFailed => "mint_failed",
            EventKind::Revoked => "revoke",
            EventKind::Expiring => "revoke_not_offered",
            EventKind::RevokeFailed => "revoke_failed",
        }
    }
}

/// One credential event.
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: EventKind,
    pub tool: String,
    pub session: String,
    /// The secret's variable name.
    pub secret: String,
    pub provider: String,
    pub scope: String,
    pub ttl_seconds: u64,
    pub audience: Option<String>,
    pub deliver: Deliver,
    /// When the token expires (mints).
    pub expires_at: Option<SystemTime>,
    /// Why (failures; revocation's occasion).
    pub reason: Option<String>,
}

/// Where credential events go. `Err(why)` when the event could not be
/// recorded: a mint whose record cannot be written is revoked and the
/// session refused (fail-closed, like a call's own record).
pub type EventSink = Arc<dyn Fn(&Event) -> Result<(), String> + Send + Sync>;

/// The broker: the providers of one provider file, the live leases, and
/// where events go.
pub struct CredentialBroker {
    file: ProviderFile,
    providers: BTreeMap<String, Arc<dyn Provider>>,
    events: Mutex<Option<EventSink>>,
    live: Mutex<Vec<Weak<LeaseInner>>>,
}

impl std::fmt::Debug for CredentialBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialBroker")
            .field("path", &self.file.path)
            .field("providers", &self.providers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The provider a spec describes.
fn build(name: &str, spec: &config::ProviderSpec) -> Result<Box<dyn Provider>, String> {
    let timeout = Duration::from_secs(spec.timeout_seconds.unwrap_or(10));
    Ok(match spec.kind {
        Kind::Exec => provider::exec(name, spec, timeout),
        Kind::Static => provider::fixed(name, spec),
        Kind::Oauth2 => Box::new(oauth2::OAuth2::new(name, spec, timeout)?),
    })
}

impl CredentialBroker {
    /// The broker of a loaded provider file.
    pub fn new(file: ProviderFile) -> Result<CredentialBroker, ConfigError> {
        let mut providers = BTreeMap::new();
        for (name, (spec, line, column)) in &file.providers {
            let p = build(name, spec).map_err(|m| ConfigError {
                path: file.path.clone(),
                line: *line,
                column: *column,
                message: format!("provider `{name}`: {m}"),
            })?;
            providers.insert(name.clone(), Arc::from(p));
        }
        Ok(CredentialBroker {
            file,
            providers,
            events: Mutex::new(None),
            live: Mutex::new(Vec::new()),
        })
    }

    /// The broker of the provider file [`config::discover`] finds
    /// (`Ok(None)`: none configured).
    pub fn discover(explicit: Option<&Path>) -> Result<Option<CredentialBroker>, ConfigError> {
        match config::discover(explicit)? {
            None => Ok(None),
            Some(f) => CredentialBroker::new(f).map(Some),
        }
    }

    /// Where the provider file was read from.
    pub fn path(&self) -> &Path {
        &self.file.path
    }

    /// The default provider's name.
    pub fn default_provider(&self) -> Option<&str> {
        self.file.default.as_deref()
    }

    /// Every provider: name and kind.
    pub fn providers(&self) -> Vec<(String, Kind)> {
        self.providers
            .iter()
            .map(|(n, p)| (n.clone(), p.kind()))
            .collect()
    }

    /// Send every event to `sink` (the audit log).
    pub fn on_event(&self, sink: EventSink) {
        if let Ok(mut e) = self.events.lock() {
            *e = Some(sink);
        }
    }

    /// Record one event. `Err` when it cannot be: no sink set, or the
    /// sink's lock poisoned (never `Ok` for an event nobody recorded).
    fn emit(&self, e: Event) -> Result<(), String> {
        let sink = self
            .events
            .lock()
            .map_err(|_| "the credential event sink's lock is poisoned".to_string())?
            .clone();
        match sink {
            Some(s) => s(&e),
            None => Err("no sink is set for credential events (the audit log)".to_string()),
        }
    }

    /// A mint failure `why`, with the failure to record it added (and
    /// logged) when its record could not be written.
    fn mint_failed(&self, recorded: Result<(), String>, why: String) -> String {
        match recorded {
            Ok(()) => why,
            Err(e) => {
                tracing::error!("the audit record of a failed mint was not written: {e}: {why}");
                format!("{why} (and its audit record could not be written: {e})")
            }
        }
    }

    /// The provider a secret is minted by: its own, else the default.
    pub fn provider_of(&self, s: &policy::Secret) -> Result<(String, Kind), String> {
        let name = match (&s.provider, &self.file.default) {
            (Some(p), _) => p.clone(),
            (None, Some(d)) => d.clone(),
            (None, None) => {
                return Err(format!(
                    "secret `{}` names no provider and {} has no `default`",
                    s.name,
                    self.file.path.display()
                ));
            }
        };
        match self.providers.get(&name) {
            Some(p) => Ok((name, p.kind())),
            None => Err(format!(
                "secret `{}`: provider `{name}` is not defined in {} (it has: {})",
                s.name,
                self.file.path.display(),
                self.providers
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// Mint every secret of `tool` for `session`. On any failure, what was
    /// minted is revoked and the session is refused.
    pub fn mint(self: &Arc<Self>, tool: &ToolPolicy, session: &str) -> Result<Lease, String> {
        let mut slots = Vec::new();
        let inner_slots = |slots: Vec<Slot>| {
            Arc::new(LeaseInner {
                broker: Arc::downgrade(self),
                tool: tool.name.clone(),
                session: session.to_string(),
                slots,
                ctl: Mutex::new(Ctl::default()),
                wake: Condvar::new(),
                thread: Mutex::new(None),
                unrecorded: Mutex::new(Vec::new()),
            })
        };
        for s in &tool.secrets {
            let provider_name = match self.provider_of(s) {
                Ok((n, _)) => n,
                Err(m) => {
                    let why = format!("{}: {m}", tool.name);
                    let recorded = self.emit(self.event(
                        EventKind::MintFailed,
                        tool,
                        session,
                        s,
                        "",
                        None,
                        Some(&why),
                    ));
                    let why = self.mint_failed(recorded, why);
                    return Err(revoked_too(
                        why,
                        inner_slots(slots).revoke("a mint of the session failed"),
                    ));
                }
            };
            let Some(p) = self.providers.get(&provider_name).cloned() else {
                return Err(format!(
                    "{}: provider `{provider_name}` vanished",
                    tool.name
                ));
            };
            let req = MintRequest {
                tool: tool.name.clone(),
                session: session.to_string(),
                scope: s.scope.clone(),
                ttl: s.ttl_seconds,
                audience: s.audience.clone(),
            };
            let minted = p.mint(&req).and_then(|m| {
                if m.expires_at <= SystemTime::now() {
                    Err(format!(
                        "provider {provider_name}: the token has already expired"
                    ))
                } else {
                    Ok(m)
                }
            });
            match minted {
                Ok(m) => {
                    let ph = match placeholder() {
                        Ok(ph) => ph,
                        Err(e) => {
                            let mut why = format!("{}: {e}", tool.name);
                            if let Err(r) = p.revoke(&m.token) {
                                tracing::error!(
                                    "{why}; revoking the token just minted failed: {r}"
                                );
                                why = format!("{why}; revoking the token just minted failed: {r}");
                            }
                            return Err(revoked_too(
                                why,
                                inner_slots(slots).revoke("a mint of the session failed"),
                            ));
                        }
                    };
                    let recorded = self.emit(self.event(
                        EventKind::Minted,
                        tool,
                        session,
                        s,
                        &provider_name,
                        Some(m.expires_at),
                        None,
                    ));
                    slots.push(Slot::new(s.clone(), provider_name, p, ph, m));
                    if let Err(e) = recorded {
                        let why = format!(
                            "{}: secret {}: the audit record of its mint could not be written ({e}); refusing",
                            tool.name, s.name
                        );
                        tracing::error!("{why}");
                        return Err(revoked_too(
                            why,
                            inner_slots(slots).revoke("the mint could not be audited"),
                        ));
                    }
                }
                Err(m) => {
                    let why = format!("{}: secret {}: {m}", tool.name, s.name);
                    let recorded = self.emit(self.event(
                        EventKind::MintFailed,
                        tool,
                        session,
                        s,
                        &provider_name,
                        None,
                        Some(&why),
                    ));
                    let why = self.mint_failed(recorded, why);
                    return Err(revoked_too(
                        why,
                        inner_slots(slots).revoke("a mint of the session failed"),
                    ));
                }
            }
        }
        let inner = inner_slots(slots);
        if let Ok(mut live) = self.live.lock() {
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(&inner));
        }
        if !inner.slots.is_empty() {
            let i = inner.clone();
            let t = std::thread::Builder::new()
                .name(format!("remint-{}", tool.name))
                .spawn(move || i.remint_loop())
                .map_err(|e| format!("{}: the re-mint thread: {e}", tool.name));
            match t {
                Ok(t) => {
                    if let Ok(mut th) = inner.thread.lock() {
                        *th = Some(t);
                    }
                }
                Err(e) => {
                    return Err(revoked_too(e, inner.revoke("the session could not start")));
                }
            }
        }
        Ok(Lease { inner })
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &self,
        kind: EventKind,
        tool: &ToolPolicy,
        session: &str,
        s: &policy::Secret,
        provider: &str,
        expires_at: Option<SystemTime>,
        reason: Option<&str>,
    ) -> Event {
        Event {
            kind,
            tool: tool.name.clone(),
            session: session.to_string(),
            secret: s.name.clone(),
            provider: provider.to_string(),
            scope: s.scope.clone(),
            ttl_seconds: s.ttl_seconds,
            audience: s.audience.clone(),
            deliver: s.deliver,
            expires_at,
            reason: reason.map(str::to_string),
        }
    }

    /// Revoke every live lease (broker shutdown, SIGTERM). Every token is
    /// revoked and zeroised; `Err` says which records of it could not be
    /// written.
    pub fn revoke_all(&self, why: &str) -> Result<(), String> {
        let live: Vec<Arc<LeaseInner>> = {
            let mut l = self.live.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut *l)
        }
        .into_iter()
        .filter_map(|w| w.upgrade())
        .collect();
        let mut failed = Vec::new();
        for l in live {
            if let Err(e) = l.revoke(why) {
                failed.push(e);
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; "))
        }
    }

    /// How many leases are live.
    pub fn live(&self) -> usize {
        self.live
            .lock()
            .map(|l| {
                l.iter()
                    .filter_map(|w| w.upgrade())
                    .filter(|i| !i.is_revoked())
                    .count()
            })
            .unwrap_or(0)
    }
}

impl cordon_runtime::Minting for CredentialBroker {
    fn can_mint(&self, tool: &ToolPolicy) -> Result<(), String> {
        for s in &tool.secrets {
            self.provider_of(s)
                .map_err(|m| format!("{}: {m}", tool.name))?;
        }
        Ok(())
    }
}

/// One secret's state in a lease.
struct Slot {
    secret: policy::Secret,
    provider_name: String,
    provider: Arc<dyn Provider>,
    placeholder: String,
    state: Mutex<SlotState>,
}

struct SlotState {
    /// `None` once revoked.
    token: Option<Zeroizing<String>>,
    expires_at: SystemTime,
    /// When to re-mint.
    refresh_at: Instant,
}

/// 80% of the way from now to `expires_at`.
fn refresh_at(expires_at: SystemTime) -> Instant {
    let left = expires_at
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    Instant::now() + left.mul_f64(0.8)
}

impl Slot {
    fn new(
        secret: policy::Secret,
        provider_name: String,
        provider: Arc<dyn Provider>,
        placeholder: String,
        m: Minted,
    ) -> Slot {
        Slot {
            secret,
            provider_name,
            provider,
            placeholder,
            state: Mutex::new(SlotState {
                refresh_at: refresh_at(m.expires_at),
                expires_at: m.expires_at,
                token: Some(m.token),
            }),
        }
    }
}

#[derive(Default)]
struct Ctl {
    revoked: bool,
}

struct LeaseInner {
    broker: Weak<CredentialBroker>,
    tool: String,
    session: String,
    slots: Vec<Slot>,
    ctl: Mutex<Ctl>,
    wake: Condvar,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Events of this lease whose records could not be written, said by
    /// the next [`LeaseInner::revoke`].
    unrecorded: Mutex<Vec<String>>,
}

/// `why`, with what could not be recorded of the revocation that followed.
fn revoked_too(why: String, revoked: Result<(), String>) -> String {
    match revoked {
        Ok(()) => why,
        Err(e) => format!("{why}; {e}"),
    }
}

impl LeaseInner {
    fn is_revoked(&self) -> bool {
        self.ctl.lock().map(|c| c.revoked).unwrap_or(true)
    }

    fn emit(
        &self,
        kind: EventKind,
        slot: &Slot,
        expires_at: Option<SystemTime>,
        reason: Option<String>,
    ) {
        // Re-mint and revocation records that cannot be written are logged
        // and said by the next revocation; the token's fate does not wait
        // on them.
        let recorded = match self.broker.upgrade() {
            Some(b) => b.emit(Event {
                kind,
                tool: self.tool.clone(),
                session: self.session.clone(),
                secret: slot.secret.name.clone(),
                provider: slot.provider_name.clone(),
                scope: slot.secret.scope.clone(),
                ttl_seconds: slot.secret.ttl_seconds,
                audience: slot.secret.audience.clone(),
                deliver: slot.secret.deliver,
                expires_at,
                reason,
            }),
            None => Err("the credential broker is gone".to_string()),
        };
        if let Err(e) = recorded {
            let what = format!(
                "the audit record of the credential {} of secret {} ({}, session {}) was not written: {e}",
                kind.as_str(),
                slot.secret.name,
                self.tool,
                self.session
            );
            tracing::error!("{what}");
            self.unrecorded
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(what);
        }
    }

    /// Re-mint each token at 80% of its life until revoked. A failed
    /// re-mint is retried (at most every second) while the old token lasts.
    fn remint_loop(&self) {
        loop {
            let next = self
                .slots
                .iter()
                .filter_map(|s| s.state.lock().ok().map(|st| st.refresh_at))
                .min();
            let Some(next) = next else { return };
            {
                let Ok(mut ctl) = self.ctl.lock() else { return };
                loop {
                    if ctl.revoked {
                        return;
                    }
                    let now = Instant::now();
                    if now >= next {
                        break;
                    }
                    ctl = match self.wake.wait_timeout(ctl, next - now) {
                        Ok((c, _)) => c,
                        Err(_) => return,
                    };
                }
            }
            for slot in &self.slots {
                let due = slot
                    .state
                    .lock()
                    .map(|st| st.token.is_some() && st.refresh_at <= Instant::now())
                    .unwrap_or(false);
                if due {
                    self.remint(slot);
                }
            }
        }
    }

    fn remint(&self, slot: &Slot) {
        let req = MintRequest {
            tool: self.tool.clone(),
            session: self.session.clone(),
            scope: slot.secret.scope.clone(),
            ttl: slot.secret.ttl_seconds,
            audience: slot.secret.audience.clone(),
        };
        let minted = slot.provider.mint(&req).and_then(|m| {
            if m.expires_at > SystemTime::now() {
                Ok(m)
            } else {
                Err("the new token had already expired".to_string())
            }
        });
        match minted {
            Ok(m) => {
                let expires_at = m.expires_at;
                let old = {
                    let Ok(mut st) = slot.state.lock() else {
                        return;
                    };
                    if st.token.is_none() || self.is_revoked() {
                        // Revoked meanwhile: the new token goes too.
                        drop(st);
                        self.revoke_token(slot, m.token, "revoked while it was re-minted");
                        return;
                    }
                    st.expires_at = m.expires_at;
                    st.refresh_at = refresh_at(m.expires_at);
                    st.token.replace(m.token)
                };
                self.emit(EventKind::Reminted, slot, Some(expires_at), None);
                if let Some(old) = old {
                    self.revoke_token(slot, old, "replaced by a re-mint");
                }
            }
            Err(why) => {
                self.emit(
                    EventKind::MintFailed,
                    slot,
                    None,
                    Some(format!(
                        "{}: secret {}: re-mint: {why}",
                        self.tool, slot.secret.name
                    )),
                );
                if let Ok(mut st) = slot.state.lock() {
                    st.refresh_at = Instant::now() + Duration::from_secs(1);
                }
            }
        }
    }

    fn revoke_token(&self, slot: &Slot, token: Zeroizing<String>, why: &str) {
        match slot.provider.revoke(&token) {
            Ok(Revoked::Done) => self.emit(EventKind::Revoked, slot, None, Some(why.into())),
            Ok(Revoked::NotOffered) => self.emit(
                EventKind::Expiring,
                slot,
                None,
                Some(format!(
                    "{why}; the provider has no revocation, the token expires by its ttl"
                )),
            ),
            Err(e) => self.emit(
                EventKind::RevokeFailed,
                slot,
                None,
                Some(format!("{why}: {e}")),
            ),
        }
        drop(token);
    }

    /// Revoke every token (idempotent); they are zeroised here whatever
    /// the provider answers, and whatever lock a panic poisoned. `Err`
    /// lists the events of this lease whose records could not be written.
    fn revoke(&self, why: &str) -> Result<(), String> {
        let first = {
            let mut ctl = self.ctl.lock().unwrap_or_else(|p| p.into_inner());
            !std::mem::replace(&mut ctl.revoked, true)
        };
        if first {
            self.wake.notify_all();
            let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(t) = t
                && t.thread().id() != std::thread::current().id()
                && t.join().is_err()
            {
                tracing::error!("the re-mint thread of {} panicked", self.tool);
            }
            for slot in &self.slots {
                let tok = slot
                    .state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .token
                    .take();
                if let Some(tok) = tok {
                    self.revoke_token(slot, tok, why);
                }
            }
        }
        let unrecorded =
            std::mem::take(&mut *self.unrecorded.lock().unwrap_or_else(|p| p.into_inner()));
        if unrecorded.is_empty() {
            Ok(())
        } else {
            Err(unrecorded.join("; "))
        }
    }
}

/// The current token of one secret of one lease.
struct SlotSource {
    lease: Arc<LeaseInner>,
    index: usize,
}

impl TokenSource for SlotSource {
    fn current(&self) -> Result<Zeroizing<String>, String> {
        let slot = &self.lease.slots[self.index];
        let st = slot
            .state
            .lock()
            .map_err(|_| format!("secret {}: its state is poisoned", slot.secret.name))?;
        match &st.token {
            None => Err(format!(
                "secret {} of session {} was revoked",
                slot.secret.name, self.lease.session
            )),
            Some(_) if st.expires_at <= SystemTime::now() => Err(format!(
                "secret {} of session {} expired and was not re-minted",
                slot.secret.name, self.lease.session
            )),
            Some(t) => Ok(t.clone()),
        }
    }
}

/// The credentials of one session of one tool. Dropping it revokes them.
pub struct Lease {
    inner: Arc<LeaseInner>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("tool", &self.inner.tool)
            .field("session", &self.inner.session)
            .field(
                "secrets",
                &self
                    .inner
                    .slots
                    .iter()
                    .map(|s| &s.secret.name)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Lease {
    /// What the sandbox gets: each variable (placeholder or, for `deliver:
    /// env`, the token) and the doors' injections.
    pub fn credentials(&self) -> Result<Credentials, String> {
        let mut env = Vec::new();
        let mut injections = Vec::new();
        for (i, slot) in self.inner.slots.iter().enumerate() {
            match slot.secret.deliver {
                Deliver::Env => {
                    let src = SlotSource {
                        lease: self.inner.clone(),
                        index: i,
                    };
                    env.push((slot.secret.name.clone(), src.current()?));
                }
                Deliver::Proxy => {
                    let b = slot.secret.bind.as_ref().ok_or_else(|| {
                        format!(
                            "{}: secret {} is delivered by the proxy but bound to nothing",
                            self.inner.tool, slot.secret.name
                        )
                    })?;
                    env.push((
                        slot.secret.name.clone(),
                        Zeroizing::new(slot.placeholder.clone()),
                    ));
                    injections.push(Injection {
                        secret: slot.secret.name.clone(),
                        placeholder: slot.placeholder.clone(),
                        binding: Binding {
                            host: b.host.clone(),
                            port: b.port,
                            path_prefix: b.path.clone(),
                            upstream_ca: None,
                            placement: match &b.placement {
                                policy::Placement::Header { name, template } => Placement::Header {
                                    name: name.clone(),
                                    template: template.clone(),
                                },
                                policy::Placement::Basic { username } => Placement::Basic {
                                    username: username.clone(),
                                },
                                policy::Placement::Query { param } => Placement::Query {
                                    param: param.clone(),
                                },
                            },
                        },
                        source: Arc::new(SlotSource {
                            lease: self.inner.clone(),
                            index: i,
                        }),
                    });
                }
            }
        }
        Ok(Credentials {
            env,
            injections: Injections::new(injections),
        })
    }

    /// Each secret's current token with the session's placeholder for it
    /// (the one the sandbox sees for `deliver: proxy`; for `deliver: env`
    /// the one the output gate puts in its place): what the output gate
    /// replaces. A revoked secret has none. Never printed.
    pub fn live_tokens(&self) -> Vec<(String, Zeroizing<String>, String)> {
        self.inner
            .slots
            .iter()
            .filter_map(|slot| {
                let st = slot.state.lock().unwrap_or_else(|p| p.into_inner());
                st.token.as_ref().map(|t| {
                    (
                        slot.secret.name.clone(),
                        t.clone(),
                        slot.placeholder.clone(),
                    )
                })
            })
            .collect()
    }

    /// The current token of secret `name` (what the door substitutes).
    pub fn source(&self, name: &str) -> Option<Arc<dyn TokenSource>> {
        let index = self
            .inner
            .slots
            .iter()
            .position(|s| s.secret.name == name)?;
        Some(Arc::new(SlotSource {
            lease: self.inner.clone(),
            index,
        }))
    }

    /// Revoke and zeroise every token now (idempotent). `Err` lists the
    /// credential events of this lease whose audit records could not be
    /// written (the tokens are revoked all the same).
    pub fn revoke(&self, why: &str) -> Result<(), String> {
        self.inner.revoke(why)
    }

    /// The session.
    pub fn session(&self) -> &str {
        &self.inner.session
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Nobody to tell here: what could not be recorded was logged.
        if let Err(e) = self.inner.revoke("session end") {
            tracing::error!("session {} ended: {e}", self.inner.session);
        }
    }
}

/// Where a provider file was found, for `cordon doctor`.
pub fn describe_source(explicit: Option<&Path>) -> (PathBuf, &'static str) {
    if let Some(p) = explicit {
        return (p.to_path_buf(), "--providers");
    }
    if let Some(p) = std::env::var_os(config::ENV).filter(|v| !v.is_empty()) {
        return (PathBuf::from(p), "$CORDON_PROVIDERS");
    }
    (PathBuf::from(config::DEFAULT_PATH), "default path")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn broker(dir: &Path) -> Arc<CredentialBroker> {
        let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let p = dir.join("providers.yaml");
        std::fs::write(
            &p,
            format!(
                "default: mint\nproviders:\n  mint:\n    type: exec\n    command: [\"{}\", \"{}\"]\n    revoke: [\"{}\", \"{}\"]\n",
                fx.join("mint.py").display(),
                dir.display(),
                fx.join("revoke.py").display(),
                dir.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        Arc::new(CredentialBroker::new(config::load(&p).unwrap()).unwrap())
    }

    fn tool() -> ToolPolicy {
        let y = "tools:\n  api:\n    profile: P2\n    command: [/bin/true]\n    egress: [\"api.example:443\"]\n    secrets:\n      - {name: API_TOKEN, scope: s, ttl: 60}\n";
        cordon_policy::load_str(Path::new("m.yaml"), y)
            .unwrap()
            .policy
            .tools["api"]
            .clone()
    }

    fn lines(p: &Path) -> Vec<String> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// A poisoned sink lock records nothing: the mint is refused and the
    /// token it made revoked.
    #[test]
    fn a_poisoned_event_lock_refuses_the_mint_and_revokes() {
        let d = tempfile::tempdir().unwrap();
        let b = broker(d.path());
        b.on_event(Arc::new(|_| Ok(())));
        // Positive control.
        assert!(b.mint(&tool(), "s").is_ok());
        let b2 = b.clone();
        let _ = std::thread::spawn(move || {
            let _g = b2.events.lock().unwrap();
            panic!("poison the sink's lock");
        })
        .join();
        assert!(b.events.is_poisoned());
        let err = b.mint(&tool(), "s").unwrap_err();
        assert!(
            err.contains("audit record of its mint could not be written")
                && err.contains("lock is poisoned"),
            "{err}"
        );
        let minted = lines(&d.path().join("minted"));
        assert_eq!(minted.len(), 2);
        assert!(lines(&d.path().join("revoked")).contains(&minted[1]));
    }

    /// A poisoned lease lock does not skip the revocation.
    #[test]
    fn revoke_goes_through_a_poisoned_lock() {
        let d = tempfile::tempdir().unwrap();
        let b = broker(d.path());
        b.on_event(Arc::new(|_| Ok(())));
        let lease = b.mint(&tool(), "s").unwrap();
        let inner = lease.inner.clone();
        let _ = std::thread::spawn(move || {
            let _g = inner.ctl.lock().unwrap();
            panic!("poison the lease's lock");
        })
        .join();
        assert!(lease.inner.ctl.is_poisoned());
        lease.revoke("test").unwrap();
        let minted = lines(&d.path().join("minted"));
        assert_eq!(lines(&d.path().join("revoked")), minted);
        assert!(lease.source("API_TOKEN").unwrap().current().is_err());
    }
}
