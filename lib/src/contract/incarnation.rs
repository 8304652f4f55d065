//! Incarnations: one per process boot, so objects of two boots never share one.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Mints a new incarnation: wall-clock microseconds plus randomness (two processes started
/// in the same microsecond still differ).
pub fn mint() -> String {
    let us = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0);
    format!("{us:x}-{:08x}", rand::random::<u32>())
}

/// This process's incarnation, minted on first use.
pub fn current() -> &'static str {
    static INC: OnceLock<String> = OnceLock::new();
    INC.get_or_init(mint)
}

#[cfg(test)]
mod tests {
    #[test]
    fn distinct_and_stable() {
        assert_ne!(super::mint(), super::mint());
        assert_eq!(super::current(), super::current());
    }
}
