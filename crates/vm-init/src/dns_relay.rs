//! The host's end of the guest's DNS: a DNS-over-TCP listener on the
//! host helper's loopback (where [`crate::relay::Reach::dns`] sends the
//! guest's streams to `127.0.0.1:53`), each message sent on to the egress
//! DNS door over UDP and its answer sent back. The door decides; this only
//! carries.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::dns::{read_tcp, write_tcp};

/// How long a query waits for the door's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// A running relay; dropped, it stops accepting and closes its listener
/// before the drop returns (queries already accepted are answered).
#[derive(Debug)]
pub struct DnsRelay {
    addr: SocketAddrV4,
    stop: Arc<AtomicBool>,
    accepting: Option<JoinHandle<()>>,
}

impl DnsRelay {
    /// Listens on a free port of `127.0.0.1`, relaying to `door` (UDP).
    pub fn start(door: SocketAddr) -> std::io::Result<DnsRelay> {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = match l.local_addr()? {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => return Err(std::io::ErrorKind::AddrNotAvailable.into()),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let accepting = std::thread::Builder::new()
            .name("dns-relay".to_owned())
            .stack_size(128 * 1024)
            .spawn(move || {
                for c in l.incoming() {
                    // The drop's own connection wakes the accept.
                    if halt.load(Ordering::SeqCst) {
                        return;
                    }
                    match c {
                        Ok(c) => {
                            let _ = std::thread::Builder::new()
                                .name("dns-query".to_owned())
                                .stack_size(128 * 1024)
                                .spawn(move || serve(c, door));
                        }
                        // Out of descriptors, say: the client retries.
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })?;
        Ok(DnsRelay {
            addr,
            stop,
            accepting: Some(accepting),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddrV4 {
        self.addr
    }
}

impl Drop for DnsRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accepting thread, which then ends with the listener.
        if TcpStream::connect(self.addr).is_ok()
            && let Some(t) = self.accepting.take()
        {
            let _ = t.join();
        }
    }
}

/// Each message of `c` to the door and its answer back, until `c` ends or
/// the door does not answer in time.
fn serve(mut c: TcpStream, door: SocketAddr) {
    let _ = c.set_nonblocking(false);
    let Ok(udp) = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)) else {
        return;
    };
    if udp.connect(door).is_err() || udp.set_read_timeout(Some(ANSWER_WAIT)).is_err() {
        return;
    }
    let mut buf = vec![0u8; 65535];
    while let Ok(Some(q)) = read_tcp(&mut c) {
        if udp.send(&q).is_err() {
            return;
        }
        let Ok(n) = udp.recv(&mut buf) else {
            return;
        };
        if write_tcp(&mut c, &buf[..n]).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_goes_to_the_door_and_its_answer_comes_back() {
        // A door that answers each datagram with "answer:" and it.
        let door = UdpSocket::bind("127.0.0.1:0").unwrap();
        let door_addr = door.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut b = [0u8; 512];
            while let Ok((n, from)) = door.recv_from(&mut b) {
                let mut a = b"answer:".to_vec();
                a.extend_from_slice(&b[..n]);
                let _ = door.send_to(&a, from);
            }
        });
        let relay = DnsRelay::start(door_addr).unwrap();
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        for q in [&b"one"[..], b"two"] {
            write_tcp(&mut c, q).unwrap();
            let a = read_tcp(&mut c).unwrap().unwrap();
            assert_eq!(a, [b"answer:", q].concat());
        }
        // Dropped: its listener is closed by the time the drop returns.
        let addr = relay.addr();
        drop(relay);
        assert_eq!(
            TcpStream::connect(addr).map_err(|e| e.kind()).err(),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
    }
}
