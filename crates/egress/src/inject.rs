//! Credential injection: what the doors substitute for a placeholder.
//!
//! A sandbox whose tool declares a secret delivered by `proxy` sees only a
//! placeholder (unguessable, unique per session and secret). The doors hold
//! an [`Injection`] per such secret: the placeholder, the one endpoint it is
//! bound to and where the token goes in a request there, and a
//! [`TokenSource`] that yields the current token (re-minted before expiry,
//! so it is asked at every use, never cached by the door). A placeholder
//! anywhere else (another host, port or path, a body, an encoded form) is
//! an exfiltration attempt and refused.

use std::fmt;
use std::sync::Arc;

use zeroize::Zeroizing;

/// Where the token goes in a request to the bound endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// A header whose value is `template` with `{token}` replaced, e.g.
    /// `Authorization: Bearer {token}`.
    Header {
        /// Header name.
        name: String,
        /// Value template containing `{token}` once.
        template: String,
    },
    /// HTTP Basic authentication with this user name and the token as the
    /// password.
    Basic {
        /// User name.
        username: String,
    },
    /// A query parameter of the request target.
    Query {
        /// Parameter name.
        param: String,
    },
}

/// The one endpoint a secret is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// Host name, normalised (lower case, no trailing dot).
    pub host: String,
    /// Port.
    pub port: u16,
    /// Only requests whose path starts with this prefix; `None`: any path.
    pub path_prefix: Option<String>,
    /// Where the token goes.
    pub placement: Placement,
    /// A CA certificate file (PEM) trusted for this endpoint besides the
    /// host's roots, for an internal service; `None`: the host's roots only.
    pub upstream_ca: Option<std::path::PathBuf>,
}

/// The current token of one secret.
pub trait TokenSource: Send + Sync {
    /// The token valid now (re-minted by the credential broker before it
    /// expires), or why there is none (revoked, mint failed): the request
    /// is then refused, never sent with the placeholder.
    fn current(&self) -> Result<Zeroizing<String>, String>;
}

/// One secret delivered by the proxy.
#[derive(Clone)]
pub struct Injection {
    /// The secret's name (the variable the sandbox sees), for events.
    pub secret: String,
    /// What the sandbox sees instead of the token.
    pub placeholder: String,
    /// Where it may be used.
    pub binding: Binding,
    /// The token.
    pub source: Arc<dyn TokenSource>,
}

impl fmt::Debug for Injection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Injection")
            .field("secret", &self.secret)
            .field("binding", &self.binding)
            .finish_non_exhaustive()
    }
}

/// Every injection of one sandbox (empty: none; nothing is substituted).
#[derive(Clone, Debug, Default)]
pub struct Injections {
    entries: Arc<[Injection]>,
}

impl Injections {
    /// The injections of one sandbox.
    pub fn new(entries: Vec<Injection>) -> Injections {
        Injections {
            entries: entries.into(),
        }
    }

    /// None at all.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Each injection.
    pub fn iter(&self) -> impl Iterator<Item = &Injection> {
        self.entries.iter()
    }
}
