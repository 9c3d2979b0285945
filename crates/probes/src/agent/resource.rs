//! Resource probes: push past a limit, in bounded steps, and report how far
//! the sandbox let the probe go. The harness judges the result against the
//! profile's limits and the sandbox's typed status; a probe that reaches
//! its bound without refusal has escaped.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;

use super::{Opts, Out, Verdict, agent_command, errname, errno_of, unique};

const MIB: usize = 1 << 20;

/// What the memory probe writes into what it allocates.
static FILL: [u8; 64 << 10] = [0x5a; 64 << 10];

fn run(f: impl FnOnce() -> Result<Verdict, String>) -> Verdict {
    f().unwrap_or_else(Verdict::error)
}

/// Allocate and touch memory in steps until refused or `--mb` (default
/// 1024) is reached. Progress is in MiB touched.
pub(super) fn memory(opts: &Opts, out: &mut Out) -> Verdict {
    run(|| {
        let max = opts.num("mb", 1024)?;
        let step = opts.num("step-mb", 8)?.max(1);
        let step_bytes = usize::try_from(step).map_err(|e| e.to_string())? * MIB;
        let mut held: Vec<Vec<u8>> = Vec::new();
        let mut touched = 0u64;
        while touched < max {
            let mut chunk: Vec<u8> = Vec::new();
            if chunk.try_reserve_exact(step_bytes).is_err() {
                return Ok(Verdict::held(format!(
                    "allocation refused after {touched} MiB (out of memory)"
                ))
                .with_value(touched));
            }
            // Writing every byte faults every page in: a block at a time,
            // copied (a memcpy in any build; a byte-by-byte fill of a debug
            // build takes minutes for a few hundred MiB under emulation).
            while chunk.len() < step_bytes {
                let n = FILL.len().min(step_bytes - chunk.len());
                chunk.extend_from_slice(&FILL[..n]);
            }
            held.push(chunk);
            touched += step;
            out.progress(touched);
        }
        Ok(Verdict::escaped(format!(
            "allocated and touched {touched} MiB with no refusal"
        ))
        .with_value(touched))
    })
}

fn spawn_helper(args: &[&str]) -> io::Result<Command> {
    agent_command(args)
}

/// Bounded fork bomb: start sleeping children until refused or `--max`
/// (default 512) run at once. Progress is the number of children alive.
pub(super) fn fork(opts: &Opts, out: &mut Out) -> Verdict {
    run(|| {
        let max = opts.num("max", 512)?;
        let mut cmd = spawn_helper(&["_sleeper"]).map_err(|e| errname(&e))?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut kids: Vec<Child> = Vec::new();
        let mut verdict = None;
        while (kids.len() as u64) < max {
            match cmd.spawn() {
                Ok(c) => {
                    kids.push(c);
                    if kids.len().is_multiple_of(8) {
                        out.progress(kids.len() as u64);
                    }
                }
                Err(e) => {
                    let n = kids.len() as u64;
                    verdict = Some(
                        match errno_of(&e) {
                            Some(Errno::EAGAIN | Errno::ENOMEM) => Verdict::held(format!(
                                "process #{} refused: {} ({n} children running)",
                                n + 1,
                                errname(&e)
                            )),
                            _ => Verdict::error(format!(
                                "spawn #{} failed: {} ({n} children running)",
                                n + 1,
                                errname(&e)
                            )),
                        }
                        .with_value(n),
                    );
                    break;
                }
            }
        }
        let n = kids.len() as u64;
        // Closing their stdin ends every child; then reap them all.
        for k in &mut kids {
            drop(k.stdin.take());
        }
        for k in &mut kids {
            let _ = k.wait();
        }
        Ok(verdict.unwrap_or_else(|| {
            Verdict::escaped(format!("{n} processes ran at once with no refusal")).with_value(n)
        }))
    })
}

