//! Content digests (`sha256:HEX`, the only algorithm accepted) and a reader
//! that verifies a blob's size and digest while it is read.

use std::fmt;
use std::io::{self, Read};
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// A sha256 content digest, written `sha256:` and 64 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

/// Why a string is not a digest this crate accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    /// No `ALGORITHM:` prefix.
    #[error("`{0}` is not a digest (expected sha256:<64 hex digits>)")]
    Malformed(String),
    /// A well-formed digest of another algorithm.
    #[error("digest algorithm `{0}` is not supported (only sha256)")]
    UnsupportedAlgorithm(String),
    /// `sha256:` followed by something other than 64 lower-case hex digits.
    #[error("`{0}` is not a sha256 digest (expected 64 lower-case hex digits after sha256:)")]
    BadHex(String),
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// A digest from its 64 hex digits (no `sha256:` prefix).
    pub fn from_hex(hex_digits: &str) -> Result<Digest, DigestError> {
        let bad = || DigestError::BadHex(format!("sha256:{hex_digits}"));
        if hex_digits.len() != 64
            || !hex_digits
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_digits, &mut out).map_err(|_| bad())?;
        Ok(Digest(out))
    }

    /// A digest from the 32 bytes of a sha256 hash.
    pub fn from_bytes(bytes: [u8; 32]) -> Digest {
        Digest(bytes)
    }

    /// The 64 lower-case hex digits, without the algorithm.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Digest, DigestError> {
        let Some((algorithm, encoded)) = s.split_once(':') else {
            return Err(DigestError::Malformed(s.to_string()));
        };
        if algorithm != "sha256" {
            let known = !algorithm.is_empty()
                && algorithm
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b));
            return Err(if known && !encoded.is_empty() {
                DigestError::UnsupportedAlgorithm(algorithm.to_string())
            } else {
                DigestError::Malformed(s.to_string())
            });
        }
        Digest::from_hex(encoded)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A blob that did not match what named it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// More bytes than the descriptor's size (reported as soon as they arrive).
    #[error("blob {digest} is larger than its expected size of {expected} bytes")]
    TooLong {
        /// The expected digest.
        digest: Digest,
        /// The expected size.
        expected: u64,
    },
    /// The content ended before the descriptor's size.
    #[error("blob {digest} is {actual} bytes, expected {expected}")]
    WrongSize {
        /// The expected digest.
        digest: Digest,
        /// The expected size.
        expected: u64,
        /// What arrived.
        actual: u64,
    },
    /// The right size, the wrong content.
    #[error("blob content does not match its digest: expected {expected}, got {actual}")]
    WrongDigest {
        /// The expected digest.
        expected: Digest,
        /// The digest of what arrived.
        actual: Digest,
    },
}

impl VerifyError {
    /// The `io::Error` (kind `InvalidData`) that carries this error; recover it
    /// with [`VerifyError::from_io`].
    pub fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, self)
    }

    /// The verification error inside `e`, if that is what it carries.
    pub fn from_io(e: &io::Error) -> Option<&VerifyError> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<VerifyError>())
    }
}

/// Incremental verification of a blob against its digest and size: feed it
/// the bytes in order, then [`Verifier::finish`].
#[derive(Clone)]
pub struct Verifier {
    hasher: Sha256,
    expected: Digest,
    size: u64,
    seen: u64,
}

impl Verifier {
    /// Expect `size` bytes whose digest is `expected`.
    pub fn new(expected: Digest, size: u64) -> Verifier {
        Verifier {
            hasher: Sha256::new(),
            expected,
            size,
            seen: 0,
        }
    }

    /// Account for the next bytes; fails as soon as they go past the size.
    pub fn update(&mut self, bytes: &[u8]) -> Result<(), VerifyError> {
        let len = bytes.len() as u64;
        if self.seen.saturating_add(len) > self.size {
            return Err(VerifyError::TooLong {
                digest: self.expected,
                expected: self.size,
            });
        }
        self.seen += len;
        self.hasher.update(bytes);
        Ok(())
    }

    /// The digest expected.
    pub fn expected(&self) -> Digest {
        self.expected
    }

    /// Bytes accounted for so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Check the total size and the digest.
    pub fn finish(self) -> Result<(), VerifyError> {
        if self.seen != self.size {
            return Err(VerifyError::WrongSize {
                digest: self.expected,
                expected: self.size,
                actual: self.seen,
            });
        }
        let actual = Digest(self.hasher.finalize().into());
        if actual != self.expected {
            return Err(VerifyError::WrongDigest {
                expected: self.expected,
                actual,
            });
        }
        Ok(())
    }
}

