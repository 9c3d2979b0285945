//! The live console of `cordon serve --http`: `GET /console`, behind the
//! same authentication as the MCP endpoint and `/metrics`. One small,
//! read-only, server-rendered HTML page (no script; it reloads itself
//! every 5 s) that shows
//!
//! - each served tool with its profile, runtime, whether it is in service,
//!   and the time and verdict of its last proof;
//! - the live sessions and sandboxes;
//! - the last refusals and exfiltration attempts;
//! - the calls per minute over the last hour, as an inline SVG bar plot.
//!
//! Like the metrics, it is fed by the audit log's own records: [`Recent`]
//! is a [`RecordObserver`] of the broker's auditor, and keeps only a
//! bounded ring of recent refusals and a minute-by-minute count of calls.
//! Every value on the page is HTML-escaped (tool names and reasons come
//! from manifests and clients); no tool input, output or secret is shown:
//! a refusal's reason is the audit record's with what may quote the
//! arguments (a schema violation's detail) left out, and an exfiltration
//! names the secret, never a value.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use cordon_audit::{AuditRecord, RecordObserver, Status};

/// The path the console is served on.
pub const CONSOLE_PATH: &str = "/console";

/// How many refusals the console remembers.
pub const REFUSALS_KEPT: usize = 20;

/// Minutes of calls plotted.
const MINUTES: u64 = 60;

/// The longest reason shown, in characters.
const REASON_MAX: usize = 240;

/// One refusal or exfiltration attempt, as shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefusalRow {
    /// RFC 3339, UTC, to the second.
    pub(crate) time: String,
    pub(crate) tool: String,
    /// The record's status, or `exfiltration`.
    pub(crate) kind: String,
    pub(crate) why: String,
}

#[derive(Debug, Default)]
struct State {
    refusals: VecDeque<RefusalRow>,
    /// Calls per Unix minute, oldest first, at most [`MINUTES`].
    minutes: VecDeque<(u64, u64)>,
}

/// What the console remembers of the audit records: the last refusals
/// and the calls per minute.
#[derive(Debug, Default)]
pub struct Recent {
    state: Mutex<State>,
}

fn stamp(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn unix_minute(t: time::OffsetDateTime) -> u64 {
    u64::try_from(t.unix_timestamp()).unwrap_or(0) / 60
}

/// `s` cut to `max` characters (marked when cut).
fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}

/// A refusal's reason without what may quote the call's arguments: a
/// schema violation keeps where and which keyword, not its detail.
fn shown_reason(reason: &str) -> String {
    const SCHEMA: &str = "arguments refused by input_schema at ";
    if let Some(i) = reason.find(SCHEMA) {
        let rest = &reason[i + SCHEMA.len()..];
        let path = rest.split(": ").next().unwrap_or("");
        let keyword = rest
            .rsplit_once("(keyword `")
            .and_then(|(_, k)| k.split('`').next())
            .unwrap_or("?");
        return cut(
            &format!("{}{SCHEMA}{path} (keyword `{keyword}`)", &reason[..i]),
            REASON_MAX,
        );
    }
    cut(reason, REASON_MAX)
}

/// Whether `rec` is a call of a tool (what the plot counts): not a
/// session's, a pool's, a credential's or a service record.
fn is_call(rec: &AuditRecord) -> bool {
    rec.credential.is_none()
        && rec.service.is_none()
        && !crate::metrics::pool_record(rec)
        && rec.egress.is_empty()
        && rec.status != Status::SessionEnded
        && !rec.tool.is_empty()
        && rec.tool != "(session)"
}

impl Recent {
    pub fn new() -> Recent {
        Recent::default()
    }

    /// The refusals remembered, newest first.
    pub(crate) fn refusals(&self) -> Vec<RefusalRow> {
        self.state
            .lock()
            .map(|s| s.refusals.iter().rev().cloned().collect())
            .unwrap_or_default()
    }

    /// Calls in each of the last [`MINUTES`] minutes up to `now_minute`
    /// (a Unix minute), oldest first.
    pub(crate) fn per_minute(&self, now_minute: u64) -> Vec<u64> {
        let first = now_minute.saturating_sub(MINUTES - 1);
        let mut out = vec![0u64; MINUTES as usize];
        if let Ok(s) = self.state.lock() {
            for (m, n) in &s.minutes {
                if (first..=now_minute).contains(m) {
                    out[(m - first) as usize] = *n;
                }
            }
        }
        out
    }

