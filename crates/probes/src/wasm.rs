//! Probes of a `runtime: wasm` tool: cordon's probe module
//! (`crates/probes/wasm/probe.c`, built for wasm32-wasi into
//! `cordon-probe.wasm`) is run in place of the tool's module, through the
//! same runtime, with the tool's preopens, environment and limits, and
//! tries what a taken-over module would (see the C source). Each of its
//! lines, and the runtime's outcome where the runtime stops it, becomes a
//! verdict with its evidence.
//!
//! The catalogue's probes of system calls and namespaces do not apply to a
//! module, which makes no system call: they are reported skipped, saying
//! why. The jail around the runner is the native P1 jail, probed by
//! `cordon probe --profile P1`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use cordon_runtime::spec::WasmModule;
use cordon_runtime::{Context, Outcome, Runtime, SandboxSpec, Status};
use sha2::{Digest, Sha256};

use crate::report::{Category, ProbeResult, Report, Verdict};
use crate::suite::{CATALOGUE, Filter, ProbeInfo, Profile, probe_info};

/// The probe module's file name, where cordon looks for it.
pub const MODULE_NAME: &str = "cordon-probe.wasm";

/// The probe module as a WASI 0.2 command component (wasmtime's preview 1
/// adapter around it), beside [`MODULE_NAME`]: a tool that is a component
/// is probed by a component, through the WASI 0.2 host it is given.
pub const COMPONENT_NAME: &str = "cordon-probe.component.wasm";

/// Whether the file at `p` is a WebAssembly component (by its header:
/// version 0x0d, layer 1), not a core module.
pub fn is_component(p: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| head[..4] == *b"\0asm" && head[6..8] == [1, 0])
}

/// The start of each of the probe module's lines.
pub const LINE_PREFIX: &str = "cordon-probe: ";

/// The probes the module runs in one call (none of them ends it).
const IN_ONE_CALL: &[&str] = &["host_fs", "write", "env", "network", "fds", "tty"];

/// Why `network` is not run through a component: WASI preview 1's socket
/// calls are not carried by the adapter (they trap), and a component has
/// no socket to reach by any other way.
const COMPONENT_NETWORK: &str = "not applicable: a component is linked with no socket: the runtime refuses one that imports any wasi:sockets interface (this tool's own component was admitted, so it imports none), and the probe component's WASI preview 1 socket calls have no counterpart in the adapter";

/// The bound on one call past the tool's wall clock: the runtime stops the
/// module itself; this is for a sandbox that hangs.
const HARNESS_MARGIN: Duration = Duration::from_secs(60);

/// What the probe module lacks no matter what: the probes of system calls
/// and namespaces, which a module has not.
fn not_applicable(probe: &str) -> Option<&'static str> {
    Some(match probe {
        "metadata" | "host_loopback" | "private" | "egress" | "dns" => {
            "not applicable: a WASI preview 1 module cannot create, bind or connect a socket nor resolve a name; the only socket calls it has (sock_accept, sock_recv, sock_send, sock_shutdown on a socket the host preopened) are tried by `network`"
        }
        "processes" | "fork" | "daemon" => {
            "not applicable: WASI preview 1 has no call that starts a process or a thread; the runner's own tasks are bounded by the P1 jail (`cordon probe --profile P1`)"
        }
        "tmp_persist" | "disk" => {
            "not applicable: the module has no writable directory (the runner preopens the manifest's mounts read-only, see `write`), so nothing it could leave for the next call"
        }
        "fd_limit" => {
            "not applicable: the module opens only what its read-only preopens hold; the runner's descriptors are bounded by the P1 jail's nofile (`cordon probe --profile P1`)"
        }
        "mount" | "userns" | "ptrace" | "raw_socket" | "keyctl" | "bpf" | "io_uring" | "uid"
        | "caps" | "no_new_privs" => {
            "not applicable: the module has no system calls; WASI grants it only args, environ, clocks, random, fd and path calls under its preopens, poll, proc_exit and calls on preopened sockets, carried out by the runner, whose own system calls are held by the P1 jail (`cordon probe --profile P1`)"
        }
        _ => return None,
    })
}