/// A reader that checks the byte count and sha256 of what it reads: a read
/// that would go past the expected size fails at once, and end of input
/// fails unless the size and digest both match. A consumer that stops
/// before end of input has not had the content verified (see
/// [`VerifyingReader::is_verified`]).
pub struct VerifyingReader<R> {
    inner: R,
    state: State,
}

enum State {
    Reading(Verifier),
    Verified,
    Failed(VerifyError),
}

impl<R: Read> VerifyingReader<R> {
    /// Read `inner`, expecting `size` bytes whose digest is `expected`.
    pub fn new(inner: R, expected: Digest, size: u64) -> VerifyingReader<R> {
        VerifyingReader {
            inner,
            state: State::Reading(Verifier::new(expected, size)),
        }
    }

    /// Whether end of input was reached with the size and digest matching.
    pub fn is_verified(&self) -> bool {
        matches!(self.state, State::Verified)
    }

    /// Read the rest of the input (discarding it) and report the verdict.
    pub fn finish(mut self) -> io::Result<()> {
        io::copy(&mut self, &mut io::sink())?;
        if self.is_verified() {
            Ok(())
        } else {
            Err(io::Error::other("blob was not read to its end"))
        }
    }
}

impl<R: Read> Read for VerifyingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let verifier = match &mut self.state {
            State::Reading(v) => v,
            State::Verified => return Ok(0),
            State::Failed(e) => return Err(e.clone().into_io()),
        };
        if buf.is_empty() {
            return Ok(0);
        }
        // Ask for one byte more than is left, so that an over-long blob is
        // noticed at the boundary rather than at its end.
        let left = verifier.size - verifier.seen;
        let want = buf
            .len()
            .min(usize::try_from(left.saturating_add(1)).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            let State::Reading(v) = std::mem::replace(&mut self.state, State::Verified) else {
                return Ok(0);
            };
            return match v.finish() {
                Ok(()) => Ok(0),
                Err(e) => {
                    self.state = State::Failed(e.clone());
                    Err(e.into_io())
                }
            };
        }
        if let Err(e) = verifier.update(&buf[..n]) {
            self.state = State::Failed(e.clone());
            return Err(e.into_io());
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn parse_and_display() {
        let d: Digest = EMPTY.parse().unwrap();
        assert_eq!(d.to_string(), EMPTY);
        assert_eq!(d, Digest::of(b""));
        let e = "sha512:abcd".parse::<Digest>().unwrap_err();
        assert!(e.to_string().contains("sha512"), "{e}");
        assert!(matches!(e, DigestError::UnsupportedAlgorithm(_)));
        assert!("sha256:ABC".parse::<Digest>().is_err());
        assert!(EMPTY.to_uppercase().parse::<Digest>().is_err());
        assert!("e3b0".parse::<Digest>().is_err());
    }

    fn read_all(data: &[u8], d: Digest, size: u64) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        VerifyingReader::new(data, d, size).read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn verifying_reader() {
        let data = b"hello world";
        let d = Digest::of(data);
        assert_eq!(read_all(data, d, 11).unwrap(), data);
        let e = read_all(data, d, 12).unwrap_err();
        assert!(matches!(
            VerifyError::from_io(&e),
            Some(VerifyError::WrongSize { actual: 11, .. })
        ));
        let e = read_all(data, d, 5).unwrap_err();
        assert!(matches!(
            VerifyError::from_io(&e),
            Some(VerifyError::TooLong { .. })
        ));
        let e = read_all(b"hello worle", d, 11).unwrap_err();
        assert!(matches!(
            VerifyError::from_io(&e),
            Some(VerifyError::WrongDigest { .. })
        ));
    }

    #[test]
    fn too_long_fails_before_the_end() {
        let data = vec![0u8; 1 << 20];
        let mut r = VerifyingReader::new(&data[..], Digest::of(b"x"), 10);
        let mut buf = [0u8; 64];
        // The first read asks for size + 1 bytes: the 11th is one too many.
        let e = r.read(&mut buf).unwrap_err();
        assert!(matches!(
            VerifyError::from_io(&e),
            Some(VerifyError::TooLong { .. })
        ));
    }
}
