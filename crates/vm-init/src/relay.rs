//! Both ends of the network channel (`cordon.net`), over [`crate::mux`]'s
//! frames: the guest's ([`GuestNet`]: each connection its init accepted
//! becomes a stream to the address the tool dialed) and the host's
//! ([`serve_host`]: each stream becomes a connection where its [`Reach`]
//! says: the proxy door on the host's loopback, the DNS relay, or an
//! address the egress doors made local).
//!
//! Threads, on both sides: one reads the channel and hands each frame to
//! its stream; each stream has one thread reading its socket into `Data`
//! frames (while it has credit) and one writing the `Data` it receives to
//! its socket (then giving credit back). The channel reader never writes
//! to the channel and never blocks on a socket: it only queues, and what
//! it queues per stream is bounded by the window ([`mux::WINDOW`]), so
//! neither side can stall the other's reader, and a side buffers at most
//! `WINDOW × MAX_STREAMS` bytes of received data. A peer that breaks the
//! framing or the protocol (data past its window, an `Open` from the host,
//! a reused id, too many streams) tears the channel down: every stream is
//! shut, every thread ends.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::mux::{self, Decoder, Frame};

/// Where the host lets the guest's streams go (everything else is
/// refused with `Reset`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reach {
    /// Ports at `127.0.0.1` exactly (the proxy door).
    pub loopback: Vec<u16>,
    /// Ports the guest may dial at any IPv4 address (the allowlist's):
    /// connected to that same address in the host's network namespace, the
    /// egress doors', where only the addresses the doors made local answer
    /// (as in a native sandbox's own namespace).
    pub transparent: Vec<u16>,
    /// Where a stream to the guest's DNS port (`127.0.0.1:53`) goes: the
    /// host's DNS-over-TCP relay to the DNS door.
    pub dns: Option<SocketAddrV4>,
}

/// The guest's DNS port: its init answers there, and carries each query
/// to the host.
pub const DNS_PORT: u16 = 53;

impl Reach {
    /// Where the host connects for a stream the guest opened to `to`, or
    /// `None`: refused. The host's end runs in the sandbox's own network
    /// namespace, where nothing listens but the doors, and the doors judge
    /// each connection as for a native sandbox.
    pub fn target(&self, to: SocketAddrV4) -> Option<SocketAddrV4> {
        let ip = *to.ip();
        if ip == Ipv4Addr::LOCALHOST {
            if to.port() == DNS_PORT
                && let Some(dns) = self.dns
            {
                return Some(dns);
            }
            if self.loopback.contains(&to.port()) {
                return Some(to);
            }
        }
        if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || to.port() == 0 {
            return None;
        }
        self.transparent.contains(&to.port()).then_some(to)
    }
}

/// Stack of each relay thread (they hold their buffers on the heap).
const STACK: usize = 128 * 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A relay thread that panicked leaves plain data behind: go on.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the channel reader hands a stream's writing thread.
enum Down {
    Data(Vec<u8>),
    Close,
}

#[derive(Debug, Default)]
struct State {
    /// Bytes this side may still send.
    credit: u32,
    reset: bool,
    sent_close: bool,
    got_close: bool,
}

struct Stream {
    id: u32,
    /// The local socket, once there (the host connects in the stream's
    /// own thread): kept to shut it down from the channel reader.
    sock: Mutex<Option<TcpStream>>,
    state: Mutex<State>,
    cv: Condvar,
    /// Data received and not yet written out: the peer's use of its
    /// window.
    unacked_in: AtomicU32,
}

impl Stream {
    fn new(id: u32) -> Arc<Stream> {
        Arc::new(Stream {
            id,
            sock: Mutex::new(None),
            state: Mutex::new(State {
                credit: mux::WINDOW,
                ..State::default()
            }),
            cv: Condvar::new(),
            unacked_in: AtomicU32::new(0),
        })
    }

