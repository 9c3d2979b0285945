//! What each MCP server offers besides tools, shared by the gateway's
//! sessions, the servers' connections and the listing cache.

use std::sync::{Arc, Mutex};

/// What a server offers besides tools, learnt from its `initialize`
/// answer and shared by the sessions of one gateway (the capabilities are
/// advertised before any session has started the server).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Offers {
    pub resources: bool,
    pub prompts: bool,
    pub completions: bool,
    pub subscribe: bool,
    /// The server sends `list_changed` for resources / prompts.
    pub resources_list_changed: bool,
    pub prompts_list_changed: bool,
}

/// The gateway's record of each server's [`Offers`] (`None`: not started yet).
pub(crate) type KnownOffers = Arc<Mutex<Option<Offers>>>;
