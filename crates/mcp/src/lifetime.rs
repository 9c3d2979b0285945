//! How long an HTTP session lives, and how its end is noticed.
//!
//! Every request of a session is seen here (a layer in front of rmcp's
//! streamable HTTP service): when it came, whether a call is in flight, and
//! which of its response streams (the client's `GET` SSE stream, each
//! `POST`'s SSE answer) are open. A reaper ends a session
//!
//! - **idle**: no request and no call in flight for `idle_timeout` (an open
//!   `GET` stream alone is not activity: a client that holds one and sends
//!   nothing is idle);
//! - **client gone**: a stream of it was dropped by the connection before
//!   it ended (the `GET` stream, or a `POST` not answered yet), none is
//!   open, and nothing came for `disconnect_grace`.
//!
//! A dropped connection shows when the server writes to it: the SSE
//! keep-alive comments are sent every `disconnect_grace` (at most 15 s), so
//! a killed client is noticed within about two of them plus the grace. A
//! client that simply stops sending while its connection stays up is
//! caught only by the idle timeout.
//!
//! A session has at most [`MAX_GET_STREAMS`] `GET` (SSE) streams open at
//! once: rmcp keeps every extra one as an idle "shadow" stream, so without
//! a bound one client could hold any number of connections. One more is
//! answered `429` (audited as `busy`, limit `sse_streams`). The streams
//! answering `POST`s are calls, bounded by the calls-in-flight caps.
//!
//! The reaper also sweeps rmcp's session table: a session there that this
//! layer has not seen answered is tracked from then on (after rmcp's own
//! time limit for `initialize`), so the idle timeout holds for every
//! session; one rmcp closed itself is forgotten.
//!
//! Ending a session writes a session-level audit record (status
//! `session_ended`, the reason), closes it in rmcp's session manager (its
//! [`Session`](crate::Session) is dropped, which stops every server sandbox
//! of it), and remembers its id: a later request with it is answered `404`
//! with a body that says the session expired and why.

use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

/// How many ended session ids are remembered (oldest forgotten first).
const EXPIRED_MEMORY: usize = 4096;

/// How long rmcp lets a new session take to initialize.
const INIT_ALLOWANCE: Duration =
    rmcp::transport::streamable_http_server::session::local::SessionConfig::DEFAULT_INIT_TIMEOUT;

/// `GET` (SSE) streams one session may hold open at once: its stream, and
/// room for reconnections whose old connection is not noticed gone yet.
pub(crate) const MAX_GET_STREAMS: usize = 4;

/// The header of the streamable HTTP transport that names the session.
const SESSION_HEADER: &str = "mcp-session-id";

/// What a session tells its HTTP side at `initialize`: its audit id and
/// principal, and whether its `initialize` was answered with a result (put
/// in the `initialize` request's extensions).
#[derive(Default)]
pub(crate) struct SessionLink {
    who: OnceLock<(String, crate::caller::Who)>,
    accepted: std::sync::atomic::AtomicBool,
}

impl SessionLink {
    pub(crate) fn set(&self, session: &str, who: &crate::caller::Who) {
        let _ = self.who.set((session.to_string(), who.clone()));
    }

