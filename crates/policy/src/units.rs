//! Byte sizes (`512M`), CPU quotas (`100%`) and their rendering.

use crate::manifest::Size;

/// Parse a size: an integer number of bytes, or digits followed by K, M, G
/// or T (optionally `i`/`iB`/`B`), all powers of 1024.
pub fn parse_size(size: &Size) -> Result<u64, String> {
    match size {
        Size::Bytes(n) => Ok(*n),
        Size::Text(s) => parse_size_str(s),
    }
}

pub fn parse_size_str(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let bad = || {
        format!(
            "invalid size `{s}`: write a whole number of bytes or one with a K, M, G or T suffix, e.g. 512M"
        )
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KI" | "KIB" | "KB" => 10,
        "M" | "MI" | "MIB" | "MB" => 20,
        "G" | "GI" | "GIB" | "GB" => 30,
        "T" | "TI" | "TIB" | "TB" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

/// Parse a duration: seconds, or a whole number with an `s`, `m`, `h` or
/// `d` suffix.
pub fn parse_duration(d: &crate::manifest::Duration) -> Result<u64, String> {
    let s = match d {
        crate::manifest::Duration::Seconds(n) => return Ok(*n),
        crate::manifest::Duration::Text(s) => s,
    };
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let bad = || {
        format!(
            "invalid duration `{s}`: write seconds or a number with an s, m, h or d suffix, e.g. 10m"
        )
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let unit = match suffix.trim() {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(unit)
        .ok_or_else(|| format!("duration `{s}` is too long"))
}

/// Parse a CPU quota: `N%` of one core, or a number of cores (`2` = 200%).
pub fn parse_cpu(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let bad = || {
        format!("invalid cpu `{s}`: write a percentage of one core, e.g. 100% (one core) or 50%")
    };
    let pct = if let Some(p) = t.strip_suffix('%') {
        p.trim().parse::<u32>().map_err(|_| bad())?
    } else {
        t.parse::<u32>()
            .map_err(|_| bad())?
            .checked_mul(100)
            .ok_or_else(bad)?
    };
    if pct == 0 {
        return Err(format!("cpu `{s}` is zero: the tool could never run"));
    }
    Ok(pct)
}

pub use cordon_sandbox::units::format_size;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size_str("512M"), Ok(512 << 20));
        assert_eq!(parse_size_str("2G"), Ok(2 << 30));
        assert_eq!(parse_size_str("2000000"), Ok(2_000_000));
        assert_eq!(parse_size_str("64KiB"), Ok(64 << 10));
        assert!(parse_size_str("12X").is_err());
        assert!(parse_size_str("M").is_err());
        assert!(parse_size_str("-1M").is_err());
        assert!(parse_size_str("99999999999T").is_err());
        assert_eq!(format_size(512 << 20), "512M");
        assert_eq!(format_size(2_000_000), "2000000");
    }

    #[test]
    fn cpu() {
        assert_eq!(parse_cpu("100%"), Ok(100));
        assert_eq!(parse_cpu("2"), Ok(200));
        assert!(parse_cpu("0%").is_err());
        assert!(parse_cpu("fast").is_err());
    }

    proptest::proptest! {
        #[test]
        fn format_parse_round_trip(n in 0u64..(1u64 << 50)) {
            proptest::prop_assert_eq!(parse_size_str(&format_size(n)), Ok(n));
        }
    }
}
