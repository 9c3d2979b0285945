//! cordon-mcp: the MCP gateway. One MCP server, cordon, stands in for every
//! tool of a manifest; each call runs in the sandbox its profile names.
//!
//! - `command` tools become MCP tools: name, description and input schema
//!   from the manifest; arguments are checked against the schema before
//!   anything runs, then mapped onto stdin and argv as `input` declares; the
//!   call goes through [`cordon_broker::Broker`] (jail, gate, audit record).
//! - `mcp` tools are third-party MCP servers run inside their sandbox; their
//!   tools are exposed as `<tool>__<server tool>` or under the server's own
//!   names (`expose: as-is`), each exposed name belonging to exactly one
//!   tool (see [`upstream`] and [`names`]).
//! - Every result is gated and labelled untrusted: text as the nonce-wrapped
//!   rendering, images as MCP image content, and `_meta` carries the gate's
//!   envelope (`cordon/trust: untrusted`, ...).
//!
//! Transports: [`serve_stdio`] and [`serve_http`] (streamable HTTP with
//! rmcp's loopback `Host` check on).
#![forbid(unsafe_code)]

pub mod args;
mod audit;
pub mod bearer;
mod cache;
mod caller;
mod caps;
mod client;
mod command;
pub mod console;
mod gateway;
mod grants;
pub mod http;
pub mod lifetime;
pub mod listen;
mod logging;
pub mod metrics;
mod names;
mod offers;
pub mod refusals;
pub mod reload;
pub mod render;
pub mod resources;
pub mod sandbox;
mod service;
mod session;
mod session_ids;
mod tls;
pub mod traces;
mod transport;
mod upstream;
mod uri;
mod warm;

/// The MCP SDK this gateway is built on (its client is what tests and
/// benchmarks drive `cordon serve` with).
pub use rmcp;

pub use args::{ArgError, ArgMapper, Prepared};
pub use cache::default_dir as default_listing_dir;
pub use client::{http_client, install_crypto_provider};
pub use gateway::{Gateway, GatewayError, GatewayOptions, servers_for};
pub use http::{HTTP_PATH, HttpOptions, bind, serve_http};
pub use listen::ConnLimits;
pub use metrics::Metrics;
pub use render::Refusal;
pub use sandbox::{RuntimeServers, ServerHandle, ServerProcess, ServerSandbox};
pub use service::{OutOfService, Service};
pub use session::Session;
pub use tls::tls_config;
pub use transport::{Transport, run, serve_stdio};