/// The probe module: `opt`, else `$CORDON_WASM_PROBE`, else
/// [`MODULE_NAME`] beside this program, one directory up, or in
/// `../wasm/` (a checkout's `target/wasm`, where
/// `scripts/build-wasm-example.sh` builds it).
pub fn find_module(opt: Option<&Path>) -> Result<PathBuf, String> {
    let beside = [
        PathBuf::from(MODULE_NAME),
        Path::new("..").join(MODULE_NAME),
        Path::new("../wasm").join(MODULE_NAME),
    ];
    cordon_runtime::companion::find(
        opt,
        "CORDON_WASM_PROBE",
        &beside,
        &format!("probe module {MODULE_NAME}"),
        "build it with scripts/build-wasm-example.sh (from crates/probes/wasm/probe.c) or set CORDON_WASM_PROBE",
    )
}

/// A wasm tool as a probe target.
#[derive(Clone)]
pub struct WasmTarget {
    /// The runtime the tool runs in (the wasm runtime).
    pub runtime: Arc<dyn Runtime>,
    /// The tool's own specification, as admitted: its module is replaced
    /// by the probe module, everything else is kept.
    pub spec: SandboxSpec,
    /// The probe module.
    pub module: PathBuf,
    /// The environment variables the manifest gives the tool (by name):
    /// any other the module sees is an escape.
    pub env: Vec<String>,
    /// The tool is a component, probed by the probe component.
    pub component: bool,
}

impl WasmTarget {
    /// The tool's specification with the manifest's environment as the
    /// variables it claims. `module` is the probe module; a tool that is
    /// a component is probed by [`COMPONENT_NAME`] beside it.
    pub fn new(runtime: Arc<dyn Runtime>, spec: SandboxSpec, module: PathBuf) -> WasmTarget {
        let env = spec.env.iter().map(|(k, _)| k.clone()).collect();
        let component = spec.wasm.as_ref().is_some_and(|w| is_component(&w.path));
        let module = if component {
            module.with_file_name(COMPONENT_NAME)
        } else {
            module
        };
        WasmTarget {
            runtime,
            spec,
            module,
            env,
            component,
        }
    }

    /// The sandbox's name in reports.
    pub fn name(&self) -> String {
        format!(
            "cordon wasm runtime (the probe module {} as the module of {}, {} preopen(s), inside the native P1 jail)",
            self.module.display(),
            self.spec.tool,
            self.spec.mounts.len()
        )
    }

    /// Why `probe` does not apply to this tool, if it does not: the
    /// module's catalogue, and for a component also `network`.
    fn not_applicable(&self, probe: &str) -> Option<&'static str> {
        match not_applicable(probe) {
            None if self.component && probe == "network" => Some(COMPONENT_NETWORK),
            why => why,
        }
    }

    /// One call of the probe module with `args`: the runtime's outcome,
    /// or why there is none.
    fn call(&self, args: &[String]) -> Result<Outcome, String> {
        let bytes = std::fs::read(&self.module).map_err(|e| {
            format!(
                "the probe module {}: {e}{}",
                self.module.display(),
                if self.module.file_name() == Some(COMPONENT_NAME.as_ref()) {
                    " (the tool is a component: it is probed by the probe module built as one, by scripts/build-wasm-example.sh)"
                } else {
                    ""
                }
            )
        })?;
        let mut spec = self.spec.clone();
        spec.wasm = Some(WasmModule {
            path: self.module.clone(),
            sha256: hex::encode(Sha256::digest(&bytes)),
            // A tool served by a warm worker is probed through one.
            worker: self.spec.wasm.as_ref().is_some_and(|w| w.worker),
            // The probe module is a command, whatever the tool calls.
            function: None,
        });
        spec.argv = std::iter::once("cordon-probe".to_string())
            .chain(args.iter().cloned())
            .collect();
        let timeout = spec.limits.wall.saturating_add(HARNESS_MARGIN);
        let rt = self.runtime.clone();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(rt.run(&spec, Vec::new(), &Context::discard("probe")));
        });
        match rx.recv_timeout(timeout) {
            Ok(Ok(o)) => Ok(o),
            Ok(Err(e)) => Err(format!("the probe module did not run: {e}")),
            Err(_) => Err(format!(
                "the sandbox did not return within {:.1} s",
                timeout.as_secs_f64()
            )),
        }
    }
}

