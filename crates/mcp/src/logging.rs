//! The logging level the agent's client set with `logging/setLevel`, shared
//! by its session and the session's servers, and which messages pass it.

use std::sync::{Arc, Mutex};

/// The logging level the agent's client set, shared by its session and the
/// session's servers (`None`: not set).
#[allow(deprecated)]
pub(crate) type LogLevel = Arc<Mutex<Option<rmcp::model::LoggingLevel>>>;

#[allow(deprecated)]
use rmcp::model::LoggingLevel;

/// The rank of a level (debug lowest).
#[allow(deprecated)]
pub(crate) fn level_rank(l: LoggingLevel) -> u8 {
    match l {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// Whether a message at `level` passes the level the client set.
#[allow(deprecated)]
pub(crate) fn level_passes(set: &LogLevel, level: LoggingLevel) -> bool {
    set.lock()
        .ok()
        .and_then(|l| *l)
        .is_none_or(|min| level_rank(level) >= level_rank(min))
}
