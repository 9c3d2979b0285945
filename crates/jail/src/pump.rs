//! The I/O of one running sandbox: stdin in, stdout and stderr out under
//! their caps (or the stdio relay of a long-lived sandbox), the wall
//! clock, the setup-failure pipe and the child's exit, until every end is
//! closed.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use cordon_sys::Errno;
use cordon_sys::io as sio;
use cordon_sys::spawn::Child;

use crate::Status;
use crate::cgroup::Slot;

/// The broker's ends of a sandbox's descriptors, once it is spawned.
pub(crate) struct Ends {
    pub out_r: OwnedFd,
    pub err_r: OwnedFd,
    /// Held until the call ends (closing it early would end the child's
    /// wait for the go-ahead).
    pub sync_w: OwnedFd,
    pub fail_r: OwnedFd,
    pub in_w: Option<OwnedFd>,
    pub stdin_bytes: Vec<u8>,
    pub relay: Option<Relay>,
    pub doors_sock: Option<OwnedFd>,
}

/// A step of the loop that failed, and how.
pub(crate) type Failed = (&'static str, io::Error);

/// How the I/O ended.
pub(crate) enum Pumped {
    /// The sandbox reported a failed setup step (its 8-byte record).
    SetupFailed([u8; 8]),
    /// The sandbox exited (or was killed for `killed_for`).
    Ended {
        exit: sio::ExitStatus,
        killed_for: Option<Status>,
        io: Box<IoState>,
        relay: Option<Box<Relay>>,
    },
}

/// Run the I/O loop of `child` until it has exited and its output ends
/// are closed, killing it (and its slot) at `deadline`, at the output cap
/// or when the relay is stopped.
pub(crate) fn pump(
    child: &mut Child,
    slot: Option<&Slot>,
    deadline: Instant,
    caps: (u64, u64),
    ends: Ends,
) -> Result<Pumped, Failed> {
    let Ends {
        out_r,
        err_r,
        sync_w,
        fail_r,
        in_w,
        stdin_bytes,
        relay,
        doors_sock: _,
    } = ends;
    let mut p = Pump {
        io: IoState::new(caps.0, caps.1),
        out_r: Some(out_r),
        err_r: Some(err_r),
        fail_r: Some(fail_r),
        in_w,
        stdin_bytes,
        in_off: 0,
        relay,
        exit: None,
        killed_for: None,
        buf: vec![0u8; 64 << 10],
    };
    p.start()
        .map_err(|e| ("set the sandbox's pipes non-blocking", e))?;
    loop {
        if p.exit.is_some() && p.out_r.is_none() && p.err_r.is_none() {
            break;
        }
        p.enforce(child, slot, deadline);
        let (mut fds, kinds) = p.poll_set(child);
        let n = poll_retry(&mut fds, p.timeout(deadline)).map_err(|e| ("poll", errno_io(e)))?;
        if n == 0 && p.exit.is_some() {
            // Pipes held open from outside the sandbox: stop waiting.
            p.out_r = None;
            p.err_r = None;
            continue;
        }
        for (pf, kind) in fds.iter().zip(kinds.iter()) {
            if pf.revents == 0 {
                continue;
            }
            if let Some(failure) = p
                .ready(*kind, pf.revents, child, slot)
                .map_err(|e| ("waitid", e))?
            {
                return Ok(Pumped::SetupFailed(failure));
            }
        }
        if let Some(r) = &p.relay
            && r.stdin_done()
        {
            p.in_w = None;
        }
    }
    if let Some(r) = &mut p.relay {
        r.flush(Duration::from_secs(1));
    }
    drop(sync_w);
    let Some(exit) = p.exit else {
        return Err((
            "wait for the sandbox",
            io::Error::other("sandbox did not exit"),
        ));
    };
    Ok(Pumped::Ended {
        exit,
        killed_for: p.killed_for,
        io: Box::new(p.io),
        relay: p.relay.map(Box::new),
    })
}

fn errno_io(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// The loop's state: which ends are still open, what was written of
/// stdin, how the child ended.
struct Pump {
    io: IoState,
    out_r: Option<OwnedFd>,
    err_r: Option<OwnedFd>,
    fail_r: Option<OwnedFd>,
    in_w: Option<OwnedFd>,
    stdin_bytes: Vec<u8>,
    in_off: usize,
    relay: Option<Relay>,
    exit: Option<sio::ExitStatus>,
    killed_for: Option<Status>,
    buf: Vec<u8>,
}

impl Pump {
    /// Every end non-blocking; stdin closed at once when there is nothing
    /// to write.
    fn start(&mut self) -> io::Result<()> {
        if let Some(w) = &self.in_w {
            if self.stdin_bytes.is_empty() && self.relay.is_none() {
                self.in_w = None;
            } else {
                sio::set_nonblocking(w.as_fd(), true).map_err(errno_io)?;
            }
        }
        if let Some(r) = &self.relay {
            sio::set_nonblocking(r.socket.as_fd(), true).map_err(errno_io)?;
        }
        for fd in [&self.out_r, &self.err_r].into_iter().flatten() {
            sio::set_nonblocking(fd.as_fd(), true).map_err(errno_io)?;
        }
        Ok(())
    }

    /// Kill the sandbox when the relay was stopped or the wall clock ran
    /// out.
    fn enforce(&mut self, child: &Child, slot: Option<&Slot>, deadline: Instant) {
        if self.killed_for.is_some() || self.exit.is_some() {
            return;
        }
        if self.relay.as_ref().is_some_and(|r| r.stopped) {
            self.killed_for = Some(Status::Killed);
            kill_all(child, slot);
        } else if Instant::now() >= deadline {
            self.killed_for = Some(Status::TimedOut);
            kill_all(child, slot);
        }
    }

    /// How long to wait. After the kill (or the exit) the pipes reach EOF
    /// once every process of the sandbox is gone; a process outside the
    /// sandbox that inherited a pipe end must not keep the call alive.
    fn timeout(&self, deadline: Instant) -> Duration {
        if self.exit.is_some() {
            Duration::from_millis(500)
        } else if self.killed_for.is_some() {
            Duration::from_secs(5)
        } else {
            deadline.saturating_duration_since(Instant::now())
        }
    }

    /// The descriptors to poll, each with its kind.
    fn poll_set(&self, child: &Child) -> (Vec<sio::PollFd>, Vec<u8>) {
        let mut fds: Vec<sio::PollFd> = Vec::with_capacity(8);
        let mut kinds: Vec<u8> = Vec::with_capacity(8);
        if let Some(f) = &self.out_r
            && self.relay.as_ref().is_none_or(Relay::wants_output)
        {
            fds.push(pfd(f.as_fd(), libc::POLLIN));
            kinds.push(b'o');
        }
        if let Some(r) = &self.relay {
            r.poll_fds(&mut fds, &mut kinds);
        }
        if let Some(f) = &self.err_r {
            fds.push(pfd(f.as_fd(), libc::POLLIN));
            kinds.push(b'e');
        }
        if let Some(f) = &self.in_w
            && self.relay.as_ref().is_none_or(|r| !r.to_child.is_empty())
        {
            fds.push(pfd(f.as_fd(), libc::POLLOUT));
            kinds.push(b'i');
        }
        if let Some(f) = &self.fail_r {
            fds.push(pfd(f.as_fd(), libc::POLLIN));
            kinds.push(b'f');
        }
        if self.exit.is_none() {
            fds.push(pfd(child.pidfd(), libc::POLLIN));
            kinds.push(b'p');
        }
        (fds, kinds)
    }

    /// Handle one ready descriptor; `Some`: the sandbox's setup failed.
    fn ready(
        &mut self,
        kind: u8,
        revents: libc::c_short,
        child: &mut Child,
        slot: Option<&Slot>,
    ) -> io::Result<Option<[u8; 8]>> {
        match kind {
            b'o' => self.stdout(child, slot),
            b'e' => {
                if let Some(f) = &self.err_r
                    && let Drain::Eof = drain(f.as_fd(), &mut self.buf, |chunk| {
                        self.io.stderr(chunk);
                        true
                    })
                {
                    self.err_r = None;
                }
            }
            b'i' if self.relay.is_some() => {
                if let (Some(w), Some(r)) = (&self.in_w, &mut self.relay)
                    && !r.write_child(w.as_fd())
                {
                    self.in_w = None;
                }
            }
            b's' | b'w' | b'x' => {
                if let Some(r) = &mut self.relay {
                    r.ready(kind, revents);
                }
            }
            b'i' => self.stdin(),
            b'f' => {
                if let Some(f) = &self.fail_r {
                    let mut b = [0u8; 8];
                    if read_full(f.as_fd(), &mut b) == 8 {
                        return Ok(Some(b));
                    }
                    // EOF: execve succeeded (or the child died before
                    // reporting; the exit status will tell).
                    self.fail_r = None;
                }
            }
            b'p' => {
                if let Some(st) = child.wait(false).map_err(errno_io)? {
                    self.exit = Some(st);
                    self.in_w = None;
                }
            }
            _ => {}
        }
        Ok(None)
    }

    /// Read the sandbox's stdout (into the relay, or under the output
    /// cap: over it, the sandbox is killed).
    fn stdout(&mut self, child: &Child, slot: Option<&Slot>) {
        let Some(f) = &self.out_r else { return };
        let drained = match &mut self.relay {
            Some(r) => drain(f.as_fd(), &mut self.buf, |chunk| r.child_wrote(chunk)),
            None => drain(f.as_fd(), &mut self.buf, |chunk| self.io.stdout(chunk)),
        };
        match drained {
            Drain::Eof => self.out_r = None,
            Drain::Stop => {
                self.out_r = None;
                if self.killed_for.is_none() && self.exit.is_none() {
                    self.killed_for = Some(Status::OutputCap);
                    kill_all(child, slot);
                }
            }
            Drain::More => {}
        }
    }

    /// Write what is left of the call's input.
    fn stdin(&mut self) {
        let Some(w) = &self.in_w else { return };
        let rest = self.stdin_bytes.get(self.in_off..).unwrap_or(&[]);
        match sio::write(w.as_fd(), rest) {
            Ok(k) => {
                self.in_off += k;
                if self.in_off >= self.stdin_bytes.len() {
                    self.in_w = None;
                }
            }
            Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
            // EPIPE: the tool closed stdin; it may still be fine.
            Err(_) => self.in_w = None,
        }
    }
}

fn kill_all(child: &Child, slot: Option<&Slot>) {
    // SIGKILL of the pid-namespace init takes every process of the
    // namespace with it; cgroup.kill (v2) as well when there is one.
    let _ = child.kill();
    if let Some(s) = slot
        && s.v2.is_some()
    {
        s.kill();
    }
}

pub(crate) fn pfd(fd: BorrowedFd<'_>, events: libc::c_short) -> sio::PollFd {
    sio::PollFd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    }
}

pub(crate) fn poll_retry(fds: &mut [sio::PollFd], timeout: Duration) -> Result<usize, Errno> {
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // Round up so a sub-millisecond remainder does not spin.
    let ms = if ms == 0 && !timeout.is_zero() { 1 } else { ms };
    loop {
        match sio::poll(fds, ms) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

pub(crate) fn read_full(fd: BorrowedFd<'_>, buf: &mut [u8; 8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match sio::read(fd, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    got
}

enum Drain {
    More,
    Eof,
    Stop,
}

fn drain(fd: BorrowedFd<'_>, buf: &mut [u8], mut sink: impl FnMut(&[u8]) -> bool) -> Drain {
    loop {
        match sio::read(fd, buf) {
            Ok(0) => return Drain::Eof,
            Ok(n) => {
                if !sink(&buf[..n]) {
                    return Drain::Stop;
                }
            }
            Err(Errno::EAGAIN) => return Drain::More,
            Err(Errno::EINTR) => {}
            Err(_) => return Drain::Eof,
        }
    }
}

/// Stderr bytes kept past the cap, the last ones written (where runtimes
/// put their fatal errors), for [`fallback::oom_line`].
const STDERR_TAIL: usize = 16 << 10;

pub(crate) struct IoState {
    out_cap: u64,
    err_cap: u64,
    stdout: Vec<u8>,
    out_total: u64,
    pub(crate) stderr: Vec<u8>,
    err_total: u64,
    /// The last bytes of stderr beyond `stderr` (up to twice
    /// [`STDERR_TAIL`] before it is trimmed).
    pub(crate) stderr_tail: Vec<u8>,
}

impl IoState {
    fn new(out_cap: u64, err_cap: u64) -> IoState {
        IoState {
            out_cap,
            err_cap,
            stdout: Vec::new(),
            out_total: 0,
            stderr: Vec::new(),
            err_total: 0,
            stderr_tail: Vec::new(),
        }
    }

    /// false once over the cap.
    fn stdout(&mut self, chunk: &[u8]) -> bool {
        self.out_total += chunk.len() as u64;
        let room = self.out_cap.saturating_sub(self.stdout.len() as u64) as usize;
        self.stdout
            .extend_from_slice(&chunk[..chunk.len().min(room)]);
        self.out_total <= self.out_cap
    }

    fn stderr(&mut self, chunk: &[u8]) {
        self.err_total += chunk.len() as u64;
        let room = self.err_cap.saturating_sub(self.stderr.len() as u64) as usize;
        let kept = chunk.len().min(room);
        self.stderr.extend_from_slice(&chunk[..kept]);
        let rest = &chunk[kept..];
        if !rest.is_empty() {
            self.stderr_tail.extend_from_slice(rest);
            if self.stderr_tail.len() > 2 * STDERR_TAIL {
                let cut = self.stderr_tail.len() - STDERR_TAIL;
                self.stderr_tail.drain(..cut);
            }
        }
    }

    pub(crate) fn finish(self) -> (Vec<u8>, u64, Vec<u8>, u64) {
        (self.stdout, self.out_total, self.stderr, self.err_total)
    }
}

/// Bytes held in either direction of a [`crate::Stream`] relay before the
/// broker stops reading from that side (back-pressure).
const RELAY_HIGH_WATER: usize = 256 << 10;

/// The broker's side of a long-lived sandbox's stdio (see
/// [`crate::Stream`]).
pub(crate) struct Relay {
    socket: OwnedFd,
    stop: Option<OwnedFd>,
    /// From the socket, for the sandbox's stdin.
    to_child: Vec<u8>,
    /// From the sandbox's stdout, for the socket.
    to_sock: Vec<u8>,
    /// The socket gave end of file (or failed): no more input.
    sock_eof: bool,
    /// The socket can no longer be written: nobody reads the output.
    sock_dead: bool,
    /// Stop requested (or nobody is left to read).
    stopped: bool,
    cap: u64,
    /// Bytes of the line being written, held in `partial` until its end.
    line: u64,
    partial: Vec<u8>,
    pub(crate) out_total: u64,
}

impl Relay {
    pub(crate) fn new(st: crate::Stream, cap: u64) -> Relay {
        Relay {
            socket: st.socket,
            stop: Some(st.stop),
            to_child: Vec::new(),
            to_sock: Vec::new(),
            sock_eof: false,
            sock_dead: false,
            stopped: false,
            cap,
            line: 0,
            partial: Vec::new(),
            out_total: 0,
        }
    }

    fn wants_output(&self) -> bool {
        self.to_sock.len() < RELAY_HIGH_WATER
    }

    fn stdin_done(&self) -> bool {
        self.sock_eof && self.to_child.is_empty()
    }

    fn poll_fds(&self, fds: &mut Vec<sio::PollFd>, kinds: &mut Vec<u8>) {
        if !self.sock_eof && self.to_child.len() < RELAY_HIGH_WATER {
            fds.push(pfd(self.socket.as_fd(), libc::POLLIN));
            kinds.push(b's');
        }
        if !self.to_sock.is_empty() && !self.sock_dead {
            fds.push(pfd(self.socket.as_fd(), libc::POLLOUT));
            kinds.push(b'w');
        }
        if let Some(s) = &self.stop {
            fds.push(pfd(s.as_fd(), libc::POLLIN));
            kinds.push(b'x');
        }
    }

    fn ready(&mut self, kind: u8, revents: libc::c_short) {
        match kind {
            b's' => {
                let mut buf = [0u8; 64 << 10];
                loop {
                    match sio::read(self.socket.as_fd(), &mut buf) {
                        Ok(0) => {
                            self.sock_eof = true;
                            break;
                        }
                        Ok(n) => {
                            self.to_child.extend_from_slice(&buf[..n]);
                            if self.to_child.len() >= RELAY_HIGH_WATER {
                                break;
                            }
                        }
                        Err(Errno::EINTR) => {}
                        Err(Errno::EAGAIN) => break,
                        Err(_) => {
                            self.sock_eof = true;
                            break;
                        }
                    }
                }
            }
            b'w' => self.write_sock(),
            b'x' => {
                let _ = revents;
                self.stopped = true;
                self.stop = None;
            }
            _ => {}
        }
    }

    fn write_sock(&mut self) {
        while !self.to_sock.is_empty() {
            match sio::write(self.socket.as_fd(), &self.to_sock) {
                Ok(n) => {
                    self.to_sock.drain(..n);
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return,
                Err(_) => {
                    // Nobody reads the sandbox's output any more.
                    self.sock_dead = true;
                    self.stopped = true;
                    self.to_sock.clear();
                    return;
                }
            }
        }
    }

    /// Output from the sandbox: false once a line is over the cap. Only
    /// whole lines go on to the socket, so a message over the cap never
    /// reaches the caller, not even in part.
    fn child_wrote(&mut self, chunk: &[u8]) -> bool {
        self.out_total += chunk.len() as u64;
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            if self.line + i as u64 > self.cap {
                self.partial.clear();
                return false;
            }
            if !self.sock_dead {
                self.to_sock.extend_from_slice(&self.partial);
                self.to_sock.extend_from_slice(&rest[..=i]);
            }
            self.partial.clear();
            self.line = 0;
            rest = &rest[i + 1..];
        }
        self.line += rest.len() as u64;
        if self.line > self.cap {
            self.partial.clear();
            return false;
        }
        self.partial.extend_from_slice(rest);
        true
    }

    /// Write what the socket accepts to the sandbox's stdin; false when
    /// the stdin pipe is closed.
    fn write_child(&mut self, w: BorrowedFd<'_>) -> bool {
        while !self.to_child.is_empty() {
            match sio::write(w, &self.to_child) {
                Ok(n) => {
                    self.to_child.drain(..n);
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return true,
                Err(_) => {
                    self.to_child.clear();
                    self.sock_eof = true;
                    return false;
                }
            }
        }
        true
    }

    /// After the sandbox is gone: hand the socket what is left, for at most
    /// `within`.
    fn flush(&mut self, within: Duration) {
        // A last message without its newline still goes out whole.
        if !self.sock_dead {
            let last = std::mem::take(&mut self.partial);
            self.to_sock.extend_from_slice(&last);
        }
        let until = Instant::now() + within;
        while !self.to_sock.is_empty() && !self.sock_dead {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let mut f = [pfd(self.socket.as_fd(), libc::POLLOUT)];
            match poll_retry(&mut f, left) {
                Ok(n) if n > 0 => self.write_sock(),
                _ => return,
            }
        }
    }
}