/// One of the module's lines: the probe, its outcome and what it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub probe: String,
    pub outcome: String,
    pub detail: String,
}

/// The module's lines in `text`.
pub fn lines(text: &[u8]) -> Vec<Line> {
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(LINE_PREFIX)?;
            let mut it = rest.splitn(3, ' ');
            Some(Line {
                probe: it.next()?.to_string(),
                outcome: it.next()?.to_string(),
                detail: it.next().unwrap_or_default().to_string(),
            })
        })
        .collect()
}

/// The verdict of a line whose outcome the module judged itself.
pub fn judge_line(line: &Line) -> (Verdict, String) {
    match line.outcome.as_str() {
        "refused" => (Verdict::Held, line.detail.clone()),
        "allowed" => (Verdict::Escaped, line.detail.clone()),
        other => (
            Verdict::Error,
            format!("the probe module answered `{other}`: {}", line.detail),
        ),
    }
}

/// The verdict of the `env` line: every variable named must be one the
/// manifest gives.
pub fn judge_env(line: &Line, allowed: &[String]) -> (Verdict, String) {
    if line.outcome != "list" {
        return judge_line(line);
    }
    let seen: Vec<&str> = line.detail.split("; ").filter(|s| !s.is_empty()).collect();
    let extra: Vec<&str> = seen
        .iter()
        .copied()
        .filter(|v| !allowed.iter().any(|a| a == v))
        .collect();
    if extra.is_empty() {
        (
            Verdict::Held,
            format!(
                "the module sees only the manifest's environment: {}",
                if seen.is_empty() {
                    "(none)".to_string()
                } else {
                    seen.join(", ")
                }
            ),
        )
    } else {
        (
            Verdict::Escaped,
            format!(
                "the module sees variables the manifest does not give: {} (the manifest gives {})",
                extra.join(", "),
                allowed.join(", ")
            ),
        )
    }
}

fn tail(b: &[u8]) -> String {
    let t = String::from_utf8_lossy(b);
    let t = t.trim();
    let start = t.char_indices().rev().nth(400).map_or(0, |(i, _)| i);
    t[start..].replace('\n', " | ")
}

/// How a call ended, for evidence.
fn ended(o: &Outcome) -> String {
    let mut s = match (o.exit_code, o.signal) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => "no exit status".into(),
    };
    s.push_str(&format!(", status {:?}", o.status));
    if !o.reason.is_empty() {
        s.push_str(&format!(": {}", o.reason));
    }
    let err = tail(&o.stderr);
    if !err.is_empty() {
        s.push_str(&format!("; stderr: {err}"));
    }
    s
}

fn result(
    info: &ProbeInfo,
    verdict: Verdict,
    evidence: String,
    duration: Duration,
    o: Option<&Outcome>,
) -> ProbeResult {
    let run = o.map(crate::runtime::run_result);
    ProbeResult {
        probe: info.name.to_string(),
        category: info.category,
        verdict,
        evidence,
        duration,
        exit_code: run.as_ref().and_then(|r| r.exit_code),
        signal: run.as_ref().and_then(|r| r.signal),
        status: run.map(|r| r.status),
    }
}

/// The verdict of a probe the runtime is expected to stop: held if it
/// stopped the module with `stop` (or the module says the runtime refused
/// it), escaped if the module says it got through.
fn judge_limit(probe: &str, o: &Outcome, stop: Status, from_stderr: bool) -> (Verdict, String) {
    let text = if from_stderr { &o.stderr } else { &o.stdout };
    let answer = lines(text)
        .into_iter()
        .rfind(|l| l.probe == probe && l.outcome != "growing" && l.outcome != "looping");
    if o.status == stop {
        return (
            Verdict::Held,
            format!("stopped by the runtime: {}", ended(o)),
        );
    }
    match answer {
        Some(l) => {
            let (v, ev) = judge_line(&l);
            (v, format!("{ev} ({})", ended(o)))
        }
        None => (
            Verdict::Error,
            format!("no answer from the probe module ({})", ended(o)),
        ),
    }
}

