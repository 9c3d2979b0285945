//! The credential broker a command needs for the tools it runs.

use std::path::Path;

use anyhow::anyhow;
use cordon_policy::ToolPolicy;

/// The credential broker for `policy`: loaded only when it declares
/// secrets. `Ok(None)`: none needed, or none configured (admission then
/// refuses the tool).
pub fn credentials_for<'a>(
    mut policies: impl Iterator<Item = &'a ToolPolicy>,
    explicit: Option<&Path>,
) -> anyhow::Result<Option<std::sync::Arc<cordon_broker::CredentialBroker>>> {
    if !policies.any(|p| !p.secrets.is_empty()) {
        return Ok(None);
    }
    cordon_secrets::CredentialBroker::discover(explicit)
        .map(|b| b.map(std::sync::Arc::new))
        .map_err(|e| anyhow!("credential broker: {e}"))
}
