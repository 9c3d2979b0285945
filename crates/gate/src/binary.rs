//! Binary outputs: the declared media type is checked against the bytes' signature.
//! Binary content is never altered.

use crate::{GateError, GateRefusal};

/// Does a byte string carry a signature?
type Check = fn(&[u8]) -> bool;

/// Signatures of the media types the gate knows: (media type, check).
const SIGNATURES: &[(&str, Check)] = &[
    ("image/png", |b| b.starts_with(b"\x89PNG\r\n\x1a\n")),
    ("image/jpeg", |b| b.starts_with(b"\xff\xd8\xff")),
    ("image/gif", |b| {
        b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a")
    }),
    ("image/webp", |b| {
        b.len() >= 12 && b.starts_with(b"RIFF") && &b[8..12] == b"WEBP"
    }),
    ("application/pdf", |b| b.starts_with(b"%PDF-")),
    ("image/bmp", |b| b.starts_with(b"BM")),
    ("image/tiff", |b| {
        b.starts_with(b"II*\0") || b.starts_with(b"MM\0*")
    }),
    ("application/zip", |b| {
        b.starts_with(b"PK\x03\x04") || b.starts_with(b"PK\x05\x06")
    }),
    ("application/gzip", |b| b.starts_with(b"\x1f\x8b")),
    ("audio/wav", |b| {
        b.len() >= 12 && b.starts_with(b"RIFF") && &b[8..12] == b"WAVE"
    }),
];

/// Aliases folded to the canonical name before lookup.
fn canonical(media_type: &str) -> &str {
    match media_type {
        "image/jpg" | "image/pjpeg" => "image/jpeg",
        "application/x-pdf" => "application/pdf",
        "application/x-gzip" => "application/gzip",
        "application/x-zip-compressed" => "application/zip",
        "audio/x-wav" | "audio/wave" => "audio/wav",
        other => other,
    }
}

/// The media types whose signature the gate checks.
pub fn known_media_types() -> impl Iterator<Item = &'static str> {
    SIGNATURES.iter().map(|(m, _)| *m)
}

/// The known media type whose signature these bytes carry, if any.
pub fn sniff(bytes: &[u8]) -> Option<&'static str> {
    SIGNATURES
        .iter()
        .find(|(_, check)| check(bytes))
        .map(|(m, _)| *m)
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 127
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
}

/// Lower-case `type/subtype`, parameters dropped; refuse anything else (the media type ends
/// up in MCP content and in labels, so it must be a plain token).
pub(crate) fn normalise_media_type(m: &str) -> Result<String, GateError> {
    let bare = m
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match bare.split_once('/') {
        Some((t, s)) if is_token(t) && is_token(s) => Ok(canonical(&bare).to_owned()),
        _ => Err(GateError::InvalidMediaType {
            media_type: m.chars().take(64).collect(),
        }),
    }
}

/// Check the signature of `bytes` against `media_type`. `Ok(Some(note))` for a type the gate
/// has no signature for (size-only check).
pub(crate) fn check_magic(media_type: &str, bytes: &[u8]) -> Result<Option<String>, GateRefusal> {
    match SIGNATURES.iter().find(|(m, _)| *m == media_type) {
        Some((_, check)) if check(bytes) => Ok(None),
        Some(_) => Err(GateRefusal::MediaTypeMismatch {
            declared: media_type.to_owned(),
            detected: sniff(bytes),
        }),
        None => Ok(Some(format!(
            "media type {media_type} has no known signature: only its size was checked"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_are_normalised_and_validated() {
        assert_eq!(
            normalise_media_type("Image/PNG; charset=binary").unwrap(),
            "image/png"
        );
        assert_eq!(normalise_media_type("image/jpg").unwrap(), "image/jpeg");
        assert!(matches!(
            normalise_media_type("png"),
            Err(GateError::InvalidMediaType { .. })
        ));
        assert!(matches!(
            normalise_media_type("image/png\nx: y"),
            Err(GateError::InvalidMediaType { .. })
        ));
        assert!(matches!(
            normalise_media_type("image/\"png\""),
            Err(GateError::InvalidMediaType { .. })
        ));
    }

    #[test]
    fn signatures_match_and_mismatch() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        assert_eq!(check_magic("image/png", png), Ok(None));
        assert_eq!(
            check_magic("image/jpeg", png),
            Err(GateRefusal::MediaTypeMismatch {
                declared: "image/jpeg".into(),
                detected: Some("image/png")
            })
        );
        assert_eq!(check_magic("image/webp", b"RIFF\0\0\0\0WEBPVP8 "), Ok(None));
        assert!(check_magic("image/webp", b"RIFF\0\0\0\0WAVEfmt ").is_err());
        assert_eq!(check_magic("application/pdf", b"%PDF-1.7\n"), Ok(None));
        assert_eq!(check_magic("image/gif", b"GIF89a\x01\x00"), Ok(None));
        assert!(check_magic("image/png", b"").is_err());
        assert!(
            check_magic("application/x-thing", b"anything")
                .unwrap()
                .is_some()
        );
    }
}