/// Run the probes of a wasm tool, as [`crate::run_suite`] runs the
/// catalogue: the control first (if it fails, every other probe is void),
/// then each probe `filter` allows; the catalogue's probes that do not
/// apply to a module are skipped, saying why. `profile` is what the tool
/// claims (its limits, from the manifest).
pub fn run_wasm_suite(target: &WasmTarget, profile: &Profile, filter: &Filter) -> Report {
    let mut results: Vec<ProbeResult> = Vec::new();
    let wanted = |name: &str| probe_info(name).is_some_and(|p| filter.allows(p));
    let in_one_call = |name: &&&str| wanted(name) && target.not_applicable(name).is_none();
    let info = |name: &str| -> &'static ProbeInfo {
        // Every name used here is in the catalogue (a test says so).
        probe_info(name).unwrap_or(&CATALOGUE[0])
    };

    // One call: the control and the probes that do not end the module.
    let mut args = vec!["control".to_string()];
    args.extend(
        IN_ONE_CALL
            .iter()
            .filter(in_one_call)
            .map(|p| p.to_string()),
    );
    let started = Instant::now();
    let first = target.call(&args);
    let took = started.elapsed();
    let control_ok = match &first {
        Err(why) => {
            results.push(result(
                info("control"),
                Verdict::Error,
                why.clone(),
                took,
                None,
            ));
            false
        }
        Ok(o) => {
            let ls = lines(&o.stdout);
            let control = ls.iter().find(|l| l.probe == "control");
            match control {
                Some(l) if l.outcome == "ran" && o.exit_code == Some(0) => {
                    results.push(result(
                        info("control"),
                        Verdict::Held,
                        format!("{}: {}", l.detail, ended(o)),
                        took,
                        Some(o),
                    ));
                    for name in IN_ONE_CALL.iter().filter(in_one_call) {
                        let (v, ev) = match ls.iter().find(|l| l.probe == *name) {
                            Some(l) if *name == "env" => judge_env(l, &target.env),
                            Some(l) => judge_line(l),
                            None => (
                                Verdict::Error,
                                format!("no answer from the probe module ({})", ended(o)),
                            ),
                        };
                        results.push(result(info(name), v, ev, took, Some(o)));
                    }
                    true
                }
                _ => {
                    results.push(result(
                        info("control"),
                        Verdict::Error,
                        format!("the probe module did not run as expected: {}", ended(o)),
                        took,
                        Some(o),
                    ));
                    false
                }
            }
        }
    };
    if !control_ok {
        for p in CATALOGUE
            .iter()
            .filter(|p| p.category != Category::Control && filter.allows(p))
        {
            results.push(ProbeResult {
                probe: p.name.to_string(),
                category: p.category,
                verdict: Verdict::Void,
                evidence: "not run: the control failed".into(),
                duration: Duration::ZERO,
                exit_code: None,
                signal: None,
                status: None,
            });
        }
        return report(target, profile, results);
    }

    // Two calls in a row (on one warm worker, for a tool served by one):
    // the second must see nothing of the first's globals or memory.
    if wanted("fresh_task") {
        let started = Instant::now();
        let calls = [0, 1].map(|_| target.call(&["fresh_task".to_string()]));
        let took = started.elapsed();
        let (v, ev, o) = match &calls {
            [Ok(_), Ok(second)] => match lines(&second.stdout)
                .iter()
                .find(|l| l.probe == "fresh_task")
            {
                Some(l) => {
                    let (v, ev) = judge_line(l);
                    (
                        v,
                        format!("the second of two calls in a row: {ev}"),
                        Some(second),
                    )
                }
                None => (
                    Verdict::Error,
                    format!("no answer from the probe module ({})", ended(second)),
                    Some(second),
                ),
            },
            [Err(e), _] | [_, Err(e)] => (Verdict::Error, e.clone(), None),
        };
        results.push(result(info("fresh_task"), v, ev, took, o));
    }

    // One call each: the runtime is expected to stop the module.
    let limits = &profile.limits;
    let limited: [(&str, Option<String>, Status, bool, &str); 3] = [
        (
            "memory",
            limits.memory_bytes.map(|b| format!("memory={b}")),
            Status::MemoryLimit,
            false,
            "the profile claims no memory limit",
        ),
        (
            "time",
            limits
                .wall
                .map(|w| format!("time={}", w.as_millis().saturating_add(1000))),
            Status::TimedOut,
            false,
            "the profile claims no wall clock",
        ),
        (
            "output",
            limits
                .output_bytes
                .map(|b| format!("output={}", b.saturating_add(64 << 10))),
            Status::OutputCap,
            true,
            "the profile claims no output cap",
        ),
    ];
    for (name, arg, stop, from_stderr, unclaimed) in limited {
        if !wanted(name) {
            continue;
        }
        let Some(arg) = arg else {
            results.push(result(
                info(name),
                Verdict::Skipped,
                unclaimed.into(),
                Duration::ZERO,
                None,
            ));
            continue;
        };
        let started = Instant::now();
        let r = target.call(&[arg]);
        let took = started.elapsed();
        let (v, ev, o) = match &r {
            Err(why) => (Verdict::Error, why.clone(), None),
            Ok(o) => {
                let (mut v, mut ev) = judge_limit(name, o, stop, from_stderr);
                // Output: what the caller got is what counts.
                if name == "output"
                    && let Some(cap) = limits.output_bytes
                {
                    let kept = o.stdout.len() as u64;
                    if kept > cap {
                        v = Verdict::Escaped;
                        ev = format!(
                            "{kept} bytes of output reached the caller, past the cap of {cap}: {ev}"
                        );
                    } else if v == Verdict::Escaped {
                        v = Verdict::Held;
                        ev = format!(
                            "the module wrote past the cap, but the caller got {kept} bytes, within the cap of {cap}: {ev}"
                        );
                    }
                }
                (v, ev, Some(o))
            }
        };
        results.push(result(info(name), v, ev, took, o));
    }

    for p in CATALOGUE.iter().filter(|p| filter.allows(p)) {
        if let Some(why) = target.not_applicable(p.name) {
            results.push(result(
                p,
                Verdict::Skipped,
                why.into(),
                Duration::ZERO,
                None,
            ));
        }
    }
    // Catalogue order, as the native report.
    results.sort_by_key(|r| CATALOGUE.iter().position(|p| p.name == r.probe));
    report(target, profile, results)
}

