//! Value parsers shared by the variable table. Each returns the value or a
//! short description of what was expected, used in the warning text.

/// Parses an integer the way NCCL's `strtoll(s, NULL, 0)` reads a whole
/// string: optional sign, decimal or `0x` hexadecimal. Blanks are trimmed.
pub(crate) fn int(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let parsed = match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            i64::from_str_radix(hex, 16).ok()
        }
        Some(_) => None,
        None if !body.is_empty() && body.bytes().all(|b| b.is_ascii_digit()) => {
            body.parse::<i64>().ok()
        }
        None => None,
    };
    match parsed {
        Some(v) if neg => Ok(-v),
        Some(v) => Ok(v),
        None => Err("an integer".to_string()),
    }
}

/// An integer within `lo..=hi`.
pub(crate) fn int_in(s: &str, lo: i64, hi: i64) -> Result<i64, String> {
    match int(s) {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!("an integer from {lo} to {hi}")),
    }
}

/// A byte count: a non-negative integer with an optional binary suffix
/// `K`, `M`, `G` or `T` (case-insensitive; `KiB`/`KB` forms also accepted).
pub(crate) fn size(s: &str) -> Result<usize, String> {
    let err = || "a size in bytes (e.g. 4194304 or 4M)".to_string();
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    // Hex values ("0x400000") take no suffix.
    if lower.starts_with("0x") {
        return match int(t) {
            Ok(v) if v >= 0 => usize::try_from(v).map_err(|_| err()),
            _ => Err(err()),
        };
    }
    let digits_end = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (num, suffix) = lower.split_at(digits_end);
    let shift = match suffix.trim() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(err()),
    };
    if num.is_empty() {
        return Err(err());
    }
    let base: u64 = num.parse().map_err(|_| err())?;
    let bytes = base.checked_shl(shift).filter(|v| v >> shift == base);
    bytes.and_then(|v| usize::try_from(v).ok()).ok_or_else(err)
}

/// A congestion control name for `TCP_CONGESTION` (at most 15 lowercase
/// letters, digits or `_`, as the kernel's names are), or `system` (or an
/// empty value) for the host's default: `None`.
pub(crate) fn congestion(s: &str) -> Result<Option<String>, String> {
    let t = s.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("system") {
        return Ok(None);
    }
    let ok = t.len() < 16
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !ok {
        return Err(
            "a TCP congestion control name such as reno, cubic or bbr, or system".to_string(),
        );
    }
    Ok(Some(t.to_string()))
}

/// A size that must be at least 1.
pub(crate) fn size_nonzero(s: &str) -> Result<usize, String> {
    match size(s) {
        Ok(0) | Err(_) => Err("a size in bytes of at least 1 (e.g. 4194304 or 4M)".to_string()),
        Ok(v) => Ok(v),
    }
}

/// A boolean: `1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off`
/// (case-insensitive), or any integer (non-zero is true, as NCCL reads it).
pub(crate) fn boolean(s: &str) -> Result<bool, String> {
    let t = s.trim().to_ascii_lowercase();
    match t.as_str() {
        "true" | "yes" | "on" | "y" => Ok(true),
        "false" | "no" | "off" | "n" => Ok(false),
        _ => int(&t)
            .map(|v| v != 0)
            .map_err(|_| "0 or 1 (or true/false)".to_string()),
    }
}

/// A finite number of seconds, at least `min`.
pub(crate) fn seconds(s: &str, min: f64) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= min => Ok(v),
        _ => Err(format!("a finite number of seconds >= {min}")),
    }
}

/// A string that must not be empty after trimming (empty values never reach
/// the parsers, but blanks do).
pub(crate) fn text(s: &str) -> Result<String, String> {
    let t = s.trim();
    if t.is_empty() {
        Err("a non-blank string".to_string())
    } else {
        Ok(t.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_forms() {
        assert_eq!(int("42"), Ok(42));
        assert_eq!(int(" -2 "), Ok(-2));
        assert_eq!(int("+7"), Ok(7));
        assert_eq!(int("0x10"), Ok(16));
        assert_eq!(int("0X1f"), Ok(31));
        assert!(int("").is_err());
        assert!(int("0x").is_err());
        assert!(int("12abc").is_err());
        assert!(int("1.5").is_err());
        assert!(int("99999999999999999999").is_err());
        assert!(int("--1").is_err());
    }

    #[test]
    fn int_range() {
        assert_eq!(int_in("5", 1, 10), Ok(5));
        assert!(int_in("0", 1, 10).is_err());
        assert!(int_in("11", 1, 10).is_err());
    }

    #[test]
    fn size_forms() {
        assert_eq!(size("4194304"), Ok(4 << 20));
        assert_eq!(size("4M"), Ok(4 << 20));
        assert_eq!(size("4m"), Ok(4 << 20));
        assert_eq!(size("64KiB"), Ok(64 << 10));
        assert_eq!(size("1G"), Ok(1 << 30));
        assert_eq!(size("0x400000"), Ok(4 << 20));
        assert_eq!(size("0"), Ok(0));
        assert!(size("-1").is_err());
        assert!(size("4Q").is_err());
        assert!(size("M").is_err());
        assert!(size("1.5M").is_err());
        assert!(size("99999999999999999999T").is_err());
        assert!(size("16777216T").is_err());
        assert!(size_nonzero("0").is_err());
        assert_eq!(size_nonzero("1"), Ok(1));
    }

    #[test]
    fn bool_forms() {
        for t in ["1", "true", "YES", "on", "2", "0x1"] {
            assert_eq!(boolean(t), Ok(true), "{t}");
        }
        for f in ["0", "false", "No", "OFF"] {
            assert_eq!(boolean(f), Ok(false), "{f}");
        }
        assert!(boolean("maybe").is_err());
    }

    #[test]
    fn seconds_forms() {
        assert_eq!(seconds("300", 0.001), Ok(300.0));
        assert_eq!(seconds("0.5", 0.001), Ok(0.5));
        assert_eq!(seconds("0", 0.0), Ok(0.0));
        assert!(seconds("0", 0.001).is_err());
        assert!(seconds("-1", 0.0).is_err());
        assert!(seconds("inf", 0.0).is_err());
        assert!(seconds("NaN", 0.0).is_err());
        assert!(seconds("5s", 0.0).is_err());
    }

    #[test]
    fn text_trims() {
        assert_eq!(text(" eth0 "), Ok("eth0".to_string()));
        assert!(text("   ").is_err());
    }
}
