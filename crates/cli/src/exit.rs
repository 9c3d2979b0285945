//! cordon's exit statuses, one per failure class. Documented in the README.
#![allow(dead_code)] // statuses used as the runtimes are wired in

/// The tool ran and succeeded; the output passed the gate.
pub const OK: u8 = 0;
/// `check` found an invalid manifest, `diff` found a weakening change,
/// `probe` found an escape.
pub const FINDING: u8 = 1;
/// Bad usage, unreadable or invalid manifest, unknown tool.
pub const USAGE: u8 = 2;
/// The tool exited non-zero or was killed by a signal.
pub const TOOL_FAILED: u8 = 10;
/// The tool ran past its wall-clock limit and was killed.
pub const TIMED_OUT: u8 = 11;
/// The tool exceeded its memory limit (OOM kill).
pub const MEMORY_LIMIT: u8 = 12;
/// The tool hit its task (process/thread) limit.
pub const TASK_LIMIT: u8 = 13;
/// The tool's output went over its cap.
pub const OUTPUT_CAP: u8 = 14;
/// The output gate refused the result (schema, type, encoding).
pub const GATE_REFUSED: u8 = 15;
/// The sandbox could not be set up; nothing ran.
pub const SETUP_FAILED: u8 = 20;
/// The policy refuses to run this tool here (e.g. a probe does not hold).
pub const REFUSED: u8 = 21;
