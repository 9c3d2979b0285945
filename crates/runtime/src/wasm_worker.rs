//! Warm Wasm workers (`module: {worker: true}`): a Wasm tool's calls
//! served by `cordon-wasm serve` running in a native jail kept between
//! calls, one call at a time per worker, each call a fresh instance of the
//! module (the runner keeps nothing of a call for the next: see
//! `cordon_wasm::worker`). What a worker saves is the jail and the
//! runner's start per call; what it gives up is a jail per call: calls of
//! the tool share one jail (its namespaces, cgroup and Landlock), and only
//! Wasm separates them.
//!
//! Workers are kept per lowered spec (the tool, its compiled code, its
//! arguments, mounts and limits): a changed spec never reuses another's
//! worker. A worker is retired after [`MAX_CALLS`] calls, [`MAX_AGE`], or
//! [`IDLE_MAX`] unused, and killed when a call goes wrong in any way (a
//! reply that does not parse, is past its bounds or does not come within
//! the wall clock and its margin): the next call starts a new one. Its
//! replies are read as untrusted (`cordon_wasm_wire::Bounds`).

use std::collections::HashMap;
use std::io::ErrorKind;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cordon_wasm_wire::{Bounds, Reply};

use crate::Spawned;
use crate::outcome::RunError;

/// Calls a worker serves before it is retired.
pub const MAX_CALLS: u64 = 10_000;
/// The longest a worker is kept.
pub const MAX_AGE: Duration = Duration::from_secs(30 * 60);
/// The longest a worker is kept unused.
pub const IDLE_MAX: Duration = Duration::from_secs(5 * 60);
/// The wall clock of a worker's jail: past [`MAX_AGE`], so a worker is
/// retired before its jail's limit could stop it in a call.
pub const WORKER_WALL: Duration = Duration::from_secs(45 * 60);

struct Worker {
    spawned: Spawned,
    calls: u64,
    born: Instant,
    last: Instant,
}

impl Worker {
    fn stale(&self, now: Instant) -> bool {
        self.calls >= MAX_CALLS
            || now.duration_since(self.born) >= MAX_AGE
            || now.duration_since(self.last) >= IDLE_MAX
            || self.spawned.handle.outcome().is_some()
    }
}

/// How a worker call went wrong.
pub(crate) enum Failed {
    /// No reply within the wall clock and its margin: the worker was
    /// killed.
    Timeout,
    /// The worker ended, or its reply was unreadable (why): it was killed;
    /// its jail's outcome, when it has one.
    Broken(String, Option<Box<cordon_sandbox::Outcome>>),
    /// No worker could be started.
    Start(RunError),
}

/// The idle workers of one runtime, by spec key.
#[derive(Default)]
pub(crate) struct Workers {
    idle: Mutex<HashMap<String, Vec<Worker>>>,
    /// Workers started so far.
    started: std::sync::atomic::AtomicU64,
}

impl Workers {
    /// One call on an idle worker of `key` (or a new one from `spawn`):
    /// `input` as its stdin, the reply within `wait`, every part within
    /// `bounds`. The reply, and whether its worker was new.
    pub(crate) fn call(
        &self,
        key: &str,
        spawn: impl Fn() -> Result<Spawned, RunError>,
        input: &[u8],
        wait: Duration,
        bounds: Bounds,
    ) -> Result<(Reply, bool), Failed> {
        let idle = self.take(key);
        let was_idle = idle.is_some();
        let mut w = match idle {
            Some(w) => w,
            None => self.new_worker(&spawn)?,
        };
        let r = exchange(&mut w, input, wait, bounds);
        let r = match r {
            // An idle worker that died while it waited (nothing of this
            // call ran in it): once more on a new one.
            Err(Failed::Broken(why, _)) if was_idle && w.calls == 0 => {
                let _ = why;
                w.spawned.handle.kill();
                w = self.new_worker(&spawn)?;
                exchange(&mut w, input, wait, bounds)
            }
            other => other,
        };
        match r {
            Ok(reply) => {
                w.calls += 1;
                w.last = Instant::now();
                if !w.stale(w.last) {
                    if let Ok(mut idle) = self.idle.lock() {
                        idle.entry(key.to_string()).or_default().push(w);
                    }
                } else {
                    w.spawned.handle.kill();
                }
                Ok((reply, !was_idle))
            }
            Err(f) => {
                w.spawned.handle.kill();
                Err(match f {
                    Failed::Broken(why, None) => {
                        let o = w.spawned.handle.wait().ok().map(Box::new);
                        Failed::Broken(why, o)
                    }
                    other => other,
                })
            }
        }
    }

    /// An idle worker of `key`, the stale ones of every key killed.
    fn take(&self, key: &str) -> Option<Worker> {
        let now = Instant::now();
        let Ok(mut idle) = self.idle.lock() else {
            return None;
        };
        for list in idle.values_mut() {
            list.retain(|w| {
                let keep = !w.stale(now);
                if !keep {
                    w.spawned.handle.kill();
                }
                keep
            });
        }
        idle.retain(|_, l| !l.is_empty());
        idle.get_mut(key).and_then(Vec::pop)
    }

    /// Workers started so far.
    pub(crate) fn started(&self) -> u64 {
        self.started.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Idle workers now (all keys).
    pub(crate) fn idle(&self) -> usize {
        self.idle
            .lock()
            .map(|i| i.values().map(Vec::len).sum())
            .unwrap_or(0)
    }
}

impl Drop for Workers {
    /// Every idle worker killed, and waited for: its jail is torn down
    /// (its root directory removed) before the runtime is gone, even when
    /// the process ends right after.
    fn drop(&mut self) {
        if let Ok(idle) = self.idle.get_mut() {
            for w in idle.values().flatten() {
                w.spawned.handle.kill();
            }
            for w in idle.values().flatten() {
                let _ = w.spawned.handle.wait();
            }
        }
    }
}

impl Workers {
    fn new_worker(&self, spawn: &impl Fn() -> Result<Spawned, RunError>) -> Result<Worker, Failed> {
        let w = new_worker(spawn)?;
        self.started
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(w)
    }
}

fn new_worker(spawn: &impl Fn() -> Result<Spawned, RunError>) -> Result<Worker, Failed> {
    let spawned = spawn().map_err(Failed::Start)?;
    let now = Instant::now();
    Ok(Worker {
        spawned,
        calls: 0,
        born: now,
        last: now,
    })
}

/// Send `input`, read the reply.
fn exchange(w: &mut Worker, input: &[u8], wait: Duration, bounds: Bounds) -> Result<Reply, Failed> {
    let s = &mut w.spawned.stream;
    let io = |e: std::io::Error| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Failed::Timeout,
        _ => Failed::Broken(e.to_string(), None),
    };
    s.set_write_timeout(Some(wait)).map_err(io)?;
    s.set_read_timeout(Some(wait)).map_err(io)?;
    cordon_wasm_wire::write_request(s, input).map_err(io)?;
    // The read timeout is per read; the whole reply is bounded by `wait`
    // from here on as well.
    let until = Instant::now() + wait;
    let mut timed = Deadline { s, until };
    cordon_wasm_wire::read_reply(&mut timed, bounds).map_err(io)
}

/// A reader that fails once `until` has passed.
struct Deadline<'a> {
    s: &'a mut std::os::unix::net::UnixStream,
    until: Instant,
}

impl std::io::Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                ErrorKind::TimedOut,
                "past the deadline",
            ));
        }
        self.s.set_read_timeout(Some(left))?;
        self.s.read(buf)
    }
}
