//! The framing of the network channel (`cordon.net`): many TCP streams
//! over one virtio-serial port. Pure: bytes in, frames out, and back; the
//! threads and sockets that use it are in [`crate::relay`].
//!
//! A frame is a 4-byte big-endian length `L` (of what follows), a kind
//! byte, a 4-byte big-endian stream id, and `L - 5` bytes of body:
//!
//! | kind | frame | body | direction |
//! |---|---|---|---|
//! | 1 | `Open { id, to }` | IPv4 address and port, 6 bytes BE | guest → host |
//! | 2 | `Data { id, bytes }` | 1 to [`MAX_DATA`] bytes | both |
//! | 3 | `Close { id }` | none | both: the sender's end of file |
//! | 4 | `Reset { id }` | none | both: the stream is gone |
//! | 5 | `Credit { id, bytes }` | 4 bytes BE, at least 1 | both |
//!
//! Only the guest opens streams (it allocates their ids). A stream ends
//! when both sides have sent `Close`, or at once at a `Reset` from either
//! side (the host answers an `Open` it cannot connect with `Reset`).
//!
//! Flow control is a window per stream and direction: a side may have at
//! most [`WINDOW`] bytes of `Data` that its peer has not yet given back
//! with `Credit`; the receiver gives credit once it has written the bytes
//! to its socket. So what a side buffers for a stream is bounded by the
//! window, and for all streams by `WINDOW × MAX_STREAMS`; data past the
//! window is a protocol error.
//!
//! Anything malformed (a length over [`MAX_FRAME`] or under the header, an
//! unknown kind, a body of the wrong size for its kind, an empty `Data`,
//! a zero `Credit`) is a [`FrameError`]: the framing cannot be trusted
//! after it, and the channel is torn down (every stream reset). Frames
//! for an id that is not open are the relay's business, not a framing
//! error.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

/// The most bytes of one `Data` frame.
pub const MAX_DATA: usize = 64 * 1024;
/// Kind and id.
pub const HEADER: usize = 5;
/// The largest value of a frame's length prefix.
pub const MAX_FRAME: usize = HEADER + MAX_DATA;
/// Bytes of `Data` a side may send on one stream ahead of its peer's
/// `Credit`.
pub const WINDOW: u32 = 256 * 1024;
/// Streams open at once on one channel (the guest refuses connections
/// past it; the host tears the channel down when a guest opens more).
pub const MAX_STREAMS: usize = 32;

const OPEN: u8 = 1;
const DATA: u8 = 2;
const CLOSE: u8 = 3;
const RESET: u8 = 4;
const CREDIT: u8 = 5;

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A connection to `to` (guest → host): the address the tool dialed
    /// in the guest, a loopback door's or one the egress doors made local.
    Open { id: u32, to: SocketAddrV4 },
    /// Bytes of the stream.
    Data { id: u32, bytes: Vec<u8> },
    /// The sender sends no more on this stream (its read side saw EOF).
    Close { id: u32 },
    /// The stream is gone, both ways (a refused connect, an error).
    Reset { id: u32 },
    /// The receiver wrote `bytes` of the stream out: the sender may send
    /// that much more.
    Credit { id: u32, bytes: u32 },
}

impl Frame {
    /// The stream the frame is about.
    pub fn id(&self) -> u32 {
        match self {
            Frame::Open { id, .. }
            | Frame::Data { id, .. }
            | Frame::Close { id }
            | Frame::Reset { id }
            | Frame::Credit { id, .. } => *id,
        }
    }

    /// The frame on the wire. `Data` longer than [`MAX_DATA`] is the
    /// caller's bug: [`FrameError::Oversize`].
    pub fn encode(&self) -> Result<Vec<u8>, FrameError> {
        let open;
        let (kind, body): (u8, &[u8]) = match self {
            Frame::Open { to, .. } => {
                let mut b = [0u8; 6];
                b[..4].copy_from_slice(&to.ip().octets());
                b[4..].copy_from_slice(&to.port().to_be_bytes());
                open = b;
                (OPEN, &open[..])
            }
            Frame::Data { bytes, .. } => {
                if bytes.is_empty() {
                    return Err(FrameError::Body { kind: DATA, len: 0 });
                }
                (DATA, bytes)
            }
            Frame::Close { .. } => (CLOSE, &[]),
            Frame::Reset { .. } => (RESET, &[]),
            Frame::Credit { bytes, .. } => {
                if *bytes == 0 {
                    return Err(FrameError::Body {
                        kind: CREDIT,
                        len: 0,
                    });
                }
                (CREDIT, &bytes.to_be_bytes()[..])
            }
        };
        let len = HEADER + body.len();
        if len > MAX_FRAME {
            return Err(FrameError::Oversize(len));
        }
        let mut out = Vec::with_capacity(4 + len);
        // `len` is at most MAX_FRAME, which fits.
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.push(kind);
        out.extend_from_slice(&self.id().to_be_bytes());
        out.extend_from_slice(body);
        Ok(out)
    }
}