/// Helper: wait for stdin EOF, or (with `--seconds`) sleep; with
/// `--detach 1` start a new session first and close nothing (the spawner
/// gave it /dev/null). `--marker` only labels the command line.
pub(super) fn sleeper(opts: &Opts) -> i32 {
    if opts.get("detach") == Some("1") {
        let _ = nix::unistd::setsid();
    }
    match opts.num("seconds", 0) {
        Ok(0) => {
            let mut b = [0u8; 64];
            let mut si = io::stdin();
            while matches!(si.read(&mut b), Ok(n) if n > 0) {}
            0
        }
        Ok(s) => {
            std::thread::sleep(Duration::from_secs(s));
            0
        }
        Err(_) => 2,
    }
}

/// Helper for the daemon probe: start the detached sleeper and exit at
/// once, so the sleeper is orphaned (a double fork). Exit code 0 when the
/// sleeper started, else the errno.
pub(super) fn daemon_mid(opts: &Opts) -> i32 {
    let marker = opts.get("marker").unwrap_or("none");
    let secs = opts.get("seconds").unwrap_or("60");
    let r = spawn_helper(&[
        "_sleeper",
        "--detach",
        "1",
        "--seconds",
        secs,
        "--marker",
        marker,
    ])
    .and_then(|mut c| {
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    });
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(255),
    }
}

/// Double-fork a sleeper whose command line carries `--marker`; the harness
/// decides, after the call, whether it survived.
pub(super) fn daemon(opts: &Opts) -> Verdict {
    run(|| {
        let marker = opts
            .get("marker")
            .filter(|m| !m.is_empty())
            .ok_or("--marker is required")?;
        let secs = opts.num("seconds", 60)?;
        let st = spawn_helper(&[
            "_daemon_mid",
            "--marker",
            marker,
            "--seconds",
            &secs.to_string(),
        ])
        .and_then(|mut c| {
            c.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
        })
        .map_err(|e| format!("spawn daemon helper: {}", errname(&e)))?;
        match st.code() {
            Some(0) => Ok(Verdict::held(format!(
                "started a detached {secs} s sleeper marked {marker}; whether it outlives the call is checked outside"
            ))),
            Some(c) => Ok(Verdict::held(format!(
                "the sleeper could not start: {:?}",
                Errno::from_raw(c)
            ))),
            None => Err(format!("daemon helper ended without an exit code: {st:?}")),
        }
    })
}

/// Flood stdout with `--mb` (default 100) MiB. Progress is not printed (it
/// would be lost in the flood); the harness counts what arrived.
pub(super) fn output(opts: &Opts, out: &mut Out) -> Verdict {
    run(|| {
        let mb = opts.num("mb", 100)?;
        let total = mb * MIB as u64;
        let mut line = vec![b'A'; 64 * 1024];
        if let Some(last) = line.last_mut() {
            *last = b'\n';
        }
        let mut so = io::stdout().lock();
        let mut sent = 0u64;
        while sent < total {
            if let Err(e) = so.write_all(&line) {
                drop(so);
                out.mark_stdout_broken();
                return Ok(Verdict::held(format!(
                    "stdout refused after {sent} bytes: {}",
                    errname(&e)
                ))
                .with_value(sent));
            }
            sent += line.len() as u64;
        }
        if let Err(e) = so.flush() {
            drop(so);
            out.mark_stdout_broken();
            return Ok(Verdict::held(format!(
                "stdout refused at flush after {sent} bytes: {}",
                errname(&e)
            ))
            .with_value(sent));
        }
        Ok(Verdict::escaped(format!("wrote {sent} bytes to stdout")).with_value(sent))
    })
}

