//! The sampling arithmetic: exponentially distributed gaps between samples,
//! and the weight that makes each sample stand for what it represents.
//!
//! Allocations are sampled by bytes, as tcmalloc and jemalloc do: each
//! allocated byte starts a sample with probability `1 / mean`, so the gaps
//! between sampled bytes are exponential with that mean, and an allocation
//! of `s` bytes is sampled with probability `p = 1 - exp(-s / mean)`
//! whatever came before it (the process has no memory). A sample then
//! stands for `1 / p` allocations and `size / p` bytes: summed over the
//! samples of a call site, these are unbiased estimates of what the site
//! allocated (or holds, summed over its live samples).
//!
//! ```
//! use pagewise::profile::gap::{inverse_probability, slots_until};
//! // A 64-byte slot at the default mean of 512 KiB stands for about 8,192.
//! let w = inverse_probability(64, 512 << 10);
//! assert!((w - 8192.5).abs() < 1.0);
//! // A gap of 1,000 bytes over 64-byte slots ends in the 16th slot.
//! assert_eq!(slots_until(1000.0, 64), 16);
//! ```

/// One step of a 64-bit generator (splitmix64): the state advances, and the
/// returned word is well mixed.
#[inline]
pub fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A gap in bytes drawn from the exponential distribution of mean `mean`,
/// from the uniform word `u`.
pub fn exponential_gap(u: u64, mean: usize) -> f64 {
    // Uniform in (0, 1), never 0 (whose log is infinite).
    let x = ((u >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -x.ln() * mean as f64
}

/// Allocations of `slot` bytes until the one in which a gap of `gap`
/// bytes ends (that one included): at least 1.
pub fn slots_until(gap: f64, slot: usize) -> i64 {
    let n = (gap / slot as f64).ceil();
    if n >= (i64::MAX / 4) as f64 {
        i64::MAX / 4
    } else {
        (n as i64).max(1)
    }
}

/// `1 / p`, where `p` is the probability that an allocation of `size`
/// bytes is sampled at mean `mean`: how many allocations one sample of
/// that size stands for.
pub fn inverse_probability(size: usize, mean: usize) -> f64 {
    let p = -(-(size.max(1) as f64) / mean as f64).exp_m1();
    1.0 / p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_have_the_mean_asked_for() {
        let mut s = 7;
        let n = 200_000;
        let sum: f64 = (0..n)
            .map(|_| exponential_gap(next_random(&mut s), 1 << 19))
            .sum();
        let mean = sum / n as f64;
        assert!((mean / (1 << 19) as f64 - 1.0).abs() < 0.01, "{mean}");
    }

    /// The estimate is unbiased: sampling a stream of mixed sizes by
    /// bytes and weighting each sample gives back the stream's bytes and
    /// counts per size within 5 % (every size has 4,000 samples or more,
    /// so that is three standard deviations; sizes below the mean and far
    /// above it).
    #[test]
    fn weighted_samples_estimate_what_was_allocated() {
        let mean = 4 << 10;
        let sizes = [
            (16usize, 1_000_000usize),
            (200, 200_000),
            (3000, 200_000),
            (100_000, 20_000),
        ];
        let mut s = 11;
        let mut left = exponential_gap(next_random(&mut s), mean);
        let (mut est_bytes, mut est_count) = ([0f64; 4], [0f64; 4]);
        let mut done = [0usize; 4];
        let mut k = 0;
        while done.iter().zip(&sizes).any(|(d, (_, n))| d < n) {
            k = (k + 1) % sizes.len();
            let (size, n) = sizes[k];
            if done[k] == n {
                continue;
            }
            done[k] += 1;
            left -= size as f64;
            if left <= 0.0 {
                left = exponential_gap(next_random(&mut s), mean);
                let w = inverse_probability(size, mean);
                est_bytes[k] += w * size as f64;
                est_count[k] += w;
            }
        }
        for (k, &(size, n)) in sizes.iter().enumerate() {
            let bytes = (n * size) as f64;
            assert!(
                (est_bytes[k] / bytes - 1.0).abs() < 0.05,
                "size {size}: {}",
                est_bytes[k] / bytes
            );
            assert!(
                (est_count[k] / n as f64 - 1.0).abs() < 0.05,
                "size {size}: {}",
                est_count[k] / n as f64
            );
        }
    }

    /// The reference outputs of splitmix64 from state 0: the gaps are
    /// drawn from the generator the docs name, mixed as it mixes.
    #[test]
    fn the_generator_is_splitmix64() {
        let mut s = 0;
        assert_eq!(next_random(&mut s), 0xe220_a839_7b1d_cdaf);
        assert_eq!(next_random(&mut s), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(next_random(&mut s), 0x06c4_5d18_8009_454f);
    }

    /// The smallest word is a uniform of 0.5 / 2^53, never 0: its gap is
    /// long but finite; the largest gives a gap near 0 but not below.
    #[test]
    fn every_word_gives_a_finite_gap() {
        let g = exponential_gap(0, 1000);
        assert!(g.is_finite() && g > 30_000.0, "{g}");
        let g = exponential_gap(u64::MAX, 1000);
        assert!((0.0..1e-9).contains(&g), "{g}");
    }

    #[test]
    fn slots_until_rounds_up_and_is_never_zero() {
        assert_eq!(slots_until(0.1, 64), 1);
        assert_eq!(slots_until(64.0, 64), 1);
        assert_eq!(slots_until(64.5, 64), 2);
        assert_eq!(slots_until(f64::INFINITY, 64), i64::MAX / 4);
    }
}
