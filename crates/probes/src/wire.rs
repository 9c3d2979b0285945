//! What the probe agent prints and how it exits: the only channel between
//! the agent inside a sandbox and the harness outside it.
//!
//! Every line the agent prints on stdout is one JSON object. A result line
//! carries `outcome`:
//!
//! ```json
//! {"probe":"network","outcome":"held","evidence":"connect 1.1.1.1:443: ENETUNREACH"}
//! ```
//!
//! Before it tries anything, the agent prints a start event
//! (`{"probe":"network","event":"start","value":<pid>}`), so the harness can
//! tell "the agent ran and was stopped" from "the agent never ran". Resource
//! probes also print progress events (`"event":"progress","value":<amount>`)
//! so a kill by the sandbox still says how far the probe got.
//!
//! The agent's exit code repeats the outcome; the harness refuses a result
//! whose exit code disagrees with its line. The codes are deliberately far
//! from 0/1/2/126/127/128+n so that no wrapper's own status reads as one.

use serde::{Deserialize, Serialize};

/// Exit code of a probe that held (or a control that passed).
pub const EXIT_HELD: i32 = 40;
/// Exit code of a probe that escaped.
pub const EXIT_ESCAPED: i32 = 41;
/// Exit code of a probe that could not decide.
pub const EXIT_ERROR: i32 = 42;
/// Exit code of a probe that had nothing to test.
pub const EXIT_SKIPPED: i32 = 43;
/// Exit code of a bad agent command line.
pub const EXIT_USAGE: i32 = 64;

/// What the agent concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentOutcome {
    /// The sandbox refused what the probe tried (for the control: it ran).
    Held,
    /// The probe got what it asked for: the boundary is open.
    Escaped,
    /// The probe could not decide.
    Error,
    /// The probe had nothing to test (e.g. no target given).
    Skipped,
}

impl AgentOutcome {
    /// The exit code the agent uses for this outcome.
    pub fn exit_code(self) -> i32 {
        match self {
            AgentOutcome::Held => EXIT_HELD,
            AgentOutcome::Escaped => EXIT_ESCAPED,
            AgentOutcome::Error => EXIT_ERROR,
            AgentOutcome::Skipped => EXIT_SKIPPED,
        }
    }

    /// The outcome an exit code stands for, if it is one of the agent's.
    pub fn from_exit_code(code: i32) -> Option<Self> {
        match code {
            EXIT_HELD => Some(AgentOutcome::Held),
            EXIT_ESCAPED => Some(AgentOutcome::Escaped),
            EXIT_ERROR => Some(AgentOutcome::Error),
            EXIT_SKIPPED => Some(AgentOutcome::Skipped),
            _ => None,
        }
    }
}

/// A non-result line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentEvent {
    /// The agent is running; `value` is its pid as it sees it.
    Start,
    /// A resource probe's progress; `value` is in the probe's unit.
    Progress,
}

/// One line of agent output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentLine {
    /// Probe name.
    pub probe: String,
    /// Set on the result line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<AgentOutcome>,
    /// Set on start and progress lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<AgentEvent>,
    /// What the probe saw (result lines).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub evidence: String,
    /// A number: pid for start, amount for progress and results of resource
    /// probes (MiB, processes, bytes, descriptors, seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
}

impl AgentLine {
    /// Parse one line; anything that is not an agent line gives `None`.
    pub fn parse(line: &str) -> Option<AgentLine> {
        let line = line.trim();
        if !line.starts_with('{') {
            return None;
        }
        serde_json::from_str(line).ok()
    }

    /// The line as the agent prints it (no trailing newline).
    pub fn to_json(&self) -> String {
        // Serialising a struct of strings, enums and integers cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_result_line() {
        let l = AgentLine {
            probe: "network".into(),
            outcome: Some(AgentOutcome::Held),
            event: None,
            evidence: "connect 1.1.1.1:443: ENETUNREACH".into(),
            value: None,
        };
        let s = l.to_json();
        assert_eq!(
            s,
            r#"{"probe":"network","outcome":"held","evidence":"connect 1.1.1.1:443: ENETUNREACH"}"#
        );
        assert_eq!(AgentLine::parse(&s), Some(l));
    }

    #[test]
    fn garbage_is_not_a_line() {
        assert_eq!(AgentLine::parse("held"), None);
        assert_eq!(AgentLine::parse(r#"{"outcome":"held"}"#), None);
        assert_eq!(AgentLine::parse(r#"{"probe":"x","outcome":"maybe"}"#), None);
    }

    #[test]
    fn exit_codes_are_distinct_and_invertible() {
        for o in [
            AgentOutcome::Held,
            AgentOutcome::Escaped,
            AgentOutcome::Error,
            AgentOutcome::Skipped,
        ] {
            assert_eq!(AgentOutcome::from_exit_code(o.exit_code()), Some(o));
        }
        assert_eq!(AgentOutcome::from_exit_code(0), None);
        assert_eq!(AgentOutcome::from_exit_code(1), None);
    }
}
