//! Who a call is for: the principal of a session ([`Who`]) and the
//! [`Caller`] an audit record or the broker is given.

use std::sync::Arc;

use cordon_broker::Caller;

/// The principal of a session: set once, from the session's first request
/// (HTTP) or at its start (stdio), and shared with the session's servers.
pub(crate) type Who = Arc<std::sync::OnceLock<cordon_auth::Principal>>;

/// The [`Caller`] of `session` for `client`; a principal not set yet is
/// the unauthenticated one.
pub(crate) fn caller_of(session: &str, client: &str, who: &Who) -> Caller {
    let p = who
        .get()
        .cloned()
        .unwrap_or_else(cordon_auth::Principal::unauthenticated);
    Caller {
        session: session.to_string(),
        client: client.to_string(),
        principal: Some(p.subject),
        tenant: p.tenant,
        trace: None,
    }
}
