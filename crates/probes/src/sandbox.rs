//! The boundaries the probes run in: a [`Sandbox`] takes one agent
//! invocation ([`ProbeRun`]) and returns what happened ([`RunResult`]).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Bytes kept from the start of a stream.
pub const CAPTURE_HEAD: usize = 1 << 20;
/// Bytes kept from the end of a stream.
pub const CAPTURE_TAIL: usize = 64 << 10;
/// How long readers may drain the pipes after the sandbox exited.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// One agent invocation.
#[derive(Debug, Clone)]
pub struct ProbeRun {
    /// The agent's path on the host.
    pub agent: PathBuf,
    /// The agent's argv after its path (`__probe-agent NAME --key value...`).
    pub args: Vec<String>,
    /// Bytes on the agent's stdin.
    pub stdin: Vec<u8>,
    /// Canaries: variables set in the environment the sandbox is launched
    /// from. A sandbox that passes them on fails the env probe.
    pub env: Vec<(String, String)>,
    /// The harness's outer bound on the whole run.
    pub timeout: Duration,
}

/// Which limit a sandbox says it enforced.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// Memory cap (OOM kill or allocation refusal).
    Memory,
    /// Task / pid cap.
    Tasks,
    /// Wall-clock limit.
    Wall,
    /// CPU-time limit.
    Cpu,
    /// Output size cap.
    Output,
    /// Disk / file size cap.
    Disk,
    /// Descriptor cap.
    Files,
    /// Something else, named by the sandbox.
    Other(String),
}

/// How a run ended, as typed as the sandbox can say.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum RunStatus {
    /// The process exited on its own (see `exit_code`).
    Exited,
    /// The process died of a signal (see `signal`) the sandbox did not
    /// explain.
    Signaled,
    /// The sandbox stopped it for a limit.
    Limit(LimitKind),
    /// The harness's outer timeout fired: the sandbox hung.
    HarnessTimeout,
    /// The sandbox itself failed (setup error, refused the request).
    SandboxFailed,
}

/// A captured stream: the first [`CAPTURE_HEAD`] bytes, the last
/// [`CAPTURE_TAIL`] bytes, and the total count.
#[derive(Debug, Clone, Default)]
pub struct Capture {
    /// The first bytes.
    pub head: Vec<u8>,
    /// The last bytes (only when `total` exceeds the head).
    pub tail: Vec<u8>,
    /// Bytes the stream carried in all.
    pub total: u64,
    /// False when the stream was still open after the sandbox exited and
    /// the harness stopped reading (some process outlived the sandbox).
    pub complete: bool,
}

impl Capture {
    /// A capture of bytes another component already collected; `total` is
    /// how many the stream carried (at least `bytes.len()`).
    pub fn from_bytes(bytes: &[u8], total: u64) -> Capture {
        let mut c = Capture::default();
        c.push(bytes);
        c.finish();
        c.total = total.max(bytes.len() as u64);
        c.complete = true;
        c
    }

    fn push(&mut self, buf: &[u8]) {
        self.total += buf.len() as u64;
        let room = CAPTURE_HEAD.saturating_sub(self.head.len());
        let (h, rest) = buf.split_at(room.min(buf.len()));
        self.head.extend_from_slice(h);
        if !rest.is_empty() {
            self.tail.extend_from_slice(rest);
            if self.tail.len() > CAPTURE_TAIL * 2 {
                let cut = self.tail.len() - CAPTURE_TAIL;
                self.tail.drain(..cut);
            }
        }
    }

    fn finish(&mut self) {
        if self.tail.len() > CAPTURE_TAIL {
            let cut = self.tail.len() - CAPTURE_TAIL;
            self.tail.drain(..cut);
        }
    }

    /// Complete lines of the captured text: all of the head's, then the
    /// tail's after its first (possibly cut) line.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = String::from_utf8_lossy(&self.head)
            .lines()
            .map(str::to_string)
            .collect();
        if !self.tail.is_empty() {
            let t = String::from_utf8_lossy(&self.tail);
            out.extend(t.lines().skip(1).map(str::to_string));
        }
        out
    }

    /// The last `n` characters of the text, for error messages.
    pub fn last_text(&self, n: usize) -> String {
        let src = if self.tail.is_empty() {
            &self.head
        } else {
            &self.tail
        };
        let s = String::from_utf8_lossy(src);
        let s = s.trim();
        let start = s
            .char_indices()
            .rev()
            .nth(n.saturating_sub(1))
            .map_or(0, |(i, _)| i);
        s[start..].to_string()
    }
}

