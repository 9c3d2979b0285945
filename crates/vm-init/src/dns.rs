//! The IPv4 addresses of a DNS answer, for the guest's init to make local
//! (as the DNS door makes them local in a native sandbox's namespace), and
//! DNS-over-TCP's framing, which carries each query to the host.
//!
//! Hand-written: the init is a static binary with no resolver library, and
//! it needs only the A records of one answer message (RFC 1035 4.1): the
//! header, the questions skipped, the answer section's records read. A
//! message that does not parse yields what parsed before the fault, never
//! a panic; names are skipped (compression pointers included) and never
//! followed, so no input loops.

use std::io::{Read, Write};
use std::net::Ipv4Addr;

const HEADER: usize = 12;
const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;

fn u16_at(m: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*m.get(at)?, *m.get(at + 1)?]))
}

/// The offset just past the name starting at `at`.
fn skip_name(m: &[u8], mut at: usize) -> Option<usize> {
    // A name is at most 255 bytes: 128 labels bound the walk.
    for _ in 0..128 {
        let len = *m.get(at)?;
        match len {
            0 => return Some(at + 1),
            // A compression pointer ends the name (two bytes).
            l if l & 0xc0 == 0xc0 => {
                m.get(at + 1)?;
                return Some(at + 2);
            }
            l if l & 0xc0 == 0 => at += 1 + usize::from(l),
            _ => return None,
        }
    }
    None
}

/// The addresses of the answer section's A records (class IN) of the DNS
/// response `m`; empty for a query, a failure or anything malformed.
pub fn a_records(m: &[u8]) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let Some(flags) = u16_at(m, 2) else {
        return out;
    };
    // A response (QR), code NOERROR.
    if flags & 0x8000 == 0 || flags & 0x000f != 0 {
        return out;
    }
    let (Some(qd), Some(an)) = (u16_at(m, 4), u16_at(m, 6)) else {
        return out;
    };
    let mut at = HEADER;
    for _ in 0..qd {
        let Some(next) = skip_name(m, at) else {
            return out;
        };
        at = next + 4;
    }
    for _ in 0..an {
        let Some(next) = skip_name(m, at) else {
            return out;
        };
        let (Some(ty), Some(class), Some(len)) =
            (u16_at(m, next), u16_at(m, next + 2), u16_at(m, next + 8))
        else {
            return out;
        };
        let data = next + 10;
        let Some(rdata) = m.get(data..data + usize::from(len)) else {
            return out;
        };
        if ty == TYPE_A
            && class == CLASS_IN
            && let Ok(a) = <[u8; 4]>::try_from(rdata)
        {
            out.push(Ipv4Addr::from(a));
        }
        at = data + usize::from(len);
    }
    out
}

/// Writes `msg` as one DNS-over-TCP message (a 2-byte length first).
pub fn write_tcp(w: &mut impl Write, msg: &[u8]) -> std::io::Result<()> {
    let len = u16::try_from(msg.len()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a DNS message over 64 KiB",
        )
    })?;
    let mut framed = Vec::with_capacity(2 + msg.len());
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(msg);
    w.write_all(&framed)?;
    w.flush()
}

/// Reads one DNS-over-TCP message; `None` at a clean end of the stream.
pub fn read_tcp(r: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    r.read_exact(&mut msg)?;
    Ok(Some(msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A response to `api.test A` with `answers` (type, rdata), the first
    /// name in full, the others as pointers to the question's.
    fn response(rcode: u16, answers: &[(u16, &[u8])]) -> Vec<u8> {
        let mut m = vec![0x12, 0x34];
        m.extend_from_slice(&(0x8180 | rcode).to_be_bytes());
        m.extend_from_slice(&1u16.to_be_bytes());
        m.extend_from_slice(&(answers.len() as u16).to_be_bytes());
        m.extend_from_slice(&[0, 0, 0, 0]);
        m.extend_from_slice(b"\x03api\x04test\x00");
        m.extend_from_slice(&[0, 1, 0, 1]);
        for (ty, rdata) in answers {
            m.extend_from_slice(&[0xc0, 12]);
            m.extend_from_slice(&ty.to_be_bytes());
            m.extend_from_slice(&[0, 1, 0, 0, 1, 44]);
            m.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            m.extend_from_slice(rdata);
        }
        m
    }

    #[test]
    fn the_a_records_of_an_answer_and_nothing_else() {
        let m = response(
            0,
            &[
                (5, b"\x03www\x00"),
                (1, &[198, 18, 0, 7]),
                (28, &[0; 16]),
                (1, &[93, 184, 216, 34]),
            ],
        );
        assert_eq!(
            a_records(&m),
            [
                Ipv4Addr::new(198, 18, 0, 7),
                Ipv4Addr::new(93, 184, 216, 34)
            ]
        );
        // NXDOMAIN, or a query: nothing.
        assert!(a_records(&response(3, &[(1, &[1, 2, 3, 4])])).is_empty());
        let mut q = response(0, &[(1, &[1, 2, 3, 4])]);
        q[2] &= 0x7f;
        assert!(a_records(&q).is_empty());
    }

    #[test]
    fn a_malformed_message_gives_what_parsed_before_it_and_never_panics() {
        let m = response(0, &[(1, &[10, 0, 0, 1]), (1, &[10, 0, 0, 2])]);
        // Every truncation.
        for n in 0..m.len() {
            let got = a_records(&m[..n]);
            assert!(got.len() <= 1, "{n}: {got:?}");
        }
        assert_eq!(a_records(&m).len(), 2);
        // A label length with the reserved bits, a record longer than the
        // message, an A record of 3 bytes.
        let mut bad = m.clone();
        bad[12] = 0x80;
        assert!(a_records(&bad).is_empty());
        let mut long = m.clone();
        let len_at = long.len() - 2 - 4 - 12 - 4;
        long[len_at] = 0xff;
        assert!(a_records(&long).len() <= 1);
        assert!(a_records(&response(0, &[(1, &[10, 0, 0])])).is_empty());
        // Every byte flipped, one at a time: no panic.
        for i in 0..m.len() {
            let mut f = m.clone();
            f[i] ^= 0xff;
            let _ = a_records(&f);
        }
    }

    #[test]
    fn tcp_framing_round_trips_and_ends_cleanly() {
        let mut wire = Vec::new();
        write_tcp(&mut wire, b"query").unwrap();
        write_tcp(&mut wire, b"").unwrap();
        assert_eq!(&wire[..2], &[0, 5]);
        let mut r = &wire[..];
        assert_eq!(read_tcp(&mut r).unwrap().as_deref(), Some(&b"query"[..]));
        assert_eq!(read_tcp(&mut r).unwrap().as_deref(), Some(&b""[..]));
        assert_eq!(read_tcp(&mut r).unwrap(), None);
        // A message cut short is an error, not an end.
        let mut cut = &wire[..4];
        assert!(read_tcp(&mut cut).is_err());
    }
}
