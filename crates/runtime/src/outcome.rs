//! What a sandbox reports: how a call ended, and why one could not start.

use std::time::Duration;

use serde::Serialize;

/// How a call (or a spawned sandbox) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Exit code 0.
    Ok,
    /// Non-zero exit, or a signal not caused by a limit.
    Exited,
    /// Killed at the wall-clock limit.
    TimedOut,
    /// Killed at the memory limit.
    MemoryLimit,
    /// Hit the task limit and failed.
    TaskLimit,
    /// Killed for writing more than its output cap.
    OutputCap,
    /// Killed by the broker (a spawned sandbox that was stopped).
    Killed,
}

/// The result of a sandbox that ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// How it ended.
    pub status: Status,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Signal, when it was killed.
    pub signal: Option<i32>,
    /// Wall time from setup to reaping.
    pub duration: Duration,
    /// Peak memory of the sandbox, where the runtime measures it.
    pub peak_memory_bytes: Option<u64>,
    /// Stdout of a call (at most its cap); empty for a spawned sandbox.
    pub stdout: Vec<u8>,
    /// Bytes the sandbox wrote to stdout.
    pub output_bytes: u64,
    /// Stderr, capped.
    pub stderr: Vec<u8>,
    /// Stderr bytes seen.
    pub stderr_total: u64,
    /// Human text, e.g. `pdf_to_text: timed out after 20s`.
    pub reason: String,
    /// Every mechanism that was not fully enforced, and other weakened
    /// guarantees, as sentences.
    pub warnings: Vec<String>,
}

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