/// What happened to one agent invocation.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Exit code, when the process exited.
    pub exit_code: Option<i32>,
    /// Signal number, when it was killed.
    pub signal: Option<i32>,
    /// Typed status.
    pub status: RunStatus,
    /// The sandbox's own explanation, if it gave one.
    pub reason: Option<String>,
    /// Wall time of the whole run as the harness saw it.
    pub duration: Duration,
    /// The agent's stdout.
    pub stdout: Capture,
    /// The agent's (and the sandbox's) stderr.
    pub stderr: Capture,
}

/// Why a sandbox could not run the agent at all.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The launcher could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program that failed to start.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The agent could not be staged for the sandbox.
    #[error("cannot stage the probe agent {path}: {source}")]
    Stage {
        /// The agent or directory involved.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A prefix was empty or malformed.
    #[error("bad sandbox prefix: {0}")]
    Prefix(String),
    /// The sandbox backend refused or failed.
    #[error("sandbox failed: {0}")]
    Backend(String),
}

/// A boundary the probes can run in.
pub trait Sandbox {
    /// A short name for reports ("none", "bwrap ...", "jail").
    fn name(&self) -> String;
    /// Run the agent once. `Err` means the sandbox could not even try.
    fn run(&self, req: &ProbeRun) -> Result<RunResult, SandboxError>;
    /// Who answers `probe`'s system calls when it is not the host kernel
    /// (an application kernel such as gVisor's): added to the evidence.
    fn answered_by(&self, _probe: &str) -> Option<String> {
        None
    }
}

