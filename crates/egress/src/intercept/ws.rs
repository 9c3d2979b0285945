//! WebSocket frames from the tool (RFC 6455 §5): a client masks every
//! frame it sends with a 4-byte key of its own, so a placeholder in a
//! message is never in the bytes on the wire. Each frame's header is read
//! (extended lengths, the mask key), its payload unmasked as it streams
//! and scanned: the data frames' payloads (text, binary, continuation) as
//! one stream across frames and reads, the control frames' (close, ping,
//! pong, which may come between the fragments of a message) as another.
//!
//! What cannot be scanned is refused: a frame with a reserved bit set (RSV1
//! is a permessage-deflate compressed frame, RSV2 and RSV3 other
//! extensions), an unmasked frame, a reserved opcode, a fragmented or
//! oversized control frame, a continuation with no message begun or a new
//! message inside a fragmented one.

use std::sync::Arc;

use crate::scan::{Needles, Scanner};

/// Why a stream of frames ends.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The placeholder of this secret is in a payload.
    Placeholder(String),
    /// The stream is not WebSocket frames that can be scanned: why.
    Unscannable(String),
}

enum State {
    /// Reading a header: the bytes so far.
    Header(Vec<u8>),
    /// Reading a payload.
    Payload {
        left: u64,
        mask: [u8; 4],
        /// Offset of the next byte in the payload (for the mask).
        at: u64,
        control: bool,
    },
}

/// The tool's side of a WebSocket connection, frame by frame.
pub(crate) struct Frames {
    state: State,
    /// A fragmented data message is open (its last frame had FIN clear).
    in_message: bool,
    data: Scanner,
    control: Scanner,
    /// Reused for unmasked payload bytes.
    plain: Vec<u8>,
}

impl Frames {
    pub(crate) fn new(needles: Arc<Needles>) -> Frames {
        Frames {
            state: State::Header(Vec::with_capacity(14)),
            in_message: false,
            data: Scanner::new(needles.clone()),
            control: Scanner::new(needles),
            plain: Vec::new(),
        }
    }

    /// Read the next bytes of the stream.
    pub(crate) fn feed(&mut self, mut chunk: &[u8]) -> Result<(), Stop> {
        while !chunk.is_empty() {
            match &mut self.state {
                State::Header(h) => {
                    let need = header_len(h);
                    let take = (need - h.len()).min(chunk.len());
                    h.extend_from_slice(&chunk[..take]);
                    chunk = &chunk[take..];
                    // The length is known only once the first two bytes
                    // (and then the extended length) are in.
                    if h.len() == need && header_len(h) == need {
                        let h = std::mem::take(h);
                        self.state = self.header(&h)?;
                    }
                }
                State::Payload {
                    left,
                    mask,
                    at,
                    control,
                } => {
                    let n = (*left).min(chunk.len() as u64) as usize;
                    self.plain.clear();
                    self.plain.extend(
                        chunk[..n]
                            .iter()
                            .enumerate()
                            .map(|(i, b)| b ^ mask[((*at + i as u64) % 4) as usize]),
                    );
                    chunk = &chunk[n..];
                    *left -= n as u64;
                    *at += n as u64;
                    let scanner = if *control {
                        &mut self.control
                    } else {
                        &mut self.data
                    };
                    if let Some(s) = scanner.feed(&self.plain) {
                        return Err(Stop::Placeholder(s));
                    }
                    if *left == 0 {
                        self.state = State::Header(Vec::with_capacity(14));
                    }
                }
            }
        }
        Ok(())
    }

    /// The stream's end: an escape left open is decided.
    pub(crate) fn finish(&mut self) -> Result<(), Stop> {
        match self.data.finish().or_else(|| self.control.finish()) {
            Some(s) => Err(Stop::Placeholder(s)),
            None => Ok(()),
        }
    }

    /// A whole header: what follows it, or why the stream is refused.
    fn header(&mut self, h: &[u8]) -> Result<State, Stop> {
        let bad = |why: &str| Err(Stop::Unscannable(why.to_string()));
        let fin = h[0] & 0x80 != 0;
        let opcode = h[0] & 0x0F;
        if h[0] & 0x40 != 0 {
            return bad(
                "a compressed (permessage-deflate, RSV1) WebSocket frame, which cannot be scanned",
            );
        }
        if h[0] & 0x30 != 0 {
            return bad(
                "a WebSocket frame with a reserved bit (RSV2 or RSV3) set, of an extension whose frames cannot be scanned",
            );
        }
        if h[1] & 0x80 == 0 {
            return bad("an unmasked WebSocket frame from the client (RFC 6455 §5.1)");
        }
        let control = opcode & 0x08 != 0;
        match opcode {
            0x0 if !self.in_message => {
                return bad("a WebSocket continuation frame with no message begun");
            }
            0x1 | 0x2 if self.in_message => {
                return bad("a new WebSocket message inside a fragmented one");
            }
            0x0..=0x2 => self.in_message = !fin,
            0x8..=0xA => {}
            _ => return bad(&format!("a WebSocket frame of reserved opcode {opcode:#x}")),
        }
        let (left, ext) = match h[1] & 0x7F {
            126 => (u64::from(u16::from_be_bytes([h[2], h[3]])), 2),
            127 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&h[2..10]);
                let n = u64::from_be_bytes(b);
                if n >> 63 != 0 {
                    return bad("a WebSocket frame whose length has its top bit set");
                }
                (n, 8)
            }
            n => (u64::from(n), 0),
        };
        if control && (!fin || left > 125) {
            return bad("a fragmented or oversized WebSocket control frame");
        }
        let mut mask = [0u8; 4];
        mask.copy_from_slice(&h[2 + ext..6 + ext]);
        if left == 0 {
            return Ok(State::Header(Vec::with_capacity(14)));
        }
        Ok(State::Payload {
            left,
            mask,
            at: 0,
            control,
        })
    }
}