    /// The session's `initialize` succeeded: its id may be handed out.
    pub(crate) fn accept(&self) {
        self.accepted
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn accepted(&self) -> bool {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// What is known of a session id: who opened it, while it lives and for a
/// while after it ended (as long as its end is remembered).
pub(crate) enum Known {
    /// Live; its principal once its `initialize` was answered.
    Live(Option<cordon_auth::Principal>),
    /// Ended (its 404 says why); its principal if it was known.
    Ended(Option<cordon_auth::Principal>),
    /// Never seen, or ended too long ago.
    Unknown,
}

struct Entry {
    link: Arc<SessionLink>,
    /// The principal that opened it (`None` until its `initialize` is
    /// answered).
    owner: Option<cordon_auth::Principal>,
    last_seen: Instant,
    /// `POST`s whose answer has not ended.
    inflight: usize,
    /// Response streams open.
    streams: usize,
    /// `GET` requests in flight or streaming (at most [`MAX_GET_STREAMS`]).
    gets: usize,
    /// When the last open stream was lost (dropped before it ended), and
    /// nothing came since.
    lost_at: Option<Instant>,
}

/// The ended sessions remembered: why each ended and who had opened it
/// (at most [`EXPIRED_MEMORY`], the oldest forgotten first).
#[derive(Default)]
struct Expired {
    order: VecDeque<String>,
    why: HashMap<String, (String, Option<cordon_auth::Principal>)>,
}

impl Expired {
    fn remember(&mut self, id: &str, why: String, owner: Option<cordon_auth::Principal>) {
        if self.why.insert(id.to_string(), (why, owner)).is_none() {
            self.order.push_back(id.to_string());
        }
        while self.order.len() > EXPIRED_MEMORY {
            if let Some(old) = self.order.pop_front() {
                self.why.remove(&old);
            }
        }
    }
}

/// The HTTP sessions of one [`serve_http`](crate::serve_http).
pub(crate) struct HttpSessions {
    idle: Duration,
    grace: Duration,
    manager: Arc<LocalSessionManager>,
    broker: Arc<cordon_broker::Broker>,
    live: Mutex<HashMap<String, Entry>>,
    expired: Mutex<Expired>,
}

impl HttpSessions {
    pub(crate) fn new(
        idle: Duration,
        grace: Duration,
        manager: Arc<LocalSessionManager>,
        broker: Arc<cordon_broker::Broker>,
    ) -> Arc<HttpSessions> {
        Arc::new(HttpSessions {
            idle,
            grace,
            manager,
            broker,
            live: Mutex::new(HashMap::new()),
            expired: Mutex::new(Expired::default()),
        })
    }

    /// How often the SSE streams carry a keep-alive comment: a dropped
    /// connection shows at the next write.
    pub(crate) fn keep_alive(&self) -> Duration {
        self.grace
            .clamp(Duration::from_secs(1), Duration::from_secs(15))
    }

    fn with_live<R>(&self, f: impl FnOnce(&mut HashMap<String, Entry>) -> R) -> Option<R> {
        self.live.lock().ok().map(|mut l| f(&mut l))
    }

    fn expired_reason(&self, id: &str) -> Option<String> {
        self.expired
            .lock()
            .ok()
            .and_then(|e| e.why.get(id).map(|(w, _)| w.clone()))
    }

    fn remember(&self, id: &str, why: String, owner: Option<cordon_auth::Principal>) {
        if let Ok(mut e) = self.expired.lock() {
            e.remember(id, why, owner);
        }
    }

    /// Who opened the session `id`, and whether it lives.
    pub(crate) fn known(&self, id: &str) -> Known {
        if let Some(owner) = self
            .with_live(|l| l.get(id).map(|e| e.owner.clone()))
            .flatten()
        {
            return Known::Live(owner);
        }
        match self.expired.lock() {
            Ok(e) => match e.why.get(id) {
                Some((_, owner)) => Known::Ended(owner.clone()),
                None => Known::Unknown,
            },
            Err(_) => Known::Unknown,
        }
    }

    /// How many sessions are live.
    pub(crate) fn live(&self) -> usize {
        self.with_live(|l| l.len()).unwrap_or(0)
    }

    /// How many sessions are held: live, and ended ones remembered.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let live = self.with_live(|l| l.len()).unwrap_or(0);
        let ended = self.expired.lock().map(|e| e.why.len()).unwrap_or(0);
        (live, ended)
    }

    /// A request arrived for `id`: `true` when the session is tracked.
    fn seen(&self, id: &str, post: bool) -> bool {
        self.with_live(|l| match l.get_mut(id) {
            Some(e) => {
                e.last_seen = Instant::now();
                e.lost_at = None;
                if post {
                    e.inflight += 1;
                }
                true
            }
            None => false,
        })
        .unwrap_or(false)
    }

    /// Count a `GET` of `id` (tracked), or `false` when the session has
    /// its [`MAX_GET_STREAMS`] already.
    fn get_opened(&self, id: &str) -> bool {
        self.with_live(|l| match l.get_mut(id) {
            Some(e) if e.gets >= MAX_GET_STREAMS => false,
            Some(e) => {
                e.gets += 1;
                true
            }
            None => true,
        })
        .unwrap_or(false)
    }

    fn get_closed(&self, id: &str) {
        self.with_live(|l| {
            if let Some(e) = l.get_mut(id) {
                e.gets = e.gets.saturating_sub(1);
            }
        });
    }

    /// The refusal of a `GET` beyond [`MAX_GET_STREAMS`], audited.
    fn too_many_streams(&self, id: &str) -> axum::response::Response {
        let message = format!(
            "session {id} has {MAX_GET_STREAMS} SSE streams (GET) open already; close one first"
        );
        let link = self
            .with_live(|l| l.get(id).map(|e| e.link.clone()))
            .flatten();
        if let Some(link) = link
            && let Some((session, who)) = link.who.get()
        {
            let mut rec = session_record(session, who, cordon_audit::Status::Busy);
            rec.limits_hit.push("sse_streams".into());
            rec.reason = Some(message.clone());
            self.broker.record_after(&rec);
        }
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {
                "code": -32603,
                "message": message,
                "data": {"cordon/status": "busy", "limit": "sse_streams"},
            }
        });
        let mut r = axum::response::Response::new(axum::body::Body::from(body.to_string()));
        *r.status_mut() = axum::http::StatusCode::TOO_MANY_REQUESTS;
        r.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        );
        r
    }

    fn stream_opened(&self, id: &str) {
        self.with_live(|l| {
            if let Some(e) = l.get_mut(id) {
                e.streams += 1;
            }
        });
    }

    /// A response of `id` ended (`lost`: its connection dropped it first).
    fn response_done(&self, id: &str, post: bool, stream: bool, lost: bool) {
        self.with_live(|l| {
            if let Some(e) = l.get_mut(id) {
                let now = Instant::now();
                if post {
                    e.inflight = e.inflight.saturating_sub(1);
                    e.last_seen = now;
                }
                if stream {
                    e.streams = e.streams.saturating_sub(1);
                    if lost && e.streams == 0 {
                        e.lost_at = Some(now);
                    }
                }
            }
        });
    }

    /// Track the session `id` (its `initialize` answered, with the link
    /// its session filled in; the reaper's sweep may have found it first).
    fn register(&self, id: &str, link: Arc<SessionLink>, owner: cordon_auth::Principal) {
        self.with_live(|l| {
            l.entry(id.to_string())
                .and_modify(|e| {
                    e.link = link.clone();
                    e.owner = Some(owner.clone());
                    e.last_seen = Instant::now();
                })
                .or_insert(Entry {
                    link,
                    owner: Some(owner),
                    last_seen: Instant::now(),
                    inflight: 0,
                    streams: 0,
                    gets: 0,
                    lost_at: None,
                });
        });
    }

    /// The sessions to end now, each with why.
    fn due(
        &self,
    ) -> Vec<(
        String,
        Arc<SessionLink>,
        Option<cordon_auth::Principal>,
        String,
    )> {
        let now = Instant::now();
        let (idle, grace) = (self.idle, self.grace);
        self.with_live(|l| {
            let mut out = Vec::new();
            l.retain(|id, e| {
                let why = if e.inflight == 0 && now.duration_since(e.last_seen) >= idle {
                    Some(format!(
                        "ended after {} idle (gateway `idle_timeout`)",
                        cordon_sandbox::units::format_duration(idle)
                    ))
                } else if e.streams == 0
                    && e.lost_at.is_some_and(|t| now.duration_since(t) >= grace)
                {
                    Some(format!(
                        "ended: its client is gone (its connections dropped and nothing came for {}, gateway `disconnect_grace`)",
                        cordon_sandbox::units::format_duration(grace)
                    ))
                } else {
                    None
                };
                match why {
                    Some(w) => {
                        out.push((id.clone(), e.link.clone(), e.owner.clone(), w));
                        false
                    }
                    None => true,
                }
            });
            out
        })
        .unwrap_or_default()
    }

    /// End the session `id` (already taken out of the live set).
    async fn end(
        &self,
        id: &str,
        link: &SessionLink,
        owner: Option<cordon_auth::Principal>,
        why: String,
    ) {
        self.remember(id, why.clone(), owner);
        self.record_end(link, &why);
        if let Err(e) = self.manager.close_session(&Arc::from(id)).await {
            tracing::error!("session {id}: close: {e}");
        }
    }

    /// The session-level audit record of a session's end (status
    /// `session_ended`, `why` in its reason), however it ended.
    fn record_end(&self, link: &SessionLink, why: &str) {
        let Some((session, who)) = link.who.get() else {
            return;
        };
        let mut rec = session_record(session, who, cordon_audit::Status::SessionEnded);
        rec.reason = Some(format!("session {why}; every sandbox of it was stopped"));
        // The session has ended: a record that cannot be written is
        // counted and said (`cordon doctor`, the next call's warnings).
        self.broker.record_after(&rec);
    }

    /// End due sessions until `stop`; forget those rmcp closed itself.
    pub(crate) async fn reap(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let tick = (self.idle.min(self.grace) / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(1));
        let mut every = tokio::time::interval(tick);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = every.tick() => {}
            }
            for (id, link, owner, why) in self.due() {
                self.end(&id, &link, owner, why).await;
            }
            let ids: Vec<String> = self
                .with_live(|l| l.keys().cloned().collect())
                .unwrap_or_default();
            let open: HashSet<String> = {
                let s = self.manager.sessions.read().await;
                s.keys().map(|k| k.to_string()).collect()
            };
            let tracked: HashSet<&String> = ids.iter().collect();
            // A session rmcp has that is not tracked yet (its `initialize`
            // answer not seen): tracked from now, so the idle timeout
            // holds for every session.
            let untracked: Vec<&String> = open.iter().filter(|i| !tracked.contains(i)).collect();
            let gone: Vec<&String> = ids.iter().filter(|i| !open.contains(*i)).collect();
            if !gone.is_empty() || !untracked.is_empty() {
                let ended: Vec<(String, Option<cordon_auth::Principal>)> = self
                    .with_live(|l| {
                        gone.iter()
                            .filter_map(|g| l.remove(*g).map(|e| ((*g).clone(), e.owner)))
                            .collect()
                    })
                    .unwrap_or_default();
                for (id, owner) in ended {
                    self.remember(&id, "has ended".into(), owner);
                }
                self.with_live(|l| {
                    for u in &untracked {
                        l.entry((*u).clone()).or_insert(Entry {
                            link: Arc::new(SessionLink::default()),
                            owner: None,
                            // Its `initialize` may still be running: idle
                            // counts from after rmcp's own time limit for it.
                            last_seen: Instant::now() + INIT_ALLOWANCE,
                            inflight: 0,
                            streams: 0,
                            gets: 0,
                            lost_at: None,
                        });
                    }
                });
            }
        }
    }
}