    fn shut(&self) {
        if let Some(s) = lock(&self.sock).as_ref() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Marks the stream reset; whether it was not already.
    fn mark_reset(&self) -> bool {
        let first = {
            let mut st = lock(&self.state);
            let first = !st.reset;
            st.reset = true;
            first
        };
        self.cv.notify_all();
        first
    }

    fn is_reset(&self) -> bool {
        lock(&self.state).reset
    }
}

struct Entry {
    stream: Arc<Stream>,
    tx: Sender<Down>,
}

/// One side of a channel.
struct Shared {
    out: Mutex<Box<dyn Write + Send>>,
    streams: Mutex<HashMap<u32, Entry>>,
    dead: AtomicBool,
    /// The guest's next stream id.
    next_id: Mutex<u32>,
    /// Why the channel was torn down.
    error: Mutex<Option<String>>,
}

impl Shared {
    fn new(out: Box<dyn Write + Send>) -> Arc<Shared> {
        Arc::new(Shared {
            out: Mutex::new(out),
            streams: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            next_id: Mutex::new(1),
            error: Mutex::new(None),
        })
    }

    /// Writes one frame; a failed write tears the channel down.
    fn send(&self, f: &Frame) -> bool {
        if self.dead.load(Ordering::SeqCst) {
            return false;
        }
        let r = f.encode().map_err(|e| e.to_string()).and_then(|bytes| {
            let mut out = lock(&self.out);
            out.write_all(&bytes)
                .and_then(|()| out.flush())
                .map_err(|e| format!("write the channel: {e}"))
        });
        match r {
            Ok(()) => true,
            Err(e) => {
                self.kill(e);
                false
            }
        }
    }

    /// Tears the channel down: every stream reset and shut, no more
    /// frames sent.
    fn kill(&self, why: String) {
        self.dead.store(true, Ordering::SeqCst);
        lock(&self.error).get_or_insert(why);
        let entries: Vec<Entry> = lock(&self.streams).drain().map(|(_, e)| e).collect();
        for e in entries {
            e.stream.mark_reset();
            e.stream.shut();
        }
    }

    fn get(&self, id: u32) -> Option<(Arc<Stream>, Sender<Down>)> {
        lock(&self.streams)
            .get(&id)
            .map(|e| (e.stream.clone(), e.tx.clone()))
    }

    fn remove(&self, id: u32) {
        lock(&self.streams).remove(&id);
    }

    /// This side gives the stream up (its socket failed, its connect was
    /// refused): `Reset` to the peer, the socket shut.
    fn reset_local(&self, s: &Stream) {
        if s.mark_reset() {
            self.send(&Frame::Reset { id: s.id });
        }
        self.remove(s.id);
        s.shut();
    }

    /// Handles one frame from the peer; `Err` breaks the channel.
    fn handle(self: &Arc<Shared>, f: Frame, host: Option<&Reach>) -> Result<(), String> {
        match f {
            Frame::Open { id, to } => {
                let Some(reach) = host else {
                    return Err(format!("the host opened stream {id}"));
                };
                let stream = Stream::new(id);
                let (tx, rx) = mpsc::channel();
                {
                    let mut map = lock(&self.streams);
                    if map.contains_key(&id) {
                        return Err(format!("stream {id} opened twice"));
                    }
                    if map.len() >= mux::MAX_STREAMS {
                        return Err(format!("more than {} streams", mux::MAX_STREAMS));
                    }
                    map.insert(
                        id,
                        Entry {
                            stream: stream.clone(),
                            tx,
                        },
                    );
                }
                let target = reach.target(to);
                let shared = self.clone();
                std::thread::Builder::new()
                    .name(format!("net-{id}"))
                    .stack_size(STACK)
                    .spawn(move || host_stream(&shared, &stream, rx, target))
                    .map_err(|e| format!("a thread for stream {id}: {e}"))?;
            }
            Frame::Data { id, bytes } => {
                let Some((s, tx)) = self.get(id) else {
                    // Gone already (a reset crossed it): dropped.
                    return Ok(());
                };
                if lock(&s.state).got_close {
                    return Err(format!("data on stream {id} after its close"));
                }
                let n = bytes.len() as u32;
                let before = s.unacked_in.fetch_add(n, Ordering::SeqCst);
                if before.saturating_add(n) > mux::WINDOW {
                    return Err(format!("stream {id} went past its window"));
                }
                // A writer that gave up already reset the stream.
                let _ = tx.send(Down::Data(bytes));
            }
            Frame::Close { id } => {
                let Some((s, tx)) = self.get(id) else {
                    return Ok(());
                };
                let both = {
                    let mut st = lock(&s.state);
                    st.got_close = true;
                    st.sent_close
                };
                let _ = tx.send(Down::Close);
                if both {
                    self.remove(id);
                }
            }
            Frame::Reset { id } => {
                let Some((s, _)) = self.get(id) else {
                    return Ok(());
                };
                s.mark_reset();
                self.remove(id);
                s.shut();
            }
            Frame::Credit { id, bytes } => {
                let Some((s, _)) = self.get(id) else {
                    return Ok(());
                };
                {
                    let mut st = lock(&s.state);
                    st.credit = st.credit.saturating_add(bytes);
                    if st.credit > mux::WINDOW {
                        return Err(format!("stream {id} got credit past its window"));
                    }
                }
                s.cv.notify_all();
            }
        }
        Ok(())
    }

