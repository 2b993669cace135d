//! A JIT-like trace of code-sized requests through `pagewise::pool`, with
//! first-fit, best-fit and worst-fit and 1..16 open pools, reporting the
//! over-allocation factor and each category of waste.
//!
//! ```text
//! cargo run --release -p pagewise --example jit_pools                # 100 000 requests
//! cargo run --release -p pagewise --example jit_pools -- 100000 7    # requests, seed
//! ```
//!
//! The trace (deterministic): 94 % of requests log-uniform in 100 B–4 KiB
//! (stubs, ICs, small functions), 5 % log-uniform in 4–64 KiB (big
//! functions: the "moderately large" requests that force small pools to be
//! replaced), 1 % uniform in 64–512 KiB (above the 64 KiB threshold: own
//! pool). After each request, with probability 1/3 one random live
//! allocation is discarded (code thrown away), so pools die as they would.

use std::time::Instant;

use pagewise::pool::{Fit, PoolConfig, Pools};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn log_uniform(&mut self, lo: f64, hi: f64) -> usize {
        (lo * (hi / lo).powf(self.unit())) as usize
    }
}

fn trace(n: usize, seed: u64) -> Vec<(usize, Option<u64>)> {
    let mut r = Rng(seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..n)
        .map(|_| {
            let k = r.next() % 100;
            let size = if k < 94 {
                r.log_uniform(100.0, 4096.0)
            } else if k < 99 {
                r.log_uniform(4096.0, 65536.0)
            } else {
                65537 + (r.next() % (448 << 10)) as usize
            };
            let discard = (r.next() % 3 == 0).then(|| r.next());
            (size, discard)
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args
        .get(1)
        .map_or(100_000, |a| a.parse().expect("requests"));
    let seed: u64 = args.get(2).map_or(1, |a| a.parse().expect("seed"));
    let t = trace(n, seed);
    println!("# jit_pools: {n} requests (seed {seed}), 16 B granule, large threshold = pool size");
    println!(
        "{:>5} {:>2} {:<5} {:>12} {:>12} {:>6} {:>10} {:>10} {:>10} {:>10} {:>6} {:>9} {:>7}",
        "pool",
        "N",
        "fit",
        "asked_for",
        "allocated",
        "factor",
        "lwaste",
        "swaste",
        "nwaste",
        "owaste",
        "pools",
        "peakMiB",
        "ns/req"
    );
    // The seed's "before" (16 KiB pools, 1 open) and its two changes, then
    // 64 KiB pools with every N and fit.
    let mut runs = vec![(16, 1, Fit::First), (16, 4, Fit::Best)];
    for open in [1, 2, 4, 8, 16] {
        for fit in [Fit::First, Fit::Best, Fit::Worst] {
            runs.push((64, open, fit));
        }
    }
    for (pool_kib, open, fit) in runs {
        {
            let pools = Pools::with_config(PoolConfig {
                pool_size: pool_kib << 10,
                large_threshold: pool_kib << 10,
                open_pools: open,
                fit,
                ..PoolConfig::default()
            });
            let mut live = Vec::new();
            let start = Instant::now();
            for &(size, discard) in &t {
                live.push(pools.alloc(size).expect("alloc"));
                if let Some(r) = discard {
                    live.swap_remove(r as usize % live.len());
                }
            }
            let ns = start.elapsed().as_nanos() as f64 / n as f64;
            let s = pools.stats();
            assert_eq!(
                s.allocated,
                s.asked_for + s.waste(),
                "accounting sums exactly"
            );
            println!(
                "{:>4}K {:>2} {:<5} {:>12} {:>12} {:>6.3} {:>10} {:>10} {:>10} {:>10} {:>6} {:>9.1} {:>7.0}",
                pool_kib,
                open,
                format!("{fit:?}"),
                s.asked_for,
                s.allocated,
                s.overallocation(),
                s.lwaste,
                s.swaste,
                s.nwaste,
                s.owaste,
                s.pools_created,
                s.peak_live_bytes as f64 / (1 << 20) as f64,
                ns
            );
        }
    }
}