/// Run a prepared command with stdin, an outer timeout, and capped capture
/// of stdout and stderr. The command runs in its own process group, which
/// is killed when the timeout fires.
pub fn run_command(
    mut cmd: Command,
    stdin: &[u8],
    timeout: Duration,
) -> Result<RunResult, SandboxError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|source| SandboxError::Spawn { program, source })?;
    let pid = child.id();
    let reader = |r: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = mpsc::channel::<Capture>();
        if let Some(mut r) = r {
            thread::spawn(move || {
                let mut c = Capture::default();
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    match r.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => c.push(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                c.finish();
                c.complete = true;
                let _ = tx.send(c);
            });
        } else {
            let _ = tx.send(Capture {
                complete: true,
                ..Capture::default()
            });
        }
        rx
    };
    let out_rx = reader(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err_rx = reader(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    if let Some(mut si) = child.stdin.take() {
        let data = stdin.to_vec();
        thread::spawn(move || {
            let _ = si.write_all(&data);
        });
    }
    let (wait_tx, wait_rx) = mpsc::channel::<std::io::Result<ExitStatus>>();
    thread::spawn(move || {
        let _ = wait_tx.send(child.wait());
    });
    let mut timed_out = false;
    let status = match wait_rx.recv_timeout(timeout) {
        Ok(s) => s,
        Err(_) => {
            timed_out = true;
            // The group is ours: we created it with process_group(0) and its
            // leader has not been reaped yet (the waiter has not returned).
            if let Ok(p) = i32::try_from(pid) {
                let _ = killpg(Pid::from_raw(p), Signal::SIGKILL);
            }
            wait_rx
                .recv()
                .unwrap_or_else(|_| Err(std::io::Error::other("waiter thread vanished")))
        }
    };
    let duration = start.elapsed();
    let status = status.map_err(|e| SandboxError::Backend(format!("wait for {pid}: {e}")))?;
    let deadline = Instant::now() + DRAIN_GRACE;
    let take = |rx: mpsc::Receiver<Capture>| {
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_default()
    };
    let stdout = take(out_rx);
    let stderr = take(err_rx);
    let (exit_code, signal) = (status.code(), status.signal());
    let (st, reason) = if timed_out {
        (
            RunStatus::HarnessTimeout,
            Some(format!(
                "no result within {:.1} s; the harness killed the process group",
                timeout.as_secs_f64()
            )),
        )
    } else if signal.is_some() {
        (RunStatus::Signaled, None)
    } else {
        (RunStatus::Exited, None)
    };
    let reason = if !stdout.complete || !stderr.complete {
        Some(
            reason.map(|r| format!("{r}; ")).unwrap_or_default()
                + "a process kept the output pipe open after the sandbox exited",
        )
    } else {
        reason
    };
    Ok(RunResult {
        exit_code,
        signal,
        status: st,
        reason,
        duration,
        stdout,
        stderr,
    })
}

/// P0: the agent runs directly on the host, with the harness's environment
/// plus the canaries. Everything should escape; it is the suite's negative
/// control.
#[derive(Debug, Default, Clone)]
pub struct NoSandbox;

impl Sandbox for NoSandbox {
    fn name(&self) -> String {
        "none (P0, directly on the host)".into()
    }

    fn run(&self, req: &ProbeRun) -> Result<RunResult, SandboxError> {
        let mut c = Command::new(&req.agent);
        c.args(&req.args);
        c.envs(req.env.iter().map(|(k, v)| (k, v)));
        run_command(c, &req.stdin, req.timeout)
    }
}

/// Any other sandbox's command prefix: `bwrap ... --`, `nsjail ... --`,
/// `docker run --rm -i -v {agent_dir}:/a:ro IMAGE`, `srt`...
///
/// The agent is copied into a fresh directory (mode 0755) so the prefix can
/// bind it. In the prefix, `{agent}` is replaced by the copy's path and
/// `{agent_dir}` by its directory. If the prefix mentions either
/// placeholder it names the executable itself and only the agent's
/// arguments are appended; otherwise the copy's host path and the
/// arguments are appended.
#[derive(Debug)]
pub struct PrefixSandbox {
    prefix: Vec<String>,
    dir: tempfile::TempDir,
    staged_from: std::sync::Mutex<Option<PathBuf>>,
}

/// File name of the staged agent copy.
pub const STAGED_AGENT_NAME: &str = "cordon-probe-agent";

/// Copies `src` to `dst` in a `cp` child, so that no process but that
/// child ever holds `dst` open for writing. Copied in this process, the
/// open file would be inherited by any child another thread forks meanwhile
/// (close-on-exec closes it only at that child's exec), and running the
/// copy while such a child lives fails with `ETXTBSY` ("Text file busy").
fn copy_in_child(src: &Path, dst: &Path) -> std::io::Result<()> {
    let out = std::process::Command::new("cp")
        .arg("--")
        .arg(src)
        .arg(dst)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "cp {} {}: {} ({})",
        src.display(),
        dst.display(),
        String::from_utf8_lossy(&out.stderr).trim(),
        out.status
    )))
}

impl PrefixSandbox {
    /// A prefix sandbox. The prefix must name a program.
    pub fn new(prefix: Vec<String>) -> Result<Self, SandboxError> {
        if prefix.first().is_none_or(|p| p.is_empty()) {
            return Err(SandboxError::Prefix("the prefix names no program".into()));
        }
        let dir = tempfile::Builder::new()
            .prefix("cordon-probe-")
            .tempdir()
            .map_err(|source| SandboxError::Stage {
                path: std::env::temp_dir(),
                source,
            })?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).map_err(
            |source| SandboxError::Stage {
                path: dir.path().to_path_buf(),
                source,
            },
        )?;
        Ok(PrefixSandbox {
            prefix,
            dir,
            staged_from: std::sync::Mutex::new(None),
        })
    }

    /// The directory the agent copy lives in.
    pub fn agent_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The agent copy's path.
    pub fn staged_agent(&self) -> PathBuf {
        self.dir.path().join(STAGED_AGENT_NAME)
    }

    fn stage(&self, agent: &Path) -> Result<PathBuf, SandboxError> {
        let dst = self.staged_agent();
        let mut g = self
            .staged_from
            .lock()
            .map_err(|_| SandboxError::Backend("staging lock poisoned".into()))?;
        if g.as_deref() != Some(agent) {
            let err = |source| SandboxError::Stage {
                path: agent.to_path_buf(),
                source,
            };
            let tmp = self.dir.path().join(".staging");
            copy_in_child(agent, &tmp).map_err(err)?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).map_err(err)?;
            std::fs::rename(&tmp, &dst).map_err(err)?;
            *g = Some(agent.to_path_buf());
        }
        Ok(dst)
    }

    /// The full argv for one run.
    pub fn argv(&self, agent_copy: &Path, args: &[String]) -> Vec<OsString> {
        let a = agent_copy.to_string_lossy();
        let d = self.dir.path().to_string_lossy();
        let mut named = false;
        let mut v: Vec<OsString> = self
            .prefix
            .iter()
            .map(|p| {
                if p.contains("{agent}") || p.contains("{agent_dir}") {
                    named = true;
                }
                OsString::from(p.replace("{agent_dir}", &d).replace("{agent}", &a))
            })
            .collect();
        if !named {
            v.push(agent_copy.as_os_str().to_owned());
        }
        v.extend(args.iter().map(OsString::from));
        v
    }
}

