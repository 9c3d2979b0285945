//! The suite's report: human lines, JSON and JUnit XML, and the exit
//! status policy.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::sandbox::RunStatus;

/// What a probe is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    /// The positive control.
    Control,
    /// Reaching something outside the boundary.
    Escape,
    /// Exhausting a resource.
    Resource,
}

/// The harness's verdict on one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The boundary refused the probe (for the control: it ran).
    Held,
    /// The probe got through: a vulnerability of the profile.
    Escaped,
    /// No trustworthy answer (the agent did not start, printed nothing
    /// parseable, or its exit status contradicts its line).
    Error,
    /// Nothing to test.
    Skipped,
    /// Not run because the control failed: no result of this sandbox
    /// counts.
    Void,
}

impl Verdict {
    /// The word the human report starts a line with.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Held => "HELD",
            Verdict::Escaped => "ESCAPED",
            Verdict::Error => "ERROR",
            Verdict::Skipped => "SKIPPED",
            Verdict::Void => "VOID",
        }
    }
}

/// One probe's result.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeResult {
    /// Probe name.
    pub probe: String,
    /// Its category.
    pub category: Category,
    /// The verdict.
    pub verdict: Verdict,
    /// What was seen.
    pub evidence: String,
    /// Wall time of the probe (all its runs).
    #[serde(serialize_with = "secs")]
    pub duration: Duration,
    /// The last run's exit code.
    pub exit_code: Option<i32>,
    /// The last run's signal.
    pub signal: Option<i32>,
    /// The last run's typed status.
    pub status: Option<RunStatus>,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1000.0).round() / 1000.0)
}

/// Everything one suite run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The sandbox's name.
    pub sandbox: String,
    /// The profile's name.
    pub profile: String,
    /// Results in catalogue order; the control first.
    pub results: Vec<ProbeResult>,
}

/// Exit status: every probe held.
pub const EXIT_ALL_HELD: i32 = 0;
/// Exit status: something escaped, or the control failed.
pub const EXIT_ESCAPED: i32 = 1;
/// Exit status: nothing escaped but some probe has no trustworthy answer.
pub const EXIT_INCONCLUSIVE: i32 = 3;

impl Report {
    /// Whether the control ran.
    pub fn control_ok(&self) -> bool {
        self.results
            .iter()
            .find(|r| r.category == Category::Control)
            .is_some_and(|r| r.verdict == Verdict::Held)
    }

    /// The result of one probe.
    pub fn get(&self, probe: &str) -> Option<&ProbeResult> {
        self.results.iter().find(|r| r.probe == probe)
    }

    /// How many results have this verdict.
    pub fn count(&self, v: Verdict) -> usize {
        self.results.iter().filter(|r| r.verdict == v).count()
    }

    /// 1 if anything escaped or the control failed, else 2 if any probe
    /// errored, else 0.
    pub fn exit_code(&self) -> i32 {
        if !self.control_ok() || self.count(Verdict::Escaped) > 0 {
            EXIT_ESCAPED
        } else if self.count(Verdict::Error) > 0 || self.count(Verdict::Void) > 0 {
            EXIT_INCONCLUSIVE
        } else {
            EXIT_ALL_HELD
        }
    }

    /// One line per probe (`HELD     network        connect ...`) and a
    /// summary.
    pub fn to_human(&self) -> String {
        let mut s = format!(
            "cordon probes: sandbox {} / profile {}\n",
            self.sandbox, self.profile
        );
        for r in &self.results {
            let _ = writeln!(
                s,
                "{:<8} {:<14} {}",
                r.verdict.label(),
                r.probe,
                one_line(&r.evidence)
            );
        }
        let _ = write!(
            s,
            "{} held, {} escaped, {} error, {} skipped, {} void",
            self.count(Verdict::Held),
            self.count(Verdict::Escaped),
            self.count(Verdict::Error),
            self.count(Verdict::Skipped),
            self.count(Verdict::Void)
        );
        if !self.control_ok() {
            s.push_str("; the control FAILED: no result of this sandbox counts");
        }
        s.push('\n');
        s
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        // A tree of strings, numbers and enums always serialises.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report as a JUnit XML test suite: escaped is a failure, error
    /// and void are errors, skipped is skipped.
    pub fn to_junit(&self) -> String {
        let total: f64 = self.results.iter().map(|r| r.duration.as_secs_f64()).sum();
        let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            x,
            "<testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3}\">",
            xml_escape(&format!("cordon-probes {} {}", self.profile, self.sandbox)),
            self.results.len(),
            self.count(Verdict::Escaped),
            self.count(Verdict::Error) + self.count(Verdict::Void),
            self.count(Verdict::Skipped),
            total
        );
        for r in &self.results {
            let cat = match r.category {
                Category::Control => "control",
                Category::Escape => "escape",
                Category::Resource => "resource",
            };
            let _ = write!(
                x,
                "  <testcase classname=\"cordon.probes.{cat}\" name=\"{}\" time=\"{:.3}\"",
                xml_escape(&r.probe),
                r.duration.as_secs_f64()
            );
            let ev = xml_escape(&r.evidence);
            match r.verdict {
                Verdict::Held => {
                    let _ = writeln!(x, ">\n    <system-out>{ev}</system-out>\n  </testcase>");
                }
                Verdict::Escaped => {
                    let _ = writeln!(
                        x,
                        ">\n    <failure message=\"escaped\" type=\"escape\">{ev}</failure>\n  </testcase>"
                    );
                }
                Verdict::Error | Verdict::Void => {
                    let _ = writeln!(
                        x,
                        ">\n    <error message=\"{}\" type=\"{}\">{ev}</error>\n  </testcase>",
                        r.verdict.label().to_lowercase(),
                        r.verdict.label().to_lowercase()
                    );
                }
                Verdict::Skipped => {
                    let _ = writeln!(x, ">\n    <skipped message=\"{ev}\"/>\n  </testcase>");
                }
            }
        }
        x.push_str("</testsuite>\n");
        x
    }
}

