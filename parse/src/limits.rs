//! Sizes (`64m`, `1g`), CPU amounts (`0.5`, `500m`) and durations (`500ms`, `2m`), as
//! people type them on the command line and in profiles files.

use std::time::Duration;

/// One attempt's limits, typed: a profile's defaults or ceilings, a request's asks, what a
/// rung applied. `None`: not given (a default fills it, or the rung's own fallback).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Memory in bytes (swap off).
    pub memory_bytes: Option<u64>,
    /// CPU in millicores (1000 = one core).
    pub cpu_millis: Option<u64>,
    /// Processes (and threads).
    pub pids: Option<u64>,
    /// Bytes the attempt may occupy in `/out` and any other writable volume.
    pub disk_bytes: Option<u64>,
    /// GPUs in milli-devices (whole devices are applied, rounded up).
    pub gpu_millis: Option<u64>,
    /// Open files per process.
    pub nofile: Option<u64>,
}

impl Limits {
    /// No limit given.
    pub const NONE: Limits =
        Limits { memory_bytes: None, cpu_millis: None, pids: None, disk_bytes: None, gpu_millis: None, nofile: None };

    /// Every dimension with its key (the serde edge's word), in a fixed order.
    pub fn dims(&self) -> [(&'static str, Option<u64>); 6] {
        [
            ("memory", self.memory_bytes),
            ("cpu", self.cpu_millis),
            ("pids", self.pids),
            ("disk", self.disk_bytes),
            ("gpu", self.gpu_millis),
            ("nofile", self.nofile),
        ]
    }

    /// The dimension named `key`, to set.
    pub fn dim_mut(&mut self, key: &str) -> Option<&mut Option<u64>> {
        Some(match key {
            "memory" => &mut self.memory_bytes,
            "cpu" => &mut self.cpu_millis,
            "pids" => &mut self.pids,
            "disk" => &mut self.disk_bytes,
            "gpu" => &mut self.gpu_millis,
            "nofile" => &mut self.nofile,
            _ => return None,
        })
    }

    /// Sets `memory_bytes` (builder style).
    pub const fn memory(mut self, bytes: u64) -> Self {
        self.memory_bytes = Some(bytes);
        self
    }
    /// Sets `cpu_millis`.
    pub const fn cpu(mut self, millis: u64) -> Self {
        self.cpu_millis = Some(millis);
        self
    }
    /// Sets `pids`.
    pub const fn pids(mut self, n: u64) -> Self {
        self.pids = Some(n);
        self
    }
    /// Sets `disk_bytes`.
    pub const fn disk(mut self, bytes: u64) -> Self {
        self.disk_bytes = Some(bytes);
        self
    }
    /// Sets `gpu_millis`.
    pub const fn gpu(mut self, millis: u64) -> Self {
        self.gpu_millis = Some(millis);
        self
    }
    /// Sets `nofile`.
    pub const fn nofile(mut self, n: u64) -> Self {
        self.nofile = Some(n);
        self
    }
}

/// Why a size, CPU amount or duration could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// the value is empty
    #[error("empty {what}")]
    Empty {
        /// What was being parsed.
        what: &'static str,
    },
    /// the value is not a number with an allowed unit
    #[error("invalid {what} {value:?}: expected {expected}")]
    Invalid {
        /// What was being parsed.
        what: &'static str,
        /// The input.
        value: String,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// the value does not fit
    #[error("{what} {value:?} is too large")]
    TooLarge {
        /// What was being parsed.
        what: &'static str,
        /// The input.
        value: String,
    },
}

fn split_number(s: &str) -> (&str, &str) {
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// Parses a size: plain bytes (`1048576`) or a number with a binary unit `b`, `k`, `m`,
/// `g`, `t` (case-insensitive, optional trailing `b`/`ib`: `64m`, `64MiB`, `1.5g`).
pub fn parse_size(input: &str) -> Result<u64, ParseError> {
    const WHAT: &str = "size";
    const EXPECTED: &str = "bytes or a number with k, m, g or t (e.g. 64m, 1g)";
    let s = input.trim();
    if s.is_empty() {
        return Err(ParseError::Empty { what: WHAT });
    }
    let invalid = || ParseError::Invalid { what: WHAT, value: input.to_owned(), expected: EXPECTED };
    let (num, unit) = split_number(s);
    if num.is_empty() {
        return Err(invalid());
    }
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(invalid()),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or(ParseError::TooLarge { what: WHAT, value: input.to_owned() });
    }
    let f: f64 = num.parse().map_err(|_| invalid())?;
    let bytes = f * mult as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(ParseError::TooLarge { what: WHAT, value: input.to_owned() });
    }
    Ok(bytes.round() as u64)
}