/// A malformed frame: the channel is torn down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// A length prefix over [`MAX_FRAME`].
    Oversize(usize),
    /// A length prefix under the header.
    Short(usize),
    /// An unknown kind byte.
    Kind(u8),
    /// A body of the wrong size for its kind.
    Body { kind: u8, len: usize },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Oversize(n) => write!(f, "a frame of {n} bytes (at most {MAX_FRAME})"),
            FrameError::Short(n) => write!(f, "a frame of {n} bytes (at least {HEADER})"),
            FrameError::Kind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::Body { kind, len } => {
                write!(f, "a body of {len} bytes for a frame of kind {kind}")
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// Frames out of a byte stream read in pieces of any size.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Where the next frame starts in `buf`.
    at: usize,
    /// A malformed frame was seen: nothing more comes out.
    broken: Option<FrameError>,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Adds bytes read from the channel.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.broken.is_some() {
            return;
        }
        if self.at > 0 && self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        } else if self.at > MAX_FRAME {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, `None` until one is whole, or the error
    /// that broke the stream (again on every later call). What is buffered
    /// stays under two frames' worth, as long as the caller takes every
    /// frame before feeding more.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let r = self.parse();
        if let Err(e) = &r {
            self.broken = Some(e.clone());
            self.buf = Vec::new();
            self.at = 0;
        }
        r
    }

    fn parse(&mut self) -> Result<Option<Frame>, FrameError> {
        let rest = &self.buf[self.at..];
        let Some(prefix) = rest.first_chunk::<4>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*prefix) as usize;
        if len > MAX_FRAME {
            return Err(FrameError::Oversize(len));
        }
        if len < HEADER {
            return Err(FrameError::Short(len));
        }
        let Some(&kind) = rest.get(4) else {
            return Ok(None);
        };
        if !(OPEN..=CREDIT).contains(&kind) {
            return Err(FrameError::Kind(kind));
        }
        let Some(frame) = rest.get(4..4 + len) else {
            return Ok(None);
        };
        let id = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]);
        let body = &frame[HEADER..];
        let bad = || FrameError::Body {
            kind,
            len: body.len(),
        };
        let f = match kind {
            OPEN => {
                let b: [u8; 6] = body.try_into().map_err(|_| bad())?;
                Frame::Open {
                    id,
                    to: SocketAddrV4::new(
                        Ipv4Addr::new(b[0], b[1], b[2], b[3]),
                        u16::from_be_bytes([b[4], b[5]]),
                    ),
                }
            }
            DATA if !body.is_empty() => Frame::Data {
                id,
                bytes: body.to_vec(),
            },
            CLOSE if body.is_empty() => Frame::Close { id },
            RESET if body.is_empty() => Frame::Reset { id },
            CREDIT => match u32::from_be_bytes(body.try_into().map_err(|_| bad())?) {
                0 => return Err(bad()),
                bytes => Frame::Credit { id, bytes },
            },
            _ => return Err(bad()),
        };
        self.at += 4 + len;
        Ok(Some(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Frame> {
        vec![
            Frame::Open {
                id: 1,
                to: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 3128),
            },
            Frame::Data {
                id: 1,
                bytes: b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            },
            Frame::Credit { id: 1, bytes: 18 },
            Frame::Data {
                id: 7,
                bytes: (0..MAX_DATA).map(|i| i as u8).collect(),
            },
            Frame::Close { id: 1 },
            Frame::Reset { id: u32::MAX },
        ]
    }

    fn wire(frames: &[Frame]) -> Vec<u8> {
        frames.iter().flat_map(|f| f.encode().unwrap()).collect()
    }

    fn drain(d: &mut Decoder) -> Vec<Frame> {
        let mut out = Vec::new();
        while let Some(f) = d.next_frame().unwrap() {
            out.push(f);
        }
        out
    }

    #[test]
    fn the_layout_is_length_kind_id_body() {
        assert_eq!(
            Frame::Open {
                id: 2,
                to: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 7), 3128)
            }
            .encode()
            .unwrap(),
            [0, 0, 0, 11, 1, 0, 0, 0, 2, 198, 18, 0, 7, 0x0c, 0x38]
        );
        assert_eq!(
            Frame::Close { id: 3 }.encode().unwrap(),
            [0, 0, 0, 5, 3, 0, 0, 0, 3]
        );
    }

    #[test]
    fn frames_come_back_whole_in_one_piece() {
        let frames = all();
        let mut d = Decoder::new();
        d.feed(&wire(&frames));
        assert_eq!(drain(&mut d), frames);
        assert_eq!(d.next_frame(), Ok(None));
    }

    #[test]
    fn frames_come_back_whole_from_split_reads() {
        let frames = all();
        let bytes = wire(&frames);
        for piece in [1, 2, 3, 4, 5, 7, 4096, 65_541] {
            let mut d = Decoder::new();
            let mut got = Vec::new();
            for chunk in bytes.chunks(piece) {
                d.feed(chunk);
                got.extend(drain(&mut d));
                // Taken frames do not pile up.
                assert!(d.buf.len() - d.at <= 2 * (4 + MAX_FRAME), "{piece}");
            }
            assert_eq!(got, frames, "pieces of {piece}");
        }
    }

    #[test]
    fn malformed_frames_break_the_decoder_without_a_panic() {
        let cases: Vec<(Vec<u8>, FrameError)> = vec![
            (
                ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec(),
                FrameError::Oversize(MAX_FRAME + 1),
            ),
            (
                vec![0xff, 0xff, 0xff, 0xff],
                FrameError::Oversize(u32::MAX as usize),
            ),
            (vec![0, 0, 0, 4, 1, 0, 0, 0], FrameError::Short(4)),
            (vec![0, 0, 0, 5, 9, 0, 0, 0, 1], FrameError::Kind(9)),
            (vec![0, 0, 0, 5, 0, 0, 0, 0, 1], FrameError::Kind(0)),
            (
                vec![0, 0, 0, 6, 1, 0, 0, 0, 1, 80],
                FrameError::Body { kind: 1, len: 1 },
            ),
            (
                vec![0, 0, 0, 5, 2, 0, 0, 0, 1],
                FrameError::Body { kind: 2, len: 0 },
            ),
            (
                vec![0, 0, 0, 6, 3, 0, 0, 0, 1, 0],
                FrameError::Body { kind: 3, len: 1 },
            ),
            (
                vec![0, 0, 0, 9, 5, 0, 0, 0, 1, 0, 0, 0, 0],
                FrameError::Body { kind: 5, len: 4 },
            ),
        ];
        for (bytes, want) in cases {
            // After a good frame, fed whole and byte by byte.
            for piece in [bytes.len() + 11, 1] {
                let mut d = Decoder::new();
                let mut all = Frame::Close { id: 1 }.encode().unwrap();
                all.extend_from_slice(&bytes);
                let mut result = Ok(());
                let mut got = Vec::new();
                for chunk in all.chunks(piece) {
                    d.feed(chunk);
                    loop {
                        match d.next_frame() {
                            Ok(Some(f)) => got.push(f),
                            Ok(None) => break,
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                }
                assert_eq!(got, vec![Frame::Close { id: 1 }]);
                assert_eq!(result, Err(want.clone()), "{bytes:?}");
                // Broken for good: more bytes do not revive it.
                d.feed(&Frame::Close { id: 2 }.encode().unwrap());
                assert_eq!(d.next_frame(), Err(want.clone()));
            }
        }
    }

    #[test]
    fn an_oversize_length_is_refused_before_its_body_arrives() {
        let mut d = Decoder::new();
        d.feed(&[0, 0x10, 0, 0]);
        assert_eq!(d.next_frame(), Err(FrameError::Oversize(0x10_0000)));
    }

    #[test]
    fn encode_refuses_what_decode_would() {
        assert!(
            Frame::Data {
                id: 1,
                bytes: vec![0; MAX_DATA + 1]
            }
            .encode()
            .is_err()
        );
        assert!(
            Frame::Data {
                id: 1,
                bytes: Vec::new()
            }
            .encode()
            .is_err()
        );
        assert!(Frame::Credit { id: 1, bytes: 0 }.encode().is_err());
    }
}
