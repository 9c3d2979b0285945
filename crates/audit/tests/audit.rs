use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cordon_audit::*;
use cordon_gate::{Gate, GatePolicy, OutputKind, ToolMeta};

fn rec(tool: &str, n: u64) -> AuditRecord {
    let mut r = AuditRecord::new(tool, "P1");
    r.runtime = "native".into();
    r.session = "s-1".into();
    r.caller = "agent".into();
    r.duration_ms = n;
    r.input = Payload::of(format!("input {n}").as_bytes(), false);
    r.output = Payload::of(b"out", false);
    r.exit_code = Some(0);
    r
}

fn all(path: &std::path::Path) -> Vec<AuditRecord> {
    query(path, &Filter::default())
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

#[test]
fn records_round_trip_as_one_json_line_each() {
    let dir = cordon_testkit::scratch();
    let path = dir.path().join("sub/audit.jsonl");
    let log = AuditLog::new().with_sink(FileSink::open(&path, Rotation::default()).unwrap());
    let mut r = rec("pdf_to_text", 1);
    r.egress.push(EgressEvent {
        name: "api.example.test".into(),
        port: 443,
        address: Some("127.0.0.1".parse().unwrap()),
        decision: Decision::Allow,
        reason: None,
        bytes_up: 10,
        bytes_down: 20,
        duration_ms: 3,
        injected: Vec::new(),
        exfiltration: None,
        reflected: Vec::new(),
    });
    r.limits_hit.push("memory".into());
    log.record(&r).unwrap();
    log.record(&rec("pdf_to_text", 2)).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 2);
    assert!(text.ends_with('\n'));
    let back = all(&path);
    assert_eq!(back[0], r);
    assert_eq!(back[1].duration_ms, 2);
    // Hash and size, not content.
    let v: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(v["input"]["bytes"], 7);
    let h = v["input"]["sha256"].as_str().unwrap();
    assert_eq!(h.len(), 64);
    assert!(h.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(v["input"].get("content").is_none());
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn payload_hash_is_sha256_and_content_only_on_request() {
    let p = Payload::of(b"abc", false);
    assert_eq!(
        p.sha256,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(p.bytes, 3);
    assert_eq!(p.content, None);
    let p = Payload::of(b"a\x1b[31mb\xff", true);
    assert_eq!(p.content.as_deref(), Some("a\\u{1b}[31mb\u{FFFD}"));
}

#[test]
fn rotation_keeps_n_files_and_query_reads_them_in_order() {
    let dir = cordon_testkit::scratch();
    let path = dir.path().join("audit.jsonl");
    let rotation = Rotation {
        max_bytes: 2000,
        keep: 3,
    };
    let log = AuditLog::new().with_sink(FileSink::open(&path, rotation).unwrap());
    for n in 0..100 {
        log.record(&rec("t", n)).unwrap();
    }
    let files = log_files(&path);
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "audit.jsonl.3",
            "audit.jsonl.2",
            "audit.jsonl.1",
            "audit.jsonl"
        ]
    );
    assert!(!dir.path().join("audit.jsonl.4").exists());
    for f in &files {
        assert!(
            std::fs::metadata(f).unwrap().len() <= 2000,
            "{f:?} over max_bytes"
        );
    }
    let back = all(&path);
    assert!(back.len() < 100, "old records were rotated away");
    let ns: Vec<u64> = back.iter().map(|r| r.duration_ms).collect();
    let expected: Vec<u64> = (100 - ns.len() as u64..100).collect();
    assert_eq!(ns, expected, "records in time order, newest kept");
}

#[test]
fn concurrent_writers_never_interleave_lines() {
    let dir = cordon_testkit::scratch();
    let path = dir.path().join("audit.jsonl");
    let big = Rotation {
        max_bytes: u64::MAX,
        keep: 1,
    };
    // One shared log (threads) plus a second, independent sink on the same file (as a second
    // process would have): neither may tear a line.
    let shared = Arc::new(AuditLog::new().with_sink(FileSink::open(&path, big).unwrap()));
    let other = Arc::new(AuditLog::new().with_sink(FileSink::open(&path, big).unwrap()));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log = if t % 2 == 0 {
                shared.clone()
            } else {
                other.clone()
            };
            std::thread::spawn(move || {
                for n in 0..100 {
                    let mut r = rec(&format!("tool{t}"), n);
                    r.set_stderr(&vec![b'a' + t as u8; 6000]);
                    log.record(&r).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 800);
    for line in text.lines() {
        let r: AuditRecord = serde_json::from_str(line).unwrap();
        let t: u8 = r.tool[4..].parse().unwrap();
        assert_eq!(
            r.stderr.unwrap(),
            String::from(char::from(b'a' + t)).repeat(6000)
        );
    }
}

#[test]
fn secrets_are_redacted_everywhere_in_all_forms() {
    let secret = "ghp_S3cretT0kenValue";
    let b64 = "Z2hwX1MzY3JldFQwa2VuVmFsdWU="; // base64 of the secret
    let hex_form = "6768705f53336372657454306b656e56616c7565";
    let mut r = rec("jira_search", 1);
    r.set_stderr(format!("401: token {secret} rejected; basic {b64}; dump {hex_form}").as_bytes());
    r.reason = Some(format!("upstream said {secret}"));
    r.warnings.push(format!("env had {secret}"));
    r.egress.push(EgressEvent {
        name: format!("{secret}.example.test"),
        port: 443,
        address: None,
        decision: Decision::Deny,
        reason: Some(format!("sni {secret}")),
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 0,
        injected: Vec::new(),
        exfiltration: None,
        reflected: Vec::new(),
    });
    r.output = Payload::of(format!("the token is {secret}").as_bytes(), true);

    // Positive control: without redactions the secret is in the line.
    let plain = AuditLog::new().to_line(&r).unwrap();
    assert!(plain.contains(secret) && plain.contains(b64) && plain.contains(hex_form));

    let dir = cordon_testkit::scratch();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::new()
        .with_sink(FileSink::open(&path, Rotation::default()).unwrap())
        .with_redactions(vec![
            Secret::new("JIRA_TOKEN", secret),
            Secret::new("EMPTY", ""),
        ]);
    log.record(&r).unwrap();
    let line = std::fs::read_to_string(&path).unwrap();
    assert!(!line.contains(secret), "{line}");
    assert!(!line.contains(b64), "{line}");
    assert!(!line.contains(hex_form), "{line}");
    assert_eq!(line.matches("[REDACTED:JIRA_TOKEN]").count(), 8, "{line}");
    let back = &all(&path)[0];
    assert_eq!(
        back.stderr.as_deref(),
        Some(
            "401: token [REDACTED:JIRA_TOKEN] rejected; basic [REDACTED:JIRA_TOKEN]; dump [REDACTED:JIRA_TOKEN]"
        )
    );
    assert_eq!(back.egress[0].name, "[REDACTED:JIRA_TOKEN].example.test");
    assert_eq!(
        back.output.content.as_deref(),
        Some("the token is [REDACTED:JIRA_TOKEN]")
    );
}

#[test]
fn stderr_is_escaped_capped_and_never_parsed() {
    let mut r = rec("t", 1);
    let mut raw = b"{\"status\":\"ok\"}\x1b]0;owned\x07\r\n\xfe".to_vec();
    raw.extend(std::iter::repeat_n(b'x', 20_000));
    r.set_stderr(&raw);
    let s = r.stderr.as_deref().unwrap();
    assert!(
        s.starts_with("{\"status\":\"ok\"}\\u{1b}]0;owned\\u{7}\\u{d}\n\u{FFFD}xxx"),
        "{}",
        &s[..60]
    );
    assert!(s.len() <= STDERR_CAP + 32);
    assert!(s.ends_with(" bytes]"));
    assert!(!s.chars().any(|c| c.is_control() && c != '\n'));
}

#[test]
fn query_filters_by_tool_time_and_denial() {
    let dir = cordon_testkit::scratch();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::new().with_sink(FileSink::open(&path, Rotation::default()).unwrap());
    let mut old = rec("a", 0);
    old.time -= time::Duration::hours(3);
    old.status = Status::Denied;
    log.record(&old).unwrap();
    log.record(&rec("a", 1)).unwrap();
    let mut refused = rec("b", 2);
    refused.status = Status::Refused;
    log.record(&refused).unwrap();
    let mut egress_denied = rec("b", 3);
    egress_denied.egress.push(EgressEvent {
        name: "metadata".into(),
        port: 80,
        address: Some("169.254.169.254".parse().unwrap()),
        decision: Decision::Deny,
        reason: Some("link-local".into()),
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 0,
        injected: Vec::new(),
        exfiltration: None,
        reflected: Vec::new(),
    });
    log.record(&egress_denied).unwrap();
    let mut gate_refused = rec("c", 4);
    let refusal = cordon_gate::GateRefusal::InvalidUtf8 { offset: 3 };
    gate_refused.gate = Some(GateSummary::refused(OutputKind::Text, 9, &refusal));
    log.record(&gate_refused).unwrap();

    let ids =
        |f: Filter| -> Vec<u64> { query(&path, &f).map(|r| r.unwrap().duration_ms).collect() };
    assert_eq!(ids(Filter::default()), [0, 1, 2, 3, 4]);
    assert_eq!(
        ids(Filter {
            tool: Some("a".into()),
            ..Filter::default()
        }),
        [0, 1]
    );
    assert_eq!(
        ids(Filter {
            since: Some(parse_duration("2h").unwrap()),
            ..Filter::default()
        }),
        [1, 2, 3, 4]
    );
    assert_eq!(
        ids(Filter {
            denied_only: true,
            ..Filter::default()
        }),
        [0, 2, 3, 4]
    );
    assert_eq!(
        ids(Filter {
            tool: Some("b".into()),
            since: Some(Duration::from_secs(600)),
            denied_only: true,
            ..Filter::default()
        }),
        [2, 3]
    );
}

#[test]
fn query_reports_bad_lines_and_goes_on() {
    let dir = cordon_testkit::scratch();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::new().with_sink(FileSink::open(&path, Rotation::default()).unwrap());
    log.record(&rec("t", 1)).unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .map(|mut f| std::io::Write::write_all(&mut f, b"{not json\n"))
        .unwrap()
        .unwrap();
    log.record(&rec("t", 2)).unwrap();
    let items: Vec<_> = query(&path, &Filter::default()).collect();
    assert_eq!(items.len(), 3);
    assert_eq!(items[0].as_ref().unwrap().duration_ms, 1);
    match &items[1] {
        Err(AuditError::Parse { line, .. }) => assert_eq!(*line, 2),
        other => panic!("{other:?}"),
    }
    assert_eq!(items[2].as_ref().unwrap().duration_ms, 2);
}

#[test]
fn tail_prints_the_last_n_across_rotations() {
    let dir = cordon_testkit::scratch();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::new().with_sink(
        FileSink::open(
            &path,
            Rotation {
                max_bytes: 1500,
                keep: 4,
            },
        )
        .unwrap(),
    );
    for n in 0..20 {
        log.record(&rec("t", n)).unwrap();
    }
    assert!(dir.path().join("audit.jsonl.1").exists());
    let mut out = Vec::new();
    tail(&path, 7, false, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let durations: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().find(|w| w.ends_with("ms")).unwrap())
        .collect();
    assert_eq!(
        durations,
        ["13ms", "14ms", "15ms", "16ms", "17ms", "18ms", "19ms"]
    );
}

#[test]
fn tail_follow_sees_new_records_and_rotation() {
    let dir = cordon_testkit::scratch();
    let path = dir.path().join("audit.jsonl");
    let log = Arc::new(
        AuditLog::new().with_sink(
            FileSink::open(
                &path,
                Rotation {
                    max_bytes: 1500,
                    keep: 2,
                },
            )
            .unwrap(),
        ),
    );
    log.record(&rec("t", 0)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let writer = {
        let (log, stop) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            // Wait until the follower has printed its backlog, then write past a rotation.
            rx.recv().unwrap();
            for n in 1..=12 {
                log.record(&rec("t", n)).unwrap();
                std::thread::sleep(Duration::from_millis(30));
            }
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::Relaxed);
        })
    };
    struct Signal(Vec<u8>, Option<std::sync::mpsc::Sender<()>>);
    impl std::io::Write for Signal {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            if let Some(tx) = self.1.take() {
                let _ = tx.send(());
            }
            Ok(())
        }
    }
    let mut out = Signal(Vec::new(), Some(tx));
    tail_until(&path, 1, Some(&stop), Duration::from_millis(10), &mut out).unwrap();
    writer.join().unwrap();
    assert!(
        dir.path().join("audit.jsonl.1").exists(),
        "the writer rotated"
    );
    let text = String::from_utf8(out.0).unwrap();
    let durations: Vec<u64> = text
        .lines()
        .map(|l| {
            l.split_whitespace()
                .find(|w| w.ends_with("ms"))
                .unwrap()
                .trim_end_matches("ms")
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(durations, (0..=12).collect::<Vec<u64>>(), "{text}");
}

#[test]
fn render_line_escapes_everything_the_tool_controls() {
    let mut r = rec("evil\x1b[2J", 5);
    r.status = Status::ToolError;
    r.exit_code = Some(2);
    r.reason = Some("line1\nline2 \u{202E}gnp.exe \"quoted\"".into());
    r.limits_hit.push("pids".into());
    let line = render_line(&r);
    assert!(!line.contains('\n'));
    assert!(
        !line
            .chars()
            .any(|c| c.is_control() || cordon_gate::is_stripped_char(c)),
        "{line:?}"
    );
    assert!(
        line.contains("tool_error tool=\"evil\\u{1b}[2J\""),
        "{line}"
    );
    assert!(
        line.contains("reason=\"line1\\nline2 \\u{202e}gnp.exe \\\"quoted\\\"\""),
        "{line}"
    );
    assert!(
        line.contains(" exit=2 5ms in=7B out=3B limits=\"pids\""),
        "{line}"
    );
    assert!(
        line.len() > 20 && line.as_bytes()[10] == b'T' && line.as_bytes()[19] == b'Z',
        "{line}"
    );
}

#[test]
fn gate_summary_from_a_gated_result() {
    let gate = Gate::new(GatePolicy::default()).unwrap();
    let gated = gate
        .check(&ToolMeta::new("t", "P1"), b"\x1b[1mhi\x00")
        .unwrap();
    let g = GateSummary::from(&gated.envelope);
    assert_eq!(g.kind, "text");
    assert_eq!((g.bytes_in, g.bytes_out), (7, 2));
    assert_eq!(g.stripped.get("ansi"), Some(&1));
    assert_eq!(g.stripped.get("control"), Some(&1));
    assert_eq!(g.stripped.len(), 2);
    let mut r = rec("t", 1);
    r.gate = Some(g);
    assert!(!r.is_denied());
}

#[test]
fn query_filters_by_principal_and_tenant_and_the_line_shows_them() {
    let dir = cordon_testkit::scratch();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::new().with_sink(FileSink::open(&path, Rotation::default()).unwrap());
    let of = |n: u64, principal: Option<&str>, tenant: Option<&str>| {
        let mut r = rec("t", n);
        r.principal = principal.map(Into::into);
        r.tenant = tenant.map(Into::into);
        r
    };
    log.record(&of(0, Some("alice"), Some("acme"))).unwrap();
    log.record(&of(1, Some("bob"), Some("globex"))).unwrap();
    log.record(&of(2, Some("alice"), Some("globex"))).unwrap();
    // A record written before principals existed.
    log.record(&of(3, None, None)).unwrap();
    let ids =
        |f: Filter| -> Vec<u64> { query(&path, &f).map(|r| r.unwrap().duration_ms).collect() };
    let by = |p: Option<&str>, t: Option<&str>| Filter {
        principal: p.map(Into::into),
        tenant: t.map(Into::into),
        ..Filter::default()
    };
    assert_eq!(ids(by(Some("alice"), None)), [0, 2]);
    assert_eq!(ids(by(None, Some("globex"))), [1, 2]);
    assert_eq!(ids(by(Some("alice"), Some("globex"))), [2]);
    assert_eq!(ids(by(Some("carol"), None)), Vec::<u64>::new());
    assert_eq!(ids(by(None, None)), [0, 1, 2, 3]);

    let line = render_line(&of(4, Some("al\"ice"), Some("acme")));
    assert!(
        line.contains(" caller=\"agent\" principal=\"al\\\"ice\" tenant=\"acme\""),
        "{line}"
    );
    let line = render_line(&of(5, None, None));
    assert!(
        !line.contains("principal=") && !line.contains("tenant="),
        "{line}"
    );
}

#[test]
fn the_line_shows_credential_events_and_what_the_door_did_with_a_secret() {
    let mut r = rec("jira_search", 1);
    r.credential = Some(CredentialEvent {
        event: "mint".into(),
        secret: "JIRA_TOKEN".into(),
        provider: "idp".into(),
        scope: "read:issues".into(),
        ttl_seconds: 900,
        audience: None,
        deliver: "proxy".into(),
        expires_at: None,
    });
    let line = render_line(&r);
    assert!(
        line.contains(
            " credential=mint:\"JIRA_TOKEN\" provider=\"idp\" scope=\"read:issues\" ttl=900s deliver=proxy"
        ),
        "{line}"
    );
    let mut r = rec("jira_search", 2);
    let door =
        |injected: Vec<String>, exfiltration: Option<String>, reflected: Vec<String>| EgressEvent {
            name: "jira.example".into(),
            port: 443,
            address: None,
            decision: Decision::Allow,
            reason: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            injected,
            exfiltration,
            reflected,
        };
    r.egress.push(door(
        vec!["JIRA_TOKEN".into()],
        None,
        vec!["JIRA_TOKEN".into()],
    ));
    r.egress
        .push(door(Vec::new(), Some("A\"B".into()), Vec::new()));
    // The control: an entry with none of them adds nothing.
    r.egress.push(door(Vec::new(), None, Vec::new()));
    let line = render_line(&r);
    assert!(
        line.ends_with(
            " egress=allow:\"jira.example\":443 injected=\"JIRA_TOKEN\" reflected=\"JIRA_TOKEN\" egress=allow:\"jira.example\":443 exfiltration=\"A\\\"B\" egress=allow:\"jira.example\":443"
        ),
        "{line}"
    );
    assert_eq!(line.matches("injected=").count(), 1, "{line}");
    assert_eq!(line.matches("exfiltration=").count(), 1, "{line}");
    assert!(!line.contains("credential="), "{line}");
}