/// Parses a CPU amount in cores (`0.5`, `2`) or millicores (`500m`) into millicores.
pub fn parse_cpus(input: &str) -> Result<u64, ParseError> {
    const WHAT: &str = "cpu amount";
    const EXPECTED: &str = "cores (e.g. 0.5, 2) or millicores (e.g. 500m)";
    let s = input.trim();
    if s.is_empty() {
        return Err(ParseError::Empty { what: WHAT });
    }
    let invalid = || ParseError::Invalid { what: WHAT, value: input.to_owned(), expected: EXPECTED };
    if let Some(m) = s.strip_suffix('m') {
        return m.parse::<u64>().map_err(|_| invalid());
    }
    let (num, unit) = split_number(s);
    if num.is_empty() || !unit.is_empty() {
        return Err(invalid());
    }
    let f: f64 = num.parse().map_err(|_| invalid())?;
    let millis = f * 1000.0;
    if !millis.is_finite() || millis >= u64::MAX as f64 {
        return Err(ParseError::TooLarge { what: WHAT, value: input.to_owned() });
    }
    Ok(millis.round() as u64)
}

/// Parses a duration: `500ms`, `10s`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(input: &str) -> Result<Duration, ParseError> {
    const WHAT: &str = "duration";
    const EXPECTED: &str = "a number with ms, s, m or h (e.g. 500ms, 10s, 2m)";
    let s = input.trim();
    if s.is_empty() {
        return Err(ParseError::Empty { what: WHAT });
    }
    let invalid = || ParseError::Invalid { what: WHAT, value: input.to_owned(), expected: EXPECTED };
    let (num, unit) = split_number(s);
    if num.is_empty() {
        return Err(invalid());
    }
    // A whole number is exact (no float rounding): `123ms` is 123 ms to the nanosecond.
    if let Ok(n) = num.parse::<u64>() {
        let ms_per_unit: u64 = match unit {
            "ms" => 1,
            "" | "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(invalid()),
        };
        return n
            .checked_mul(ms_per_unit)
            .map(Duration::from_millis)
            .ok_or(ParseError::TooLarge { what: WHAT, value: input.to_owned() });
    }
    let f: f64 = num.parse().map_err(|_| invalid())?;
    let secs = match unit {
        "ms" => f / 1000.0,
        "" | "s" => f,
        "m" => f * 60.0,
        "h" => f * 3600.0,
        _ => return Err(invalid()),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| ParseError::TooLarge { what: WHAT, value: input.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_size("64m").unwrap(), 64 << 20);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size(" 10b ").unwrap(), 10);
    }

    #[test]
    fn bad_sizes() {
        assert!(matches!(parse_size(""), Err(ParseError::Empty { .. })));
        assert!(matches!(parse_size("abc"), Err(ParseError::Invalid { .. })));
        assert!(matches!(parse_size("10x"), Err(ParseError::Invalid { .. })));
        assert!(matches!(parse_size("-5m"), Err(ParseError::Invalid { .. })));
        assert!(matches!(parse_size("99999999999t"), Err(ParseError::TooLarge { .. })));
        let msg = parse_size("10x").unwrap_err().to_string();
        assert!(msg.contains("10x") && msg.contains("64m"), "{msg}");
    }

    #[test]
    fn cpus() {
        assert_eq!(parse_cpus("0.5").unwrap(), 500);
        assert_eq!(parse_cpus("2").unwrap(), 2000);
        assert_eq!(parse_cpus("250m").unwrap(), 250);
        assert!(parse_cpus("half").is_err());
        assert!(parse_cpus("1c").is_err());
        assert!(parse_cpus("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        // Whole numbers are exact; through an f64 this one came out 70 µs off.
        assert_eq!(parse_duration("4503599627370497ms").unwrap(), Duration::from_millis(4_503_599_627_370_497));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
