//! Byte sizes and durations as a person writes them (`512M`, `20s`).

use std::time::Duration;

/// Bytes the way a person writes them: `512M`, `2G`, `1536K`, `1000`
/// (the largest power of 1024, up to T, that divides `n`).
pub fn format_size(n: u64) -> String {
    for (shift, suffix) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        let unit = 1u64 << shift;
        if n >= unit && n.is_multiple_of(unit) {
            return format!("{}{suffix}", n / unit);
        }
    }
    n.to_string()
}

/// `20s`, `1.5s`, `250ms`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else if ms >= 1000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{ms}ms")
    }
}

/// A wall clock as `wall_seconds`: whole seconds as an integer (every
/// policy's), a shorter or finer one as a fraction.
pub(crate) mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        if d.subsec_nanos() == 0 {
            s.serialize_u64(d.as_secs())
        } else {
            s.serialize_f64(d.as_secs_f64())
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Secs {
        Whole(u64),
        Fraction(f64),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match Secs::deserialize(d)? {
            Secs::Whole(n) => Ok(Duration::from_secs(n)),
            Secs::Fraction(f) => Duration::try_from_secs_f64(f)
                .map_err(|e| serde::de::Error::custom(format!("wall_seconds {f}: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(format_size(512 << 20), "512M");
        assert_eq!(format_size(64 << 20), "64M");
        assert_eq!(format_size(1 << 30), "1G");
        assert_eq!(format_size(2 << 40), "2T");
        assert_eq!(format_size(1536 << 10), "1536K");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_size(2_000_000), "2000000");
        assert_eq!(format_size(0), "0");
    }

    #[test]
    fn durations() {
        assert_eq!(format_duration(Duration::from_secs(20)), "20s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }
}