/// How long the header begun with `h` is, as far as `h` tells: 2 until the
/// second byte is in, then with the extended length and the mask key.
fn header_len(h: &[u8]) -> usize {
    if h.len() < 2 {
        return 2;
    }
    let ext = match h[1] & 0x7F {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if h[1] & 0x80 != 0 { 4 } else { 0 };
    2 + ext + mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PH: &str = "cordon-ph-Q7m2Xw9kLp3vZ8rT4nB6yH1s";

    fn frames() -> Frames {
        Frames::new(Arc::new(Needles::new([("API_TOKEN", PH)])))
    }

    /// A client frame: FIN, opcode, masked with `key`.
    fn frame(fin: bool, opcode: u8, payload: &[u8], key: [u8; 4]) -> Vec<u8> {
        let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
        let n = payload.len();
        if n < 126 {
            f.push(0x80 | n as u8);
        } else if n <= 0xFFFF {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
        f.extend_from_slice(&key);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        f
    }

    fn feed_split(f: &mut Frames, wire: &[u8], cuts: &[usize]) -> Result<(), Stop> {
        let mut at = 0;
        for &c in cuts {
            let c = c.min(wire.len()).max(at);
            f.feed(&wire[at..c])?;
            at = c;
        }
        f.feed(&wire[at..])?;
        f.finish()
    }

    #[test]
    fn a_masked_placeholder_is_not_in_the_wire_bytes_but_is_found() {
        let wire = frame(
            true,
            1,
            format!("{{\"t\":\"{PH}\"}}").as_bytes(),
            [1, 2, 3, 4],
        );
        // The raw bytes do not hold it: what a byte scan alone misses.
        assert!(!String::from_utf8_lossy(&wire).contains(PH));
        let mut f = frames();
        assert_eq!(
            feed_split(&mut f, &wire, &[]),
            Err(Stop::Placeholder("API_TOKEN".into()))
        );
        // Positive control: the same frame without it passes.
        let mut f = frames();
        let clean = frame(true, 1, b"{\"t\":\"hello\"}", [1, 2, 3, 4]);
        assert_eq!(feed_split(&mut f, &clean, &[]), Ok(()));
    }

    #[test]
    fn extended_lengths_are_read() {
        for size in [200usize, 70_000] {
            let mut payload = vec![b'x'; size];
            let at = size - PH.len() - 3;
            payload[at..at + PH.len()].copy_from_slice(PH.as_bytes());
            let mut f = frames();
            let wire = frame(true, 2, &payload, [0xde, 0xad, 0xbe, 0xef]);
            assert_eq!(
                feed_split(&mut f, &wire, &[1, 3, 9, 4000]),
                Err(Stop::Placeholder("API_TOKEN".into())),
                "{size}"
            );
            let mut f = frames();
            let wire = frame(true, 2, &vec![b'x'; size], [0xde, 0xad, 0xbe, 0xef]);
            assert_eq!(feed_split(&mut f, &wire, &[1, 3, 9, 4000]), Ok(()));
        }
    }

    #[test]
    fn refusals_name_what_cannot_be_scanned() {
        let key = [9, 8, 7, 6];
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                {
                    let mut f = frame(true, 1, b"compressed", key);
                    f[0] |= 0x40;
                    f
                },
                "permessage-deflate, RSV1",
            ),
            (
                {
                    let mut f = frame(true, 1, b"x", key);
                    f[0] |= 0x20;
                    f
                },
                "RSV2 or RSV3",
            ),
            (vec![0x81, 0x01, b'x'], "unmasked"),
            (frame(true, 3, b"x", key), "reserved opcode 0x3"),
            (frame(true, 0, b"x", key), "no message begun"),
            (frame(false, 9, b"x", key), "control frame"),
            (
                [frame(false, 1, b"a", key), frame(true, 2, b"b", key)].concat(),
                "inside a fragmented one",
            ),
        ];
        for (wire, want) in cases {
            let mut f = frames();
            match feed_split(&mut f, &wire, &[]) {
                Err(Stop::Unscannable(why)) => assert!(why.contains(want), "{why} / {want}"),
                other => panic!("{want}: {other:?}"),
            }
        }
    }

    proptest! {
        /// A placeholder split across fragments of a message, with control
        /// frames between them, each frame with its own key, the wire cut
        /// anywhere: found. The same stream without it: clean.
        #[test]
        fn found_across_fragments_control_frames_and_reads(
            keys in proptest::collection::vec(any::<[u8; 4]>(), 4),
            split in 1usize..33,
            pad in 0usize..300,
            cuts in proptest::collection::vec(0usize..800, 0..6),
            with in any::<bool>(),
        ) {
            let ph = if with { PH.to_string() } else { "cordon-ph-not-this-one-0000000000".into() };
            let text = format!("{}{ph}tail", "p".repeat(pad));
            let (a, b) = text.split_at(pad + split);
            let wire = [
                frame(false, 1, a.as_bytes(), keys[0]),
                frame(true, 9, b"ping", keys[1]),
                frame(true, 0, b.as_bytes(), keys[2]),
                frame(true, 8, &[3, 232], keys[3]),
            ]
            .concat();
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut f = frames();
            let got = feed_split(&mut f, &wire, &cuts);
            if with {
                prop_assert_eq!(got, Err(Stop::Placeholder("API_TOKEN".into())));
            } else {
                prop_assert_eq!(got, Ok(()));
            }
        }
    }
}