    fn remember(&self, row: RefusalRow) {
        if let Ok(mut s) = self.state.lock() {
            if s.refusals.len() == REFUSALS_KEPT {
                s.refusals.pop_front();
            }
            s.refusals.push_back(row);
        }
    }

    fn count_call(&self, minute: u64) {
        if let Ok(mut s) = self.state.lock() {
            match s.minutes.back().map(|(m, _)| *m) {
                Some(last) if last == minute => {
                    if let Some((_, n)) = s.minutes.back_mut() {
                        *n += 1;
                    }
                }
                // A record stamped in an earlier minute than the last
                // (written late): counted in its own minute when kept.
                Some(last) if last > minute => {
                    if let Some((_, n)) = s.minutes.iter_mut().find(|(m, _)| *m == minute) {
                        *n += 1;
                    }
                }
                _ => s.minutes.push_back((minute, 1)),
            }
            while s
                .minutes
                .front()
                .is_some_and(|(m, _)| m + MINUTES <= minute)
            {
                s.minutes.pop_front();
            }
        }
    }
}

impl RecordObserver for Recent {
    fn recorded(&self, rec: &AuditRecord) {
        let time = stamp(rec.time);
        for e in &rec.egress {
            if let Some(secret) = &e.exfiltration {
                self.remember(RefusalRow {
                    time: time.clone(),
                    tool: rec.tool.clone(),
                    kind: "exfiltration".into(),
                    why: cut(
                        &format!(
                            "the placeholder of secret {secret} was sent to {}:{}, where it is not bound",
                            e.name, e.port
                        ),
                        REASON_MAX,
                    ),
                });
            }
        }
        if rec.credential.is_some() || crate::metrics::pool_record(rec) {
            return;
        }
        if is_call(rec) {
            self.count_call(unix_minute(rec.time));
        }
        if rec.service.is_none()
            && matches!(
                rec.status,
                Status::Denied | Status::Refused | Status::Busy | Status::LimitHit
            )
        {
            let mut why = rec.reason.as_deref().map(shown_reason).unwrap_or_default();
            if !rec.limits_hit.is_empty() {
                why = format!("{why} (limit: {})", rec.limits_hit.join(", "));
            }
            self.remember(RefusalRow {
                time,
                tool: rec.tool.clone(),
                kind: rec.status.as_str().to_owned(),
                why,
            });
        }
    }
}

/// `s` escaped for HTML text and attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// One served tool, as shown.
pub(crate) struct ToolRow {
    pub(crate) name: String,
    pub(crate) profile: String,
    pub(crate) runtime: String,
    /// `None`: in service; else since when and why not.
    pub(crate) out_of_service: Option<String>,
    /// The last proof's verdict and time (RFC 3339), when known.
    pub(crate) proof: Option<(String, Option<String>)>,
}

/// Everything the page shows.
pub(crate) struct View {
    pub(crate) tools: Vec<ToolRow>,
    pub(crate) sessions: usize,
    pub(crate) sandboxes: i64,
    pub(crate) refusals: Vec<RefusalRow>,
    pub(crate) per_minute: Vec<u64>,
    pub(crate) now: String,
}

/// The calls per minute as an SVG bar plot, oldest on the left.
fn plot(per_minute: &[u64]) -> String {
    const W: u64 = 10;
    const H: u64 = 100;
    let max = per_minute.iter().copied().max().unwrap_or(0).max(1);
    let width = W * per_minute.len() as u64;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg id="calls-per-minute" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{}" role="img" aria-label="calls per minute, last hour (peak {max})">"#,
        H + 1
    );
    let _ = write!(
        s,
        "<line x1=\"0\" y1=\"{H}\" x2=\"{width}\" y2=\"{H}\" stroke=\"#888\"/>"
    );
    let n = per_minute.len();
    for (i, c) in per_minute.iter().enumerate() {
        let h = c * H / max;
        let ago = n - 1 - i;
        let _ = write!(
            s,
            "<rect class=\"bar\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{h}\" fill=\"#3b6ea5\" data-calls=\"{c}\"><title>{c} call(s), {ago} min ago</title></rect>",
            i as u64 * W,
            H - h,
            W - 2,
        );
    }
    s.push_str("</svg>");
    s
}