/// A report format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One line per probe.
    Human,
    /// The full structure as JSON.
    Json,
    /// JUnit XML.
    Junit,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "human" | "text" => Ok(Format::Human),
            "json" => Ok(Format::Json),
            "junit" | "xml" => Ok(Format::Junit),
            other => Err(format!(
                "unknown report format {other:?} (human, json, junit)"
            )),
        }
    }
}

impl Report {
    /// The report in `f`.
    pub fn render(&self, f: Format) -> String {
        match f {
            Format::Human => self.to_human(),
            Format::Json => self.to_json(),
            Format::Junit => self.to_junit(),
        }
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// Escape text for XML content and attributes, dropping characters XML 1.0
/// cannot carry.
pub fn xml_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            '\t' | '\n' | '\r' => o.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => o.push('\u{fffd}'),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(probe: &str, cat: Category, v: Verdict, ev: &str) -> ProbeResult {
        ProbeResult {
            probe: probe.into(),
            category: cat,
            verdict: v,
            evidence: ev.into(),
            duration: Duration::from_millis(12),
            exit_code: Some(40),
            signal: None,
            status: Some(RunStatus::Exited),
        }
    }

    fn report(results: Vec<ProbeResult>) -> Report {
        Report {
            sandbox: "bwrap".into(),
            profile: "P1".into(),
            results,
        }
    }

    #[test]
    fn exit_policy() {
        let ok = r("control", Category::Control, Verdict::Held, "ran");
        assert_eq!(report(vec![ok.clone()]).exit_code(), EXIT_ALL_HELD);
        let esc = r("env", Category::Escape, Verdict::Escaped, "x");
        assert_eq!(report(vec![ok.clone(), esc]).exit_code(), EXIT_ESCAPED);
        let err = r("env", Category::Escape, Verdict::Error, "x");
        assert_eq!(report(vec![ok, err]).exit_code(), EXIT_INCONCLUSIVE);
        let bad = r("control", Category::Control, Verdict::Error, "no");
        let void = r("env", Category::Escape, Verdict::Void, "x");
        assert_eq!(report(vec![bad, void]).exit_code(), EXIT_ESCAPED);
        assert_eq!(report(vec![]).exit_code(), EXIT_ESCAPED);
    }

    #[test]
    fn human_lines() {
        let rep = report(vec![
            r("control", Category::Control, Verdict::Held, "ran"),
            r(
                "network",
                Category::Escape,
                Verdict::Held,
                "connect 1.1.1.1:443: ENETUNREACH",
            ),
            r(
                "host_fs",
                Category::Escape,
                Verdict::Escaped,
                "read /etc/shadow",
            ),
            r("bpf", Category::Escape, Verdict::Skipped, "reason"),
        ]);
        let h = rep.to_human();
        assert!(
            h.contains("HELD     network        connect 1.1.1.1:443: ENETUNREACH\n"),
            "{h}"
        );
        assert!(
            h.contains("ESCAPED  host_fs        read /etc/shadow\n"),
            "{h}"
        );
        assert!(h.contains("SKIPPED  bpf            reason\n"), "{h}");
        assert!(
            h.contains("2 held, 1 escaped, 0 error, 1 skipped, 0 void"),
            "{h}"
        );
    }

    #[test]
    fn junit_is_escaped_and_counts() {
        let rep = report(vec![
            r("control", Category::Control, Verdict::Held, "ran"),
            r(
                "env",
                Category::Escape,
                Verdict::Escaped,
                "<x> & \"y\" \u{1}",
            ),
            r("fork", Category::Resource, Verdict::Error, "no start"),
        ]);
        let x = rep.to_junit();
        assert!(
            x.contains("tests=\"3\" failures=\"1\" errors=\"1\" skipped=\"0\""),
            "{x}"
        );
        assert!(x.contains("&lt;x&gt; &amp; &quot;y&quot; \u{fffd}"), "{x}");
        assert!(!x.contains("<x>"));
        assert!(
            x.contains("classname=\"cordon.probes.resource\" name=\"fork\""),
            "{x}"
        );
        let v: serde_json::Value = serde_json::from_str(&rep.to_json()).unwrap();
        assert_eq!(v["results"][1]["verdict"], "escaped");
    }
}
