//! Human units: sizes like `512M` and durations like `30s`.
//!
//! Sizes are binary (K = 1024) because every consumer (cgroups, tmpfs, rlimits)
//! counts in bytes and users think of `512M` of memory as 512 MiB.

use crate::PolicyError;

/// Parses `123`, `64K`, `512M`, `1G`, `2T` (optionally with `B`, `iB`; case-insensitive) into bytes.
pub fn parse_size(text: &str) -> Result<u64, PolicyError> {
    let bad = || PolicyError::BadSize(text.to_string());
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(bad());
    }
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(bad()),
    };
    if number.contains('.') {
        let value: f64 = number.parse().map_err(|_| bad())?;
        let bytes = value * multiplier as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(bad());
        }
        Ok(bytes as u64)
    } else {
        let value: u64 = number.parse().map_err(|_| bad())?;
        value.checked_mul(multiplier).ok_or_else(bad)
    }
}

/// Parses `500ms`, `30s`, `2m`, `1h`, `30d` (a bare number means seconds) into
/// milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, PolicyError> {
    let bad = || PolicyError::BadDuration(text.to_string());
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(bad());
    }
    let ms_per_unit: f64 = match unit {
        "ms" => 1.0,
        "" | "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return Err(bad()),
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    let ms = (value * ms_per_unit).round();
    if !ms.is_finite() || ms < 0.0 || ms > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(ms as u64)
}

/// Parses a CPU count such as `1`, `0.5` or `2.25` into thousandths of a CPU.
pub fn parse_cpus_millis(text: &str) -> Result<u32, PolicyError> {
    let bad = || PolicyError::BadCpus(text.to_string());
    let value: f64 = text.trim().parse().map_err(|_| bad())?;
    let millis = (value * 1000.0).round();
    if !millis.is_finite() || millis < 1.0 || millis > u32::MAX as f64 {
        return Err(bad());
    }
    Ok(millis as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size(" 2T ").unwrap(), 2 << 40);
        for bad in [
            "",
            "M",
            "12Q",
            "-1",
            "1..2M",
            "99999999999999999999",
            "20000000T",
        ] {
            assert!(parse_size(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("500ms").unwrap(), 500);
        assert_eq!(parse_duration_ms("30s").unwrap(), 30_000);
        assert_eq!(parse_duration_ms("30").unwrap(), 30_000);
        assert_eq!(parse_duration_ms("1.5s").unwrap(), 1_500);
        assert_eq!(parse_duration_ms("2m").unwrap(), 120_000);
        assert_eq!(parse_duration_ms("1h").unwrap(), 3_600_000);
        assert_eq!(parse_duration_ms("30d").unwrap(), 2_592_000_000);
        for bad in ["", "s", "10x", "-5s", "1w"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn cpus() {
        assert_eq!(parse_cpus_millis("1").unwrap(), 1000);
        assert_eq!(parse_cpus_millis("0.5").unwrap(), 500);
        assert_eq!(parse_cpus_millis("2.25").unwrap(), 2250);
        for bad in ["0", "0.0001", "-1", "x", "", "inf", "NaN"] {
            assert!(parse_cpus_millis(bad).is_err(), "{bad} should be rejected");
        }
    }
}