/// The page.
pub(crate) fn render(v: &View) -> String {
    let mut s = String::new();
    s.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"5\">\
         <title>cordon console</title>\
         <style>body{font-family:sans-serif;margin:1.5em;color:#222}\
         table{border-collapse:collapse;margin-bottom:1.5em}\
         th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}\
         th{background:#f2f2f2}.out{color:#a00;font-weight:bold}.in{color:#070}\
         .refusal td.kind{color:#a00}</style></head><body>\n",
    );
    let _ = writeln!(
        s,
        "<h1>cordon console</h1><p>As of <time id=\"now\">{}</time>; reloads every 5 s.</p>",
        esc(&v.now)
    );
    let _ = writeln!(
        s,
        "<p>Live sessions: <span id=\"sessions\">{}</span>. Live sandboxes: <span id=\"sandboxes\">{}</span>.</p>",
        v.sessions, v.sandboxes
    );
    s.push_str(
        "<h2>Tools</h2>\n<table id=\"tools\"><tr><th>tool</th><th>profile</th><th>runtime</th><th>state</th><th>last proof</th></tr>\n",
    );
    for t in &v.tools {
        let state = match &t.out_of_service {
            None => "<span class=\"in\">in service</span>".to_owned(),
            Some(why) => format!("<span class=\"out\">out of service</span>: {}", esc(why)),
        };
        let proof = match &t.proof {
            None => "not proved".to_owned(),
            Some((verdict, Some(at))) => format!("{} at {}", esc(verdict), esc(at)),
            Some((verdict, None)) => esc(verdict),
        };
        let _ = writeln!(
            s,
            "<tr class=\"tool\" data-tool=\"{n}\"><td class=\"name\">{n}</td><td>{}</td><td>{}</td><td class=\"state\">{state}</td><td class=\"proof\">{proof}</td></tr>",
            esc(&t.profile),
            esc(&t.runtime),
            n = esc(&t.name),
        );
    }
    s.push_str("</table>\n");
    let _ = write!(
        s,
        "<h2>Last refusals</h2>\n<p>The last {REFUSALS_KEPT} at most, newest first.</p>\n<table id=\"refusals\"><tr><th>time</th><th>tool</th><th>kind</th><th>why</th></tr>\n"
    );
    if v.refusals.is_empty() {
        s.push_str("<tr><td colspan=\"4\">none</td></tr>\n");
    }
    for r in &v.refusals {
        let _ = writeln!(
            s,
            "<tr class=\"refusal\"><td>{}</td><td class=\"tool\">{}</td><td class=\"kind\">{}</td><td class=\"why\">{}</td></tr>",
            esc(&r.time),
            esc(&r.tool),
            esc(&r.kind),
            esc(&r.why)
        );
    }
    s.push_str("</table>\n");
    let total: u64 = v.per_minute.iter().sum();
    let _ = write!(
        s,
        "<h2>Calls per minute, last hour</h2>\n<p>Calls in the last hour: <span id=\"calls-last-hour\">{total}</span>.</p>\n{}\n",
        plot(&v.per_minute)
    );
    s.push_str("</body></html>\n");
    s
}

