//! `cordon serve` started for a test and an rmcp client connected to it,
//! over stdio or over streamable HTTP on loopback; or the gateway served
//! in-process over HTTP.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use cordon_mcp::rmcp;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// A child process killed and reaped on drop.
#[derive(Debug)]
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `cordon serve` command line being put together.
#[derive(Debug)]
pub struct Serve(Command);

impl Serve {
    /// `BIN serve` and nothing else.
    pub fn new(bin: impl AsRef<OsStr>) -> Serve {
        let mut c = Command::new(bin);
        c.arg("serve");
        Serve(c)
    }

    /// `BIN serve -m MANIFEST`, its audit log at `audit` (`CORDON_AUDIT`)
    /// and its state in the audit log's directory (`CORDON_STATE_DIR`).
    pub fn manifest(bin: impl AsRef<OsStr>, manifest: &Path, audit: &Path) -> Serve {
        let state = audit.parent().expect("the audit log's directory");
        Serve::new(bin)
            .arg("-m")
            .arg(manifest)
            .env("CORDON_AUDIT", audit)
            .env("CORDON_STATE_DIR", state)
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Serve {
        self.0.arg(a);
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, a: I) -> Serve {
        self.0.args(a);
        self
    }

    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Serve {
        self.0.env(k, v);
        self
    }

    /// The server over stdio with `handler` as the client, its stderr to
    /// `stderr`, initialized.
    pub async fn stdio<H: ClientHandler>(
        self,
        handler: H,
        stderr: Stdio,
    ) -> RunningService<RoleClient, H> {
        let (transport, _) = TokioChildProcess::builder(tokio::process::Command::from(self.0))
            .stderr(stderr)
            .spawn()
            .expect("spawn cordon serve");
        handler.serve(transport).await.expect("initialize")
    }

    /// `--http 127.0.0.1:0` added, the server started and its URL read
    /// from its stderr (`serving MCP on URL`); the rest of its stderr is
    /// read on, and collected by [`Http::rest`].
    pub fn http(mut self) -> Http {
        self.0.args(["--http", "127.0.0.1:0"]);
        self.listening()
    }

    /// The server started as it is (with its own `--http`), its URL read
    /// as [`Serve::http`] does.
    pub fn listening(mut self) -> Http {
        let mut child = self
            .0
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cordon serve");
        let mut lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
        let mut stderr = Vec::new();
        let url = loop {
            let line = match lines.next() {
                Some(l) => l.expect("read cordon serve's stderr"),
                None => panic!("cordon serve exited before listening: {stderr:#?}"),
            };
            stderr.push(line.clone());
            if let Some(rest) = line.split("serving MCP on ").nth(1) {
                break rest
                    .split_whitespace()
                    .next()
                    .expect("a URL after `serving MCP on`")
                    .to_owned();
            }
        };
        // Keep reading stderr so the server never blocks on it.
        let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect());
        Http {
            child: Kill(child),
            url,
            stderr,
            rest: Some(rest),
        }
    }
}

/// A `cordon serve --http` that is listening; killed on drop.
#[derive(Debug)]
pub struct Http {
    pub child: Kill,
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    /// Its stderr up to the line that gave the URL.
    pub stderr: Vec<String>,
    rest: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl Http {
    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        self.url
            .split("://")
            .nth(1)
            .unwrap_or(&self.url)
            .trim_end_matches(cordon_mcp::HTTP_PATH)
            .to_owned()
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// The rest of its stderr, once it has closed it (exited).
    pub fn rest(&mut self) -> std::thread::JoinHandle<Vec<String>> {
        self.rest.take().expect("the rest of stderr is taken once")
    }
}

/// `tools/call TOOL` with the object `args`.
pub async fn call<H: ClientHandler>(
    c: &RunningService<RoleClient, H>,
    tool: &str,
    args: Value,
) -> Result<CallToolResult, ServiceError> {
    let mut p = CallToolRequestParams::new(tool.to_owned());
    p.arguments = Some(args.as_object().cloned().unwrap_or_else(JsonObject::new));
    c.peer().call_tool(p).await
}

/// The gateway served in-process over HTTP on loopback; stopped on drop.
#[derive(Debug)]
pub struct Gateway {
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    stop: CancellationToken,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Serve `gw` over HTTP on a free loopback port with `http`'s options.
pub async fn gateway(gw: cordon_mcp::Gateway, http: cordon_mcp::HttpOptions) -> Gateway {
    let listener = cordon_mcp::bind(([127, 0, 0, 1], 0).into())
        .await
        .expect("bind a loopback port");
    let url = format!(
        "http://{}{}",
        listener.local_addr().expect("the bound address"),
        cordon_mcp::HTTP_PATH
    );
    let stop = CancellationToken::new();
    tokio::spawn(cordon_mcp::serve_http(
        Arc::new(gw),
        listener,
        http,
        stop.clone(),
    ));
    Gateway { url, stop }
}
