//! The client side of rmcp's streamable HTTP transport (for tests,
//! benchmarks and agents written in Rust), and the TLS crypto provider it
//! and the gateway's TLS listener need.

/// Install the process-wide TLS crypto provider (ring) that rmcp's HTTP
/// client needs; harmless when one is installed already.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// An rmcp streamable HTTP client transport for `url` (for tests,
/// benchmarks and agents written in Rust).
pub fn http_client(url: &str) -> rmcp::transport::StreamableHttpClientTransport<reqwest::Client> {
    install_crypto_provider();
    rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_owned())
}