/// `GET /console` of `gw`, with nothing in front of it (the caller adds
/// its authentication layer).
pub(crate) fn router(gw: Arc<crate::Gateway>) -> axum::Router {
    axum::Router::new().route(
        CONSOLE_PATH,
        axum::routing::get(move || {
            let body = render(&view(&gw));
            async move {
                (
                    [
                        (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
                        (axum::http::header::CACHE_CONTROL, "no-store"),
                        (
                            axum::http::header::CONTENT_SECURITY_POLICY,
                            "default-src 'none'; style-src 'unsafe-inline'",
                        ),
                    ],
                    body,
                )
            }
        }),
    )
}

/// What the page shows of `gw` now.
fn view(gw: &crate::Gateway) -> View {
    let now = time::OffsetDateTime::now_utc();
    let proofs = gw.metrics.proofs();
    let policies = gw
        .commands()
        .values()
        .map(|c| c.policy.clone())
        .chain(gw.servers().iter().map(|(p, _)| p.clone()))
        .collect::<Vec<_>>();
    let tools = policies
        .iter()
        .map(|p| {
            let out = gw.service.out_of_service(&p.name);
            // The last proof: a run that did not hold is the last one
            // while the tool is out of service.
            let proof = match &out {
                Some(o) => Some(("did not hold".to_owned(), Some(o.at.clone()))),
                None => proofs.get(&p.name).map(|(verdict, at)| {
                    (
                        verdict.clone(),
                        at.and_then(|t| time::OffsetDateTime::from_unix_timestamp(t as i64).ok())
                            .map(stamp),
                    )
                }),
            };
            ToolRow {
                name: p.name.clone(),
                profile: cordon_broker::profile_name(p.profile).to_owned(),
                runtime: cordon_runtime::kind_name(p.runtime).to_owned(),
                out_of_service: out
                    .map(|o| format!("since {} ({}): {}", o.at, o.probes.join(", "), o.why)),
                proof,
            }
        })
        .collect();
    View {
        tools,
        sessions: gw.metrics.live_sessions(),
        sandboxes: gw.metrics.live_sandboxes(),
        refusals: gw.recent.refusals(),
        per_minute: gw.recent.per_minute(unix_minute(now)),
        now: stamp(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_everything_it_shows() {
        assert_eq!(
            esc(r#"<script>alert("x&'y")</script>"#),
            "&lt;script&gt;alert(&quot;x&amp;&#39;y&quot;)&lt;/script&gt;"
        );
        let v = View {
            tools: vec![ToolRow {
                name: "<b>t</b>".into(),
                profile: "P1".into(),
                runtime: "native".into(),
                out_of_service: Some("<img src=x>".into()),
                proof: Some(("held".into(), Some("2026-01-01T00:00:00Z".into()))),
            }],
            sessions: 1,
            sandboxes: 0,
            refusals: vec![RefusalRow {
                time: "t".into(),
                tool: "\"><svg onload=x>".into(),
                kind: "denied".into(),
                why: "<i>why</i>".into(),
            }],
            per_minute: vec![0; 60],
            now: "now".into(),
        };
        let page = render(&v);
        for raw in ["<b>t</b>", "<img src=x>", "<svg onload", "<i>why</i>"] {
            assert!(!page.contains(raw), "{raw} unescaped in {page}");
        }
        assert!(page.contains("&lt;b&gt;t&lt;/b&gt;"), "{page}");
        assert!(!page.contains("<script"), "{page}");
    }

    #[test]
    fn a_schema_refusal_shows_where_not_what() {
        let r = shown_reason(
            "wc: arguments refused by input_schema at /text: 424242 is not of type \"string\" (keyword `type`)",
        );
        assert_eq!(
            r,
            "wc: arguments refused by input_schema at /text (keyword `type`)"
        );
    }

    #[test]
    fn remembers_a_bounded_ring_and_counts_calls_per_minute() {
        let r = Recent::new();
        let base = time::OffsetDateTime::from_unix_timestamp(60 * 1_000_000).unwrap();
        for i in 0..(REFUSALS_KEPT + 5) {
            let mut rec = AuditRecord::new(format!("t{i}"), "P1");
            rec.time = base;
            rec.status = Status::Denied;
            rec.reason = Some(format!("r{i}"));
            r.recorded(&rec);
        }
        let rows = r.refusals();
        assert_eq!(rows.len(), REFUSALS_KEPT);
        assert_eq!(rows[0].tool, format!("t{}", REFUSALS_KEPT + 4));
        let mut ok = AuditRecord::new("t", "P1");
        ok.time = base + time::Duration::minutes(2);
        r.recorded(&ok);
        let mut session = AuditRecord::new("(session)", "");
        session.time = ok.time;
        session.status = Status::SessionEnded;
        r.recorded(&session);
        let m = r.per_minute(1_000_000 + 2);
        assert_eq!(m.len(), 60);
        assert_eq!(m[59], 1);
        assert_eq!(m[57], REFUSALS_KEPT as u64 + 5);
        // An hour later, all of it has left the plot.
        assert_eq!(r.per_minute(1_000_000 + 200).iter().sum::<u64>(), 0);
    }
}