    /// Reads the channel until its end; the channel is torn down after.
    fn read_loop(
        self: &Arc<Shared>,
        mut input: impl Read,
        host: Option<&Reach>,
    ) -> Result<(), String> {
        let r = (|| {
            let mut dec = Decoder::new();
            let mut buf = vec![0u8; mux::MAX_FRAME + 4];
            loop {
                let n = match input.read(&mut buf) {
                    Ok(0) => return Ok(()),
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(format!("read the channel: {e}")),
                };
                dec.feed(&buf[..n]);
                while let Some(f) = dec.next_frame().map_err(|e| e.to_string())? {
                    self.handle(f, host)?;
                }
            }
        })();
        self.kill(match &r {
            Ok(()) => "the channel ended".to_owned(),
            Err(e) => e.clone(),
        });
        r
    }
}

/// The socket's bytes to the peer as `Data`, as far as the credit goes;
/// `Close` at its EOF.
fn up(shared: &Shared, s: &Stream, mut sock: TcpStream) {
    let mut buf = vec![0u8; mux::MAX_DATA];
    loop {
        let room = {
            let mut st = lock(&s.state);
            while st.credit == 0 && !st.reset {
                st = s.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
            if st.reset {
                return;
            }
            st.credit as usize
        };
        match sock.read(&mut buf[..room.min(mux::MAX_DATA)]) {
            Ok(0) => {
                if s.is_reset() || !shared.send(&Frame::Close { id: s.id }) {
                    return;
                }
                let both = {
                    let mut st = lock(&s.state);
                    st.sent_close = true;
                    st.got_close
                };
                if both {
                    shared.remove(s.id);
                }
                return;
            }
            Ok(n) => {
                {
                    let mut st = lock(&s.state);
                    if st.reset {
                        return;
                    }
                    st.credit -= n as u32;
                }
                let f = Frame::Data {
                    id: s.id,
                    bytes: buf[..n].to_vec(),
                };
                if !shared.send(&f) {
                    return;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => {
                if !s.is_reset() {
                    shared.reset_local(s);
                }
                return;
            }
        }
    }
}

/// The peer's `Data` to the socket, credit given back for each piece
/// written; the socket's write side shut at the peer's `Close`.
fn down(shared: &Shared, s: &Stream, mut sock: TcpStream, rx: Receiver<Down>) {
    for m in rx {
        if s.is_reset() {
            return;
        }
        match m {
            Down::Data(bytes) => {
                if sock.write_all(&bytes).is_err() {
                    shared.reset_local(s);
                    return;
                }
                let n = bytes.len() as u32;
                // Before the credit goes out: the peer may use it at once.
                s.unacked_in.fetch_sub(n, Ordering::SeqCst);
                if !shared.send(&Frame::Credit { id: s.id, bytes: n }) {
                    return;
                }
            }
            Down::Close => {
                let _ = sock.shutdown(Shutdown::Write);
                return;
            }
        }
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(name)
        .stack_size(STACK)
        .spawn(f)
        .map(drop)
}

/// Sets `sock` as the stream's socket and starts its writing thread;
/// `false` when the stream was reset meanwhile or no thread could start.
fn attach(shared: &Arc<Shared>, s: &Arc<Stream>, sock: &TcpStream, rx: Receiver<Down>) -> bool {
    let _ = sock.set_nodelay(true);
    let (Ok(keep), Ok(writer)) = (sock.try_clone(), sock.try_clone()) else {
        shared.reset_local(s);
        return false;
    };
    *lock(&s.sock) = Some(keep);
    if s.is_reset() {
        s.shut();
        return false;
    }
    let (sh, st) = (shared.clone(), s.clone());
    if spawn(format!("net-{}-down", s.id), move || {
        down(&sh, &st, writer, rx)
    })
    .is_err()
    {
        shared.reset_local(s);
        return false;
    }
    true
}

/// The host's stream: a connection to `target`, then the relay both ways;
/// a refused (or not allowed: `None`) connect is a `Reset`.
fn host_stream(
    shared: &Arc<Shared>,
    s: &Arc<Stream>,
    rx: Receiver<Down>,
    target: Option<SocketAddrV4>,
) {
    let conn = match target {
        Some(t) => TcpStream::connect(t),
        None => Err(ErrorKind::PermissionDenied.into()),
    };
    let Ok(conn) = conn else {
        shared.reset_local(s);
        return;
    };
    if attach(shared, s, &conn, rx) {
        up(shared, s, conn);
    }
}

/// The host's end: serves the channel read from `input` and written to
/// `output` until it ends (the guest powered off, QEMU exited), connecting
/// each stream the guest opens where [`Reach::target`] says, in the
/// caller's network namespace (anything else is refused with `Reset`).
/// `Err` says how the guest broke the protocol (or the channel failed);
/// either way every stream is shut when it returns.
pub fn serve_host(
    input: impl Read,
    output: impl Write + Send + 'static,
    reach: &Reach,
) -> Result<(), String> {
    let shared = Shared::new(Box::new(output));
    shared.read_loop(input, Some(reach))
}

/// The guest's end of the channel.
pub struct GuestNet {
    shared: Arc<Shared>,
}

impl GuestNet {
    /// Starts the thread that reads the channel from `input`; frames go
    /// out on `output`.
    pub fn start(
        input: impl Read + Send + 'static,
        output: impl Write + Send + 'static,
    ) -> std::io::Result<GuestNet> {
        let shared = Shared::new(Box::new(output));
        let reader = shared.clone();
        spawn("net-reader".to_owned(), move || {
            let _ = reader.read_loop(input, None);
        })?;
        Ok(GuestNet { shared })
    }

    /// Carries `conn` (accepted in the guest, dialed to `to`) to the host,
    /// which connects where its [`Reach`] says. A connection past
    /// [`mux::MAX_STREAMS`], or on a channel torn down, is closed at once.
    pub fn open(&self, conn: TcpStream, to: SocketAddrV4) {
        let shared = &self.shared;
        if shared.dead.load(Ordering::SeqCst) {
            return;
        }
        let (tx, rx) = mpsc::channel();
        let stream = {
            let mut map = lock(&shared.streams);
            if map.len() >= mux::MAX_STREAMS {
                return;
            }
            let mut next = lock(&shared.next_id);
            while map.contains_key(&*next) {
                *next = next.wrapping_add(1);
            }
            let id = *next;
            *next = next.wrapping_add(1);
            let stream = Stream::new(id);
            map.insert(
                id,
                Entry {
                    stream: stream.clone(),
                    tx,
                },
            );
            stream
        };
        if !attach(shared, &stream, &conn, rx) {
            return;
        }
        let (sh, st) = (shared.clone(), stream.clone());
        let started = spawn(format!("net-{}-up", stream.id), move || {
            // `Open` first, from the thread that sends the stream's data.
            if sh.send(&Frame::Open { id: st.id, to }) {
                up(&sh, &st, conn);
            }
        });
        if started.is_err() {
            shared.reset_local(&stream);
        }
    }

    /// Why the channel was torn down, if it was.
    pub fn error(&self) -> Option<String> {
        lock(&self.shared.error).clone()
    }

    /// Streams open now.
    pub fn streams(&self) -> usize {
        lock(&self.shared.streams).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};
    use std::net::TcpListener;
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};

    fn lo(port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
    }

    fn reach(ports: Vec<u16>) -> Reach {
        Reach {
            loopback: ports,
            ..Reach::default()
        }
    }

    #[test]
    fn the_host_reaches_the_proxy_door_the_dns_relay_and_allowed_ports_only() {
        let dns = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40053);
        let r = Reach {
            loopback: vec![3128],
            transparent: vec![5432, 443],
            dns: Some(dns),
        };
        let at = |a: [u8; 4], p: u16| SocketAddrV4::new(Ipv4Addr::from(a), p);
        // Positive controls: the proxy door, the DNS relay, an allowed
        // port at a door address and at a loopback one (a name pinned
        // there: the transparent door listens on every local address).
        assert_eq!(r.target(lo(3128)), Some(lo(3128)));
        assert_eq!(r.target(lo(53)), Some(dns));
        for a in [[198, 18, 0, 9], [127, 0, 0, 1], [93, 184, 216, 34]] {
            assert_eq!(r.target(at(a, 5432)), Some(at(a, 5432)), "{a:?}");
        }
        // A port the doors do not have, at any address; the proxy port
        // anywhere but the loopback; addresses that are no host.
        assert_eq!(r.target(lo(22)), None);
        assert_eq!(r.target(at([198, 18, 0, 9], 22)), None);
        assert_eq!(r.target(at([198, 18, 0, 9], 3128)), None);
        for a in [[0, 0, 0, 0], [255, 255, 255, 255], [224, 0, 0, 1]] {
            assert_eq!(r.target(at(a, 443)), None, "{a:?}");
        }
        // Without DNS, port 53 of the loopback is an ordinary one.
        let no_dns = Reach { dns: None, ..r };
        assert_eq!(no_dns.target(lo(53)), None);
    }

    /// A guest end and a host end joined by a socket pair (the port);
    /// returns the guest end and the host's result.
    fn channel(ports: Vec<u16>) -> (GuestNet, std::thread::JoinHandle<Result<(), String>>) {
        let (g, h) = UnixStream::pair().unwrap();
        let guest = GuestNet::start(g.try_clone().unwrap(), g).unwrap();
        let host = std::thread::spawn(move || {
            let out = h.try_clone().unwrap();
            serve_host(h, out, &reach(ports))
        });
        (guest, host)
    }

    /// A loopback listener standing for the guest's: each accepted
    /// connection goes into the guest end.
    fn guest_listener(net: GuestNet, port: u16) -> (u16, Arc<GuestNet>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let local = l.local_addr().unwrap().port();
        let net = Arc::new(net);
        let n = net.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                n.open(c, lo(port));
            }
        });
        (local, net)
    }