fn report(target: &WasmTarget, profile: &Profile, results: Vec<ProbeResult>) -> Report {
    Report {
        sandbox: target.name(),
        profile: profile.name.clone(),
        results,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalogue_probe_is_run_or_said_not_to_apply() {
        for p in CATALOGUE {
            let run = p.name == "control"
                || IN_ONE_CALL.contains(&p.name)
                || ["fresh_task", "memory", "time", "output"].contains(&p.name);
            assert!(
                run ^ not_applicable(p.name).is_some(),
                "{}: run and not applicable, or neither",
                p.name
            );
        }
        for p in IN_ONE_CALL {
            assert!(probe_info(p).is_some(), "{p}");
        }
    }

    #[test]
    fn lines_are_judged_by_outcome_and_env_against_the_manifest() {
        let ls = lines(
            b"noise\ncordon-probe: host_fs refused /etc/passwd: Capabilities insufficient\ncordon-probe: write allowed CREATED /x\ncordon-probe: env list PATH; HOME; AWS_SECRET\ncordon-probe: tty maybe x\n",
        );
        assert_eq!(ls.len(), 4);
        assert_eq!(judge_line(&ls[0]).0, Verdict::Held);
        assert_eq!(judge_line(&ls[1]), (Verdict::Escaped, "CREATED /x".into()));
        let allowed = vec!["PATH".to_string(), "HOME".to_string()];
        let (v, ev) = judge_env(&ls[2], &allowed);
        assert_eq!(v, Verdict::Escaped);
        assert!(
            ev.contains("AWS_SECRET") && !ev.contains("give: PATH"),
            "{ev}"
        );
        let mut all = allowed.clone();
        all.push("AWS_SECRET".into());
        assert_eq!(judge_env(&ls[2], &all).0, Verdict::Held);
        assert_eq!(judge_line(&ls[3]).0, Verdict::Error);
    }
}