/// The answer to a request for a session that ended: `404` (what the MCP
/// specification asks for an unknown session), the reason in the body.
fn expired_response(id: &str, why: &str) -> axum::response::Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {
            "code": -32001,
            "message": format!("session expired: session {id} {why}; start a new session (initialize)"),
            "data": {"cordon/status": "session_expired"},
        }
    });
    let mut r = axum::response::Response::new(axum::body::Body::from(body.to_string()));
    *r.status_mut() = axum::http::StatusCode::NOT_FOUND;
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    r
}

/// The layer: answers requests of ended sessions, and tracks each live
/// session's requests and streams.
pub(crate) async fn track(
    sessions: Arc<HttpSessions>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let method = req.method().clone();
    let post = method == axum::http::Method::POST;
    let get = method == axum::http::Method::GET;
    let id = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let tracked = match &id {
        Some(id) => {
            let t = sessions.seen(id, post);
            if !t && let Some(why) = sessions.expired_reason(id) {
                return expired_response(id, &why);
            }
            if t && get && !sessions.get_opened(id) {
                return sessions.too_many_streams(id);
            }
            t
        }
        None => {
            req.extensions_mut()
                .insert(Arc::new(SessionLink::default()));
            false
        }
    };
    let link = req.extensions().get::<Arc<SessionLink>>().cloned();
    let principal = req
        .extensions()
        .get::<cordon_auth::Principal>()
        .cloned()
        .unwrap_or_else(cordon_auth::Principal::unauthenticated);
    // A session this request opens is named before it is made.
    let mut resp = match &id {
        None => crate::session_ids::with_new_id(next.run(req)).await,
        Some(_) => next.run(req).await,
    };
    let id = match (id, link) {
        (Some(id), _) if tracked => id,
        (Some(_), _) => return resp,
        (None, Some(link)) => {
            let Some(new) = resp
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
            else {
                return resp;
            };
            if !link.accepted() {
                // A refused `initialize` hands out no session: its id is
                // taken off the answer and the session closed.
                resp.headers_mut().remove(SESSION_HEADER);
                if let Err(e) = sessions
                    .manager
                    .close_session(&Arc::from(new.as_str()))
                    .await
                {
                    tracing::error!("session {new}: close: {e}");
                }
                return resp;
            }
            sessions.register(&new, link, principal.clone());
            sessions.seen(&new, post);
            new
        }
        (None, None) => return resp,
    };
    if method == axum::http::Method::DELETE {
        sessions.response_done(&id, post, false, false);
        if resp.status().is_success() {
            let why = "was ended by its client (DELETE)";
            let entry = sessions.with_live(|l| l.remove(&id)).flatten();
            if let Some(e) = &entry {
                sessions.record_end(&e.link, why);
            }
            sessions.remember(&id, why.into(), entry.and_then(|e| e.owner));
        }
        return resp;
    }
    let stream = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/event-stream"));
    let counted_get = get && tracked;
    if !stream {
        sessions.response_done(&id, post, false, false);
        if counted_get {
            sessions.get_closed(&id);
        }
        return resp;
    }
    sessions.stream_opened(&id);
    let (parts, body) = resp.into_parts();
    let body = Tracked {
        inner: body,
        guard: Guard {
            sessions,
            id,
            post,
            get: counted_get,
            answered: false,
            ended: false,
        },
    };
    axum::response::Response::from_parts(parts, axum::body::Body::new(body))
}