    /// A server answering each connection with `body(request)` and EOF.
    fn server(body: impl Fn(&[u8]) -> Vec<u8> + Send + Sync + 'static) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let body = Arc::new(body);
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let body = body.clone();
                std::thread::spawn(move || {
                    let mut c = c;
                    let mut req = Vec::new();
                    let mut buf = [0u8; 4096];
                    // The request ends at the client's half close.
                    while let Ok(n) = c.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        req.extend_from_slice(&buf[..n]);
                    }
                    let _ = c.write_all(&body(&req));
                });
            }
        });
        port
    }

    fn exchange(local: u16, req: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut c = TcpStream::connect(("127.0.0.1", local))?;
        c.set_read_timeout(Some(Duration::from_secs(20)))?;
        c.write_all(req)?;
        c.shutdown(Shutdown::Write)?;
        let mut out = Vec::new();
        c.read_to_end(&mut out)?;
        Ok(out)
    }

    fn wait_until(mut f: impl FnMut() -> bool) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn a_stream_carries_both_ways_and_ends_at_eof_both_ways() {
        let port = server(|req| [b"got ".as_slice(), req].concat());
        let (guest, _host) = channel(vec![port]);
        let (local, guest) = guest_listener(guest, port);
        assert_eq!(exchange(local, b"hello").unwrap(), b"got hello");
        assert!(wait_until(|| guest.streams() == 0), "the stream stayed");
        assert_eq!(guest.error(), None);
    }

    #[test]
    fn megabytes_both_ways_arrive_byte_exact_on_concurrent_streams() {
        let big: Vec<u8> = (0..5 * 1024 * 1024 + 17u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let want = Sha256::digest(&big);
        let port = server(|req| Sha256::digest(req).to_vec());
        let back = big.clone();
        let port2 = server(move |_| back.clone());
        let (guest, _host) = channel(vec![port, port2]);
        let (up_local, guest) = guest_listener(guest, port);
        let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
        let down_local = l2.local_addr().unwrap().port();
        let g2 = guest.clone();
        std::thread::spawn(move || {
            for c in l2.incoming().flatten() {
                g2.open(c, lo(port2));
            }
        });
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let big = big.clone();
                std::thread::spawn(move || {
                    if i % 2 == 0 {
                        exchange(up_local, &big).unwrap()
                    } else {
                        Sha256::digest(exchange(down_local, b"x").unwrap()).to_vec()
                    }
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), want.to_vec());
        }
        assert!(wait_until(|| guest.streams() == 0));
    }

    #[test]
    fn a_refused_or_unlisted_port_is_a_reset() {
        // A port nothing listens on.
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let listening = server(|_| b"secret".to_vec());
        let (guest, _host) = channel(vec![closed]);
        let (local, guest) = guest_listener(guest, closed);
        let got = exchange(local, b"x");
        assert!(
            matches!(&got, Ok(b) if b.is_empty()) || got.is_err(),
            "{got:?}"
        );
        // The host does not connect to a port it was not given.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let local2 = l.local_addr().unwrap().port();
        let g = guest.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                g.open(c, lo(listening));
            }
        });
        let got = exchange(local2, b"x");
        assert!(
            matches!(&got, Ok(b) if b.is_empty()) || got.is_err(),
            "{got:?}"
        );
        assert!(wait_until(|| guest.streams() == 0));
        assert_eq!(guest.error(), None);
    }

    #[test]
    fn data_past_the_window_ends_the_channel() {
        // The test is the host, frame by frame; the guest's client never
        // reads, so once the socket buffers are full the guest's writer
        // blocks and gives no more credit. Then one byte past the window
        // is refused.
        let (g, mut h) = UnixStream::pair().unwrap();
        let guest = GuestNet::start(g.try_clone().unwrap(), g).unwrap();
        let (local, guest) = guest_listener(guest, 80);
        let _client = TcpStream::connect(("127.0.0.1", local)).unwrap();
        h.set_read_timeout(Some(Duration::from_millis(1500)))
            .unwrap();
        let mut dec = Decoder::new();
        let mut buf = vec![0u8; 1 << 17];
        let mut next = |h: &mut UnixStream, dec: &mut Decoder| -> Option<Frame> {
            loop {
                if let Some(f) = dec.next_frame().unwrap() {
                    return Some(f);
                }
                match h.read(&mut buf) {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => dec.feed(&buf[..n]),
                }
            }
        };
        let Some(Frame::Open { id, to }) = next(&mut h, &mut dec) else {
            panic!("no open");
        };
        assert_eq!(to, lo(80));
        let mut outstanding: u32 = 0;
        let mut sent: u64 = 0;
        loop {
            assert!(sent < 256 << 20, "the guest kept giving credit");
            while outstanding < mux::WINDOW {
                let n = (mux::WINDOW - outstanding).min(mux::MAX_DATA as u32);
                let f = Frame::Data {
                    id,
                    bytes: vec![1; n as usize],
                };
                h.write_all(&f.encode().unwrap()).unwrap();
                outstanding += n;
                sent += u64::from(n);
            }
            match next(&mut h, &mut dec) {
                Some(Frame::Credit { bytes, .. }) => outstanding -= bytes,
                Some(other) => panic!("{other:?}"),
                // No credit for 1.5 s: the writer is stuck.
                None => break,
            }
        }
        let f = Frame::Data { id, bytes: vec![1] };
        h.write_all(&f.encode().unwrap()).unwrap();
        assert!(wait_until(|| guest.error().is_some()));
        let e = guest.error().unwrap();
        assert!(e.contains("past its window"), "{e}");
        assert_eq!(guest.streams(), 0);
    }

    /// The host end fed raw bytes: a malformed frame ends it with an error
    /// and shuts the streams it had open.
    fn host_fed(ports: Vec<u16>, frames: Vec<Vec<u8>>) -> (Result<(), String>, UnixStream) {
        let (mut g, h) = UnixStream::pair().unwrap();
        let host = std::thread::spawn(move || {
            let out = h.try_clone().unwrap();
            serve_host(h, out, &reach(ports))
        });
        for f in frames {
            // The host may have given up already.
            let _ = g.write_all(&f);
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = g.shutdown(Shutdown::Write);
        (host.join().unwrap(), g)
    }

    #[test]
    fn a_malformed_or_abusive_guest_ends_the_channel_without_a_panic() {
        let held = Arc::new(Mutex::new(Vec::new()));
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let h = held.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                lock(&h).push(c);
            }
        });
        let open = Frame::Open {
            id: 1,
            to: lo(port),
        }
        .encode()
        .unwrap();
        let data = |n: usize| {
            Frame::Data {
                id: 1,
                bytes: vec![7; n],
            }
            .encode()
            .unwrap()
        };
        let cases: Vec<(Vec<Vec<u8>>, &str)> = vec![
            (vec![open.clone(), vec![0, 0x10, 0, 0]], "bytes"),
            (vec![open.clone(), vec![0, 0, 0, 5, 42, 0, 0, 0, 1]], "kind"),
            (vec![open.clone(), open.clone()], "twice"),
            (
                vec![
                    open.clone(),
                    Frame::Credit {
                        id: 1,
                        bytes: mux::WINDOW,
                    }
                    .encode()
                    .unwrap(),
                ],
                "credit past",
            ),
            (
                vec![
                    open.clone(),
                    Frame::Close { id: 1 }.encode().unwrap(),
                    data(1),
                ],
                "after its close",
            ),
        ];
        for (frames, want) in cases {
            let (r, _g) = host_fed(vec![port], frames);
            let e = r.unwrap_err();
            assert!(e.contains(want), "{e} (want {want})");
        }
        // Too many streams.
        let frames = (1..=mux::MAX_STREAMS as u32 + 1)
            .map(|id| Frame::Open { id, to: lo(port) }.encode().unwrap())
            .collect();
        let (r, _g) = host_fed(vec![port], frames);
        assert!(r.unwrap_err().contains("more than"));
        // Unknown ids are dropped, not an error; the channel's EOF ends it.
        let (r, _g) = host_fed(
            vec![port],
            vec![
                data(3),
                Frame::Reset { id: 9 }.encode().unwrap(),
                Frame::Credit { id: 9, bytes: 1 }.encode().unwrap(),
            ],
        );
        assert_eq!(r, Ok(()));
        // Every connection the host made was shut when its channel ended.
        for c in lock(&held).iter_mut() {
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 1];
            assert!(matches!(c.read(&mut buf), Ok(0) | Err(_)));
        }
    }
}