/// Fill `--dir` (default /tmp) with up to `--mb` (default 512) MiB, then
/// remove the file. Progress is in MiB written.
pub(super) fn disk(opts: &Opts, out: &mut Out) -> Verdict {
    run(|| {
        let mb = opts.num("mb", 512)?;
        let dir = opts.get("dir").unwrap_or("/tmp");
        let path = std::path::Path::new(dir).join(format!(".cordon-fill-{}", unique()));
        let mut f = match fs::File::create_new(&path) {
            Ok(f) => f,
            Err(e) => {
                return Ok(
                    Verdict::held(format!("create {}: {}", path.display(), errname(&e)))
                        .with_value(0),
                );
            }
        };
        let chunk = vec![0x5au8; MIB];
        let mut written = 0u64;
        let mut verdict = None;
        while written < mb {
            if let Err(e) = f.write_all(&chunk) {
                verdict = Some(
                    match errno_of(&e) {
                        Some(Errno::ENOSPC | Errno::EDQUOT | Errno::EFBIG) => Verdict::held(
                            format!("write refused after {written} MiB: {}", errname(&e)),
                        ),
                        _ => Verdict::error(format!(
                            "write failed after {written} MiB: {}",
                            errname(&e)
                        )),
                    }
                    .with_value(written),
                );
                break;
            }
            written += 1;
            if written.is_multiple_of(16) {
                out.progress(written);
            }
        }
        drop(f);
        let _ = fs::remove_file(&path);
        Ok(verdict.unwrap_or_else(|| {
            Verdict::escaped(format!("wrote {written} MiB to {dir} with no refusal"))
                .with_value(written)
        }))
    })
}

/// Raise RLIMIT_NOFILE's soft limit to the hard one (as an attacker
/// would), then open descriptors until refused or `--max` (default 65536).
pub(super) fn fd_limit(opts: &Opts, out: &mut Out) -> Verdict {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    run(|| {
        let max = opts.num("max", 65536)?;
        let lim = match getrlimit(Resource::RLIMIT_NOFILE) {
            Ok((soft, hard)) => {
                let raised = setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok();
                format!(
                    "RLIMIT_NOFILE soft {soft} hard {hard}{}",
                    if raised && soft != hard {
                        ", soft raised to hard"
                    } else {
                        ""
                    }
                )
            }
            Err(e) => format!("getrlimit: {e:?}"),
        };
        let stderr = io::stderr();
        let base = stderr.as_fd();
        let mut fds: Vec<OwnedFd> = Vec::new();
        while (fds.len() as u64) < max {
            match base.try_clone_to_owned() {
                Ok(fd) => {
                    fds.push(fd);
                    if fds.len().is_multiple_of(4096) {
                        out.progress(fds.len() as u64);
                    }
                }
                Err(e) => {
                    let n = fds.len() as u64;
                    return Ok(match errno_of(&e) {
                        Some(Errno::EMFILE | Errno::ENFILE | Errno::ENOMEM) => Verdict::held(
                            format!("descriptor #{} refused: {} ({lim})", n + 1, errname(&e)),
                        ),
                        _ => {
                            Verdict::error(format!("dup failed after {n}: {} ({lim})", errname(&e)))
                        }
                    }
                    .with_value(n));
                }
            }
        }
        let n = fds.len() as u64;
        Ok(
            Verdict::escaped(format!("opened {n} descriptors with no refusal ({lim})"))
                .with_value(n),
        )
    })
}

/// Busy-loop for `--seconds` (default 3). Progress is whole seconds spun.
pub(super) fn time(opts: &Opts, out: &mut Out) -> Verdict {
    run(|| {
        let secs = opts.num("seconds", 3)?;
        let start = Instant::now();
        let mut reported = 0u64;
        let mut x: u64 = 0;
        while start.elapsed() < Duration::from_secs(secs) {
            for i in 0..100_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
            }
            let e = start.elapsed().as_secs();
            if e > reported {
                reported = e;
                out.progress(e);
            }
        }
        std::hint::black_box(x);
        Ok(
            Verdict::escaped(format!("busy loop ran {secs} s with nothing stopping it"))
                .with_value(secs),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::AgentOutcome;

    #[test]
    fn memory_touches_what_it_counts() {
        let opts =
            Opts::parse(&["--mb".into(), "24".into(), "--step-mb".into(), "8".into()]).unwrap();
        // Nothing limits this test process: the probe reaches its bound.
        let v = memory(&opts, &mut Out::new("memory"));
        assert_eq!(v.outcome, AgentOutcome::Escaped, "{}", v.evidence);
        assert_eq!(v.value, Some(24));
        assert_eq!(v.evidence, "allocated and touched 24 MiB with no refusal");
    }
}