impl Sandbox for PrefixSandbox {
    fn name(&self) -> String {
        self.prefix.join(" ")
    }

    fn run(&self, req: &ProbeRun) -> Result<RunResult, SandboxError> {
        let copy = self.stage(&req.agent)?;
        let argv = self.argv(&copy, &req.args);
        let (prog, rest) = argv
            .split_first()
            .ok_or_else(|| SandboxError::Prefix("empty command".into()))?;
        let mut c = Command::new(prog);
        c.args(rest);
        c.envs(req.env.iter().map(|(k, v)| (k, v)));
        run_command(c, &req.stdin, req.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_head_and_tail_lines() {
        let mut c = Capture::default();
        c.push(b"{\"first\":1}\n");
        let filler = vec![b'A'; CAPTURE_HEAD];
        c.push(&filler);
        c.push(b"\n{\"last\":2}\n");
        c.finish();
        assert_eq!(c.total, (CAPTURE_HEAD + 24) as u64);
        let lines = c.lines();
        assert_eq!(lines.first().map(String::as_str), Some("{\"first\":1}"));
        assert_eq!(lines.last().map(String::as_str), Some("{\"last\":2}"));
        assert!(c.tail.len() <= CAPTURE_TAIL);
    }

    #[test]
    fn prefix_placeholders() {
        let sb = PrefixSandbox::new(vec![
            "bwrap".into(),
            "--ro-bind".into(),
            "{agent_dir}".into(),
            "/.cordon".into(),
            "--".into(),
            "/.cordon/cordon-probe-agent".into(),
        ])
        .unwrap();
        let copy = sb.staged_agent();
        let argv = sb.argv(&copy, &["__probe-agent".into(), "env".into()]);
        let argv: Vec<String> = argv
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert_eq!(argv[2], sb.agent_dir().to_string_lossy());
        assert_eq!(argv[5], "/.cordon/cordon-probe-agent");
        assert_eq!(&argv[6..], ["__probe-agent", "env"]);

        let sb = PrefixSandbox::new(vec!["env".into(), "-i".into()]).unwrap();
        let argv = sb.argv(&copy, &["x".into()]);
        assert_eq!(argv[2], copy.as_os_str());
        assert_eq!(argv[3], "x");
        assert!(PrefixSandbox::new(vec![]).is_err());
    }

    #[test]
    fn run_command_times_out_and_kills_the_group() {
        let mut c = Command::new("sh");
        c.args(["-c", "sleep 30 & sleep 30"]);
        let r = run_command(c, b"", Duration::from_millis(300)).unwrap();
        assert_eq!(r.status, RunStatus::HarnessTimeout);
        assert_eq!(r.signal, Some(9));
        // Both sleeps were in the group and died with it, so the pipes
        // closed and the capture completed.
        assert!(r.stdout.complete);
    }

    #[test]
    fn run_command_captures_exit_and_output() {
        let mut c = Command::new("sh");
        c.args(["-c", "cat; echo err >&2; exit 7"]);
        let r = run_command(c, b"in\n", Duration::from_secs(20)).unwrap();
        assert_eq!(r.status, RunStatus::Exited);
        assert_eq!(r.exit_code, Some(7));
        assert_eq!(r.stdout.lines(), vec!["in"]);
        assert_eq!(r.stderr.last_text(10), "err");
    }
}
