//! Helpers shared by the MCP integration tests (each test binary uses a
//! subset, hence the `dead_code` allowance).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use cordon_mcp::rmcp::model::CallToolResult;
use cordon_mcp::rmcp::service::ServiceError;
use serde_json::Value;

pub use cordon_testkit::skip;
#[allow(unused_imports)] // not every test binary skips
pub use skip::{skip_or_fail, this_test};

/// The fixture MCP server's directory (`crates/mcp/tests/fixtures`).
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../mcp/tests/fixtures")
        .canonicalize()
        .expect("fixtures dir")
}

/// Where scripts/setup.sh installs the reference MCP servers, when
/// server-everything is there (`$CORDON_E2E_NPM` overrides).
pub fn npm_dir() -> Option<PathBuf> {
    let d = std::env::var_os("CORDON_E2E_NPM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e/npm"));
    d.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .is_file()
        .then_some(d)
}

/// A directory removed on drop.
pub use cordon_testkit::Scratch as TempDir;
/// A child process killed and reaped on drop.
#[allow(unused_imports)] // not every test binary kills
pub use cordon_testkit::serve::Kill;
#[allow(unused_imports)] // not every test binary serves
pub use cordon_testkit::serve::{Serve, call};

/// A fresh scratch directory (see `cordon_testkit::scratch`).
pub fn tempdir() -> TempDir {
    cordon_testkit::scratch::named("cordon-mcp-test-")
}

pub fn mcp_error(e: ServiceError) -> cordon_mcp::rmcp::ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        other => panic!("expected an MCP error, got {other:?}"),
    }
}

/// The text parts of a tool result, joined by newlines.
pub fn text_of(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The records of an audit log (none when it does not exist yet).
pub fn audit_records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// One P1 tool, `word_count` (`/usr/bin/wc`, its text on stdin): the
/// manifest of the tests of what the gateway shows of its calls (metrics,
/// console, traces, authentication).
pub const WORD_COUNT: &str = r#"version: 1
tools:
  word_count:
    profile: P1
    description: Count lines, words and bytes of a text.
    command: ["/usr/bin/wc"]
    limits: {wall_seconds: 5, memory: 64M, tasks: 4, output_bytes: 4K}
    network: none
    input: {stdin: text}
    input_schema:
      type: object
      properties: {text: {type: string}}
      required: [text]
"#;

/// An MCP client of the streamable-HTTP endpoint `url`, with the
/// `Authorization` value `token` when given, never through a proxy.
pub async fn http_client(
    url: &str,
    token: Option<&str>,
) -> cordon_mcp::rmcp::service::RunningService<cordon_mcp::rmcp::RoleClient, ()> {
    use cordon_mcp::rmcp::ServiceExt;
    use cordon_mcp::rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    cordon_mcp::install_crypto_provider();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut cfg = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    if let Some(t) = token {
        cfg = cfg.auth_header(t);
    }
    ().serve(cordon_mcp::rmcp::transport::StreamableHttpClientTransport::with_client(http, cfg))
        .await
        .unwrap()
}