/// Reports the end of one streamed response: ended, or lost.
struct Guard {
    sessions: Arc<HttpSessions>,
    id: String,
    post: bool,
    /// A `GET` counted against [`MAX_GET_STREAMS`].
    get: bool,
    /// A `POST`'s stream carried a JSON-RPC response (its call is over, so
    /// a client dropping the stream then has not lost anything).
    answered: bool,
    ended: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let lost = !(self.ended || (self.post && self.answered));
        self.sessions.response_done(&self.id, self.post, true, lost);
        if self.get {
            self.sessions.get_closed(&self.id);
        }
    }
}

struct Tracked {
    inner: axum::body::Body,
    guard: Guard,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(None) => self.guard.ended = true,
            Poll::Ready(Some(Ok(f))) if self.guard.post && !self.guard.answered => {
                // A JSON-RPC response: `"result"` or `"error"` in a data
                // event (a miss only leaves the session to its idle
                // timeout).
                if let Some(d) = f.data_ref()
                    && (contains(d, b"\"result\"") || contains(d, b"\"error\""))
                {
                    self.guard.answered = true;
                }
            }
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A session-level audit record (tool `(session)`, no runtime) of the
/// HTTP session `session` of `who`, with `status`.
fn session_record(
    session: &str,
    who: &crate::caller::Who,
    status: cordon_audit::Status,
) -> cordon_audit::AuditRecord {
    let c = crate::caller::caller_of(session, "mcp:http", who);
    let mut rec = cordon_audit::AuditRecord::new("(session)", "");
    rec.runtime = "none".into();
    rec.session = c.session;
    rec.caller = c.client;
    rec.principal = c.principal;
    rec.tenant = Some(c.tenant);
    rec.status = status;
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_memory_is_bounded() {
        let mut e = Expired::default();
        for i in 0..(EXPIRED_MEMORY + 10) {
            e.remember(&format!("s{i}"), "idle".into(), None);
        }
        assert_eq!(e.order.len(), EXPIRED_MEMORY);
        assert_eq!(e.why.len(), EXPIRED_MEMORY);
        assert!(!e.why.contains_key("s0"));
        assert!(e.why.contains_key(&format!("s{}", EXPIRED_MEMORY + 9)));
    }

    /// Who opened each session is held while it lives and while its end
    /// is remembered, no longer: ending many sessions leaves the live set
    /// empty and the memory at its bound.
    #[tokio::test]
    async fn session_owners_do_not_outlive_the_memory_of_their_end() {
        let dir = tempfile::tempdir().unwrap();
        let broker = Arc::new(
            cordon_broker::Broker::new(cordon_broker::BrokerOptions {
                audit: Some(dir.path().join("audit.jsonl")),
                ..Default::default()
            })
            .unwrap(),
        );
        let s = HttpSessions::new(
            Duration::ZERO,
            Duration::from_secs(60),
            Arc::new(LocalSessionManager::default()),
            broker,
        );
        let who = |i: usize| cordon_auth::Principal {
            subject: format!("p{i}"),
            ..cordon_auth::Principal::unauthenticated()
        };
        let n = EXPIRED_MEMORY + 100;
        for i in 0..n {
            s.register(&format!("s{i}"), Arc::new(SessionLink::default()), who(i));
        }
        assert_eq!(s.held(), (n, 0));
        assert!(matches!(s.known("s0"), Known::Live(Some(p)) if p.subject == "p0"));
        // Every one is idle past its (zero) timeout: the reaper ends it.
        let mut last = (String::new(), None);
        for (id, link, owner, why) in s.due() {
            last = (id.clone(), owner.clone());
            s.end(&id, &link, owner, why).await;
        }
        assert_eq!(s.held(), (0, EXPIRED_MEMORY));
        let forgotten = (0..n)
            .filter(|i| matches!(s.known(&format!("s{i}")), Known::Unknown))
            .count();
        assert_eq!(forgotten, n - EXPIRED_MEMORY);
        let (last, owner) = last;
        let owner = owner.unwrap().subject;
        assert!(matches!(s.known(&last), Known::Ended(Some(p)) if p.subject == owner));
        assert!(
            s.expired_reason(&last)
                .is_some_and(|w| w.starts_with("ended after")),
            "{:?}",
            s.expired_reason(&last)
        );
    }
}
