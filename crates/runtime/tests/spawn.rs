//! The native runtime's `spawn`: a long-lived sandbox with one byte stream
//! as its stdin and stdout, no shell in between, every limit in force.

use std::io::{BufRead, BufReader, Read, Write};
use std::time::Duration;

use cordon_runtime::native::Native;
use cordon_runtime::{Context, Runtime, SandboxSpec, Status};

fn native() -> Native {
    Native::new(Default::default()).expect("native runtime")
}

fn cat(output_bytes: u64) -> SandboxSpec {
    // /bin/cat itself is the sandbox's first process: no /bin/sh prologue.
    let mut spec = SandboxSpec::new("cat", ["/bin/cat"]);
    spec.limits.output_bytes = output_bytes;
    spec.limits.wall = Duration::from_secs(20);
    spec
}

#[test]
fn a_spawned_sandbox_talks_over_one_stream_and_ends_at_eof() {
    let rt = native();
    let s = rt.spawn(&cat(1024), &Context::discard("t")).expect("spawn");
    let mut w = s.stream.try_clone().unwrap();
    let mut r = BufReader::new(s.stream);
    w.write_all(b"{\"jsonrpc\":\"2.0\"}\n").unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "{\"jsonrpc\":\"2.0\"}\n");
    assert!(s.handle.outcome().is_none(), "still running");
    // End of input: cat exits 0.
    w.shutdown(std::net::Shutdown::Write).unwrap();
    let o = s.handle.wait().expect("outcome");
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.output_bytes, 18);
}

#[test]
fn a_message_over_the_output_cap_kills_the_sandbox() {
    let rt = native();
    let s = rt.spawn(&cat(1024), &Context::discard("t")).expect("spawn");
    let mut w = s.stream.try_clone().unwrap();
    // Positive control: many messages under the cap pass, in total far
    // more than the cap.
    let mut r = BufReader::new(s.stream.try_clone().unwrap());
    for _ in 0..8 {
        w.write_all(&[b'a'; 70000]).unwrap();
        w.write_all(b"\n").unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert_eq!(line.len(), 70001);
    }
    // One message (line) over the cap.
    let _ = w.write_all(&[b'b'; 80000]);
    let o = s.handle.wait().expect("outcome");
    assert_eq!(o.status, Status::OutputCap, "{o:?}");
    assert!(
        o.reason
            .contains("a message over the output cap (71680 bytes)"),
        "{}",
        o.reason
    );
    // The over-long message never reached the stream.
    let mut rest = Vec::new();
    let _ = r.read_to_end(&mut rest);
    assert!(
        !rest.contains(&b'b'),
        "{} bytes leaked: {:?}",
        rest.len(),
        String::from_utf8_lossy(&rest[..rest.len().min(80)])
    );
}

#[test]
fn kill_stops_the_sandbox() {
    let rt = native();
    let s = rt.spawn(&cat(1024), &Context::discard("t")).expect("spawn");
    assert!(s.handle.outcome().is_none());
    s.handle.kill();
    let o = s.handle.wait().expect("outcome");
    assert_eq!(o.status, Status::Killed, "{o:?}");
    assert_eq!(o.signal, Some(9));
    // The stream is closed once the sandbox is gone.
    let mut buf = [0u8; 1];
    let mut st = s.stream;
    assert_eq!(st.read(&mut buf).unwrap(), 0);
}

/// The warm pool is generic: here over the native runtime. Starts that
/// keep failing stop the refill, and it says why; tasks then cold-start.
#[test]
fn a_pool_whose_starts_fail_stops_refilling_and_says_why() {
    use cordon_runtime::pool::{Pool, Settings};
    use std::sync::Arc;
    let rt: Arc<dyn Runtime> = Arc::new(native());
    // Positive control: a working spec fills its pool and serves a task.
    let p = Pool::new(
        rt.clone(),
        cat(1024),
        Settings {
            size: 1,
            refill: true,
        },
        None,
    )
    .unwrap();
    assert!(p.wait_idle(1, Duration::from_secs(20)), "{:?}", p.stopped());
    let (o, pooled) = p.run(b"hi".to_vec(), &Context::discard("t")).unwrap();
    assert!(pooled);
    assert_eq!(
        (o.status, o.stdout.as_slice()),
        (Status::Ok, &b"hi"[..]),
        "{o:?}"
    );
    // A runtime whose sandboxes never start.
    struct Failing;
    impl Runtime for Failing {
        fn name(&self) -> &'static str {
            "failing"
        }
        fn check(&self, _: &SandboxSpec) -> cordon_runtime::Check {
            Default::default()
        }
        fn run(
            &self,
            _: &SandboxSpec,
            _: Vec<u8>,
            _: &Context,
        ) -> Result<cordon_runtime::Outcome, cordon_runtime::RunError> {
            Err(cordon_runtime::RunError::Setup(
                "cold start failed too".into(),
            ))
        }
        fn spawn(
            &self,
            _: &SandboxSpec,
            _: &Context,
        ) -> Result<cordon_runtime::Spawned, cordon_runtime::RunError> {
            Err(cordon_runtime::RunError::Setup("no sandbox today".into()))
        }
        fn facts(&self) -> cordon_runtime::Facts {
            cordon_runtime::Facts {
                runtime: "failing",
                mechanisms: Vec::new(),
                notes: Vec::new(),
            }
        }
    }
    let bad = cat(1024);
    let dir = cordon_testkit::scratch();
    let p = Pool::new(
        Arc::new(Failing),
        bad,
        Settings {
            size: 2,
            refill: true,
        },
        Some(dir.path().into()),
    )
    .unwrap();
    let mut why = None;
    for _ in 0..400 {
        why = p.stopped();
        if why.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let why = why.expect("the refill stopped");
    assert!(
        why == "pool of cat: refill stopped after 3 failed starts in a row (last: no sandbox today); tasks cold-start",
        "{why}"
    );
    let status = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(status, 1, "no status file for doctor");
    // An empty pool cold-starts.
    let r = p.run(Vec::new(), &Context::discard("t"));
    assert_eq!(r.unwrap_err().to_string(), "cold start failed too");
}
