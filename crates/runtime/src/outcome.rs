//! What a sandbox reports: how a call ended (the sandbox's own
//! [`Outcome`]), and why one could not start ([`RunError`]).

pub use cordon_sandbox::{LandlockStatus, Outcome, Status};

/// Why a sandbox did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// Admission refused it: the policy cannot be enforced here.
    #[error("{0}")]
    Refused(String),
    /// Setting it up failed; nothing of the tool ran (or its result cannot
    /// be trusted, e.g. its limits could not be read back).
    #[error("{0}")]
    Setup(String),
}
