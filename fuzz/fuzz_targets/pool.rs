//! `pool`: `pagewise::pool::Pools` (pool size, open pools, fit, large
//! threshold, granule and executable chosen by the input) on a page source
//! used by nothing else (`SystemPages` or `FakePages`), against a model of
//! the placement rules `pool.rs` documents.
//!
//! The model predicts, for every request, which open pool serves it (the
//! fit among those with room) or that a new pool is mapped (own pool above
//! the large threshold; else a new small pool kept open, replacing the
//! open pool with the least room only if it has more), so each
//! allocation's address must be exactly the predicted pool's base plus its
//! bump offset. From that it predicts every `PoolStats` field exactly:
//! requests, requested, asked_for, allocated, the four wastes (so
//! `allocated == asked_for + lwaste + swaste + nwaste + owaste` holds by
//! construction and is asserted too), pools created, large pools, live
//! pools and bytes (a pool lives while it is open or a handle holds it),
//! mprotect calls. Also checked: lengths are the request rounded to the
//! granule, addresses aligned to it, fresh bytes read as zeros, a
//! handle's bytes survive until it drops (also when dropped on another
//! thread, or after the allocator is gone), W^X (an executable pool is
//! never writable while read+execute), and the source's mapped bytes are
//! exactly the live pools' sizes, down to 0 at the end.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pagewise::pool::{
    system_mprotect_calls, Allocation, Fit, PoolConfig, PoolStats, Pools, ProtectPages, Protection,
};
use pagewise::{FakePages, SystemPages};
use pagewise_fuzz::{check, fill, seed_for, trace, Input, KIB, MIB};

static FAKE: FakePages = FakePages::new();
static SYSTEM: SystemPages = SystemPages::new();

const MAX_HANDLES: usize = 4096;
const BUDGET: u64 = 256 * MIB as u64;

/// One pool as the model knows it.
struct MPool {
    size: usize,
    used: usize,
    /// Address of its first byte, learned from its first allocation.
    base: usize,
    handles: usize,
    open: bool,
    /// The allocator (generation) that mapped it.
    gen: u32,
    prot: Protection,
}

impl MPool {
    fn avail(&self) -> usize {
        self.size - self.used
    }
    fn alive(&self) -> bool {
        self.handles > 0 || self.open
    }
}

struct Handle<S: ProtectPages + 'static> {
    a: Allocation<S>,
    pool: usize,
    /// The pattern written into it, if it could be written.
    seed: Option<u64>,
}

struct Run<S: ProtectPages + 'static> {
    src: &'static S,
    system: bool,
    config: PoolConfig,
    pools: Option<Pools<S>>,
    gen: u32,
    /// Every pool mapped in this input (index = model id).
    model: Vec<MPool>,
    /// The current allocator's open pools, in its order.
    open: Vec<usize>,
    expect: PoolStats,
    handles: Vec<Handle<S>>,
    counter: u64,
    mapped_before: u64,
    mprotect_before: u64,
    mprotects: u64,
}

fn psize(inp: &mut Input, pool_size: usize) -> usize {
    match inp.u8() {
        0..=159 => 1 + inp.u8() as usize,
        160..=219 => inp.range(257, 4 * KIB),
        220..=243 => inp.range(4 * KIB + 1, 2 * pool_size),
        244..=249 => {
            let d = inp.u8() as usize % 33;
            (pool_size + 16).saturating_sub(d)
        }
        _ => 0,
    }
}

impl<S: ProtectPages + 'static> Run<S> {
    fn pools(&mut self) -> &Pools<S> {
        if self.pools.is_none() {
            self.gen += 1;
            self.pools = Some(Pools::with_source(self.src, self.config));
            self.expect = PoolStats::default();
            self.open.clear();
        }
        self.pools.as_ref().unwrap()
    }

    fn live_bytes(&self) -> u64 {
        self.model
            .iter()
            .filter(|p| p.alive())
            .map(|p| p.size as u64)
            .sum()
    }

    fn alloc(&mut self, inp: &mut Input) {
        let c = *self.pools().config();
        let size = psize(inp, c.pool_size);
        if self.handles.len() >= MAX_HANDLES || self.live_bytes() + 2 * size as u64 > BUDGET {
            return;
        }
        let g = c.granule;
        let n = (size.max(1) + g - 1) & !(g - 1);
        trace!("alloc {size} (asks {n})");
        let a = self
            .pools()
            .alloc(size)
            .expect("pool alloc well within memory");
        let e = &mut self.expect;
        e.requests += 1;
        e.requested += size as u64;
        e.asked_for += n as u64;
        assert_eq!(
            a.len(),
            n,
            "length is the request rounded up to the granule"
        );
        assert!(!a.is_empty());
        let addr = a.as_ptr().as_ptr() as usize;
        assert_eq!(addr % g, 0, "{addr:#x} not aligned to the granule {g}");

        // Which pool the rules pick.
        let fits = self
            .open
            .iter()
            .enumerate()
            .filter(|(_, &id)| self.model[id].avail() >= n);
        let chosen = match c.fit {
            Fit::First => fits.map(|(i, _)| i).next(),
            Fit::Best => fits
                .min_by_key(|(_, &id)| self.model[id].avail())
                .map(|(i, _)| i),
            Fit::Worst => fits
                .max_by_key(|(_, &id)| self.model[id].avail())
                .map(|(i, _)| i),
        };
        let id = if let Some(i) = chosen {
            let id = self.open[i];
            let p = &mut self.model[id];
            assert_eq!(
                addr,
                p.base + p.used,
                "{:?} fit: expected the open pool #{i} at offset {} (pool {:#x})",
                c.fit,
                p.used,
                p.base
            );
            p.used += n;
            id
        } else {
            // A new pool: the allocation is its first bytes.
            assert_eq!(
                addr % 4096,
                0,
                "a new pool's first allocation starts its mapping"
            );
            let large = n > c.large_threshold;
            let psize = if large {
                (n + 4095) & !4095
            } else {
                c.pool_size
            };
            let id = self.model.len();
            self.model.push(MPool {
                size: psize,
                used: n,
                base: addr,
                handles: 0,
                open: false,
                gen: self.gen,
                prot: Protection::ReadWrite,
            });
            let e = &mut self.expect;
            e.allocated += psize as u64;
            e.pools_created += 1;
            if large {
                e.large_pools += 1;
                e.lwaste += (psize - n) as u64;
            } else if self.open.len() < c.open_pools {
                self.open.push(id);
                self.model[id].open = true;
            } else {
                let (i_min, min_avail) = self
                    .open
                    .iter()
                    .enumerate()
                    .map(|(i, &o)| (i, self.model[o].avail()))
                    .min_by_key(|&(_, a)| a)
                    .unwrap();
                if self.model[id].avail() > min_avail {
                    self.expect.swaste += min_avail as u64;
                    let old = self.open[i_min];
                    self.model[old].open = false;
                    self.open[i_min] = id;
                    self.model[id].open = true;
                } else {
                    self.expect.nwaste += self.model[id].avail() as u64;
                }
            }
            id
        };
        assert_eq!(a.pool_size(), self.model[id].size, "pool size");
        if let Some(other) = self.handles.last() {
            assert_eq!(a.same_pool(&other.a), other.pool == id, "same_pool");
        }
        assert!(
            a.as_slice().iter().all(|&b| b == 0),
            "fresh pool bytes read as zeros"
        );
        assert_eq!(a.protection(), self.model[id].prot);
        self.model[id].handles += 1;
        let mut h = Handle {
            a,
            pool: id,
            seed: None,
        };
        self.write(&mut h);
        self.handles.push(h);
    }

    /// Writes a new pattern into a handle, if its pool lets us.
    fn write(&mut self, h: &mut Handle<S>) {
        self.counter += 1;
        let seed = seed_for(h.a.as_ptr().as_ptr() as usize, self.counter);
        let len = h.a.len();
        let rw = self.model[h.pool].prot == Protection::ReadWrite;
        if !self.config.executable {
            let s =
                h.a.as_mut_slice()
                    .expect("a non-executable pool is always writable");
            // SAFETY: the handle's own `len` bytes.
            unsafe { fill(s.as_mut_ptr(), seed, 0, len) };
            h.seed = Some(seed);
        } else {
            assert!(
                h.a.as_mut_slice().is_none(),
                "no plain slice into an executable pool"
            );
            let r = h.a.with_writable(|s| {
                // SAFETY: as above.
                unsafe { fill(s.as_mut_ptr(), seed, 0, len) }
            });
            assert_eq!(
                r.is_some(),
                rw,
                "with_writable works exactly while read+write (W^X)"
            );
            if r.is_some() {
                h.seed = Some(seed);
            }
        }
    }

    fn verify(h: &Handle<S>, what: &str) {
        let s = h.a.as_slice();
        let bad = match h.seed {
            // SAFETY: reading the handle's own bytes.
            Some(seed) => unsafe { check(s.as_ptr(), seed, 0, s.len()) },
            None => s.iter().position(|&b| b != 0),
        };
        if let Some(o) = bad {
            panic!(
                "{what}: handle {:p} ({} B) has a wrong byte at offset {o}",
                s.as_ptr(),
                s.len()
            );
        }
    }

    fn drop_handle(&mut self, i: usize) -> Handle<S> {
        let h = self.handles.swap_remove(i);
        Self::verify(&h, "drop");
        self.model[h.pool].handles -= 1;
        h
    }

    fn flip(&mut self, inp: &mut Input, exec: bool) {
        if self.handles.is_empty() {
            return;
        }
        let i = inp.pick(self.handles.len());
        let id = self.handles[i].pool;
        trace!(
            "make {} pool of handle {i}",
            if exec { "executable" } else { "writable" }
        );
        let ok = if exec {
            self.handles[i].a.make_executable()
        } else {
            self.handles[i].a.make_writable()
        };
        assert_eq!(
            ok, self.config.executable,
            "flips succeed exactly on executable pools"
        );
        if ok {
            let want = if exec {
                Protection::ReadExecute
            } else {
                Protection::ReadWrite
            };
            let p = &mut self.model[id];
            if p.prot != want {
                p.prot = want;
                self.mprotects += 1;
                if p.gen == self.gen {
                    self.expect.mprotect_calls += 1;
                }
            }
        }
        assert_eq!(self.handles[i].a.protection(), self.model[id].prot);
        Self::verify(&self.handles[i], "after a flip");
    }

    fn drop_pools(&mut self) {
        if self.pools.take().is_some() {
            trace!("drop the allocator");
            for id in self.open.drain(..) {
                self.model[id].open = false;
            }
        }
    }

    fn check_stats(&self) {
        let mapped = self.src.syscalls().mapped_bytes - self.mapped_before;
        assert_eq!(
            mapped,
            self.live_bytes(),
            "mapped bytes = sizes of the live pools"
        );
        if self.system {
            assert_eq!(
                system_mprotect_calls() - self.mprotect_before,
                self.mprotects,
                "mprotect calls"
            );
        }
        let Some(pools) = &self.pools else { return };
        let s = pools.stats();
        let mut e = self.expect;
        e.owaste = self
            .open
            .iter()
            .map(|&id| self.model[id].avail() as u64)
            .sum();
        let mine = self.model.iter().filter(|p| p.gen == self.gen && p.alive());
        e.live_pools = mine.clone().count() as u64;
        e.live_bytes = mine.map(|p| p.size as u64).sum();
        assert!(s.peak_live_bytes >= s.live_bytes, "{s:?}");
        e.peak_live_bytes = s.peak_live_bytes;
        assert_eq!(s, e, "stats (left) vs model (right)");
        assert_eq!(
            s.allocated,
            s.asked_for + s.lwaste + s.swaste + s.nwaste + s.owaste
        );
        assert_eq!(s.waste(), s.allocated - s.asked_for);
    }

    fn go(&mut self, inp: &mut Input) {
        while !inp.is_empty() {
            match inp.u8() % 16 {
                0..=5 => self.alloc(inp),
                6..=8 => {
                    if !self.handles.is_empty() {
                        let i = inp.pick(self.handles.len());
                        trace!("drop handle {i}");
                        drop(self.drop_handle(i));
                    }
                }
                9 => self.drop_pools(),
                10 => self.flip(inp, true),
                11 => self.flip(inp, false),
                12 => {
                    if !self.handles.is_empty() {
                        let i = inp.pick(self.handles.len());
                        trace!("rewrite handle {i}");
                        let mut h = self.handles.swap_remove(i);
                        Self::verify(&h, "rewrite");
                        self.write(&mut h);
                        self.handles.push(h);
                    }
                }
                13 => {
                    let n = (inp.u8() as usize % 8).min(self.handles.len());
                    trace!("drop {n} handles on another thread");
                    let batch: Vec<Allocation<S>> = (0..n)
                        .map(|_| {
                            let i = inp.pick(self.handles.len());
                            self.drop_handle(i).a
                        })
                        .collect();
                    std::thread::scope(|s| {
                        s.spawn(move || drop(batch));
                    });
                }
                14 => {
                    for h in &self.handles {
                        Self::verify(h, "check");
                        assert_eq!(h.a.protection(), self.model[h.pool].prot);
                    }
                }
                _ => {
                    let _ = self.pools();
                }
            }
            self.check_stats();
        }
        self.drop_pools();
        while !self.handles.is_empty() {
            drop(self.drop_handle(self.handles.len() - 1));
        }
        self.check_stats();
    }
}

fn run<S: ProtectPages + 'static>(
    src: &'static S,
    system: bool,
    config: PoolConfig,
    inp: &mut Input,
) {
    let mut r = Run {
        src,
        system,
        config,
        pools: None,
        gen: 0,
        model: Vec::new(),
        open: Vec::new(),
        expect: PoolStats::default(),
        handles: Vec::new(),
        counter: 0,
        mapped_before: src.syscalls().mapped_bytes,
        mprotect_before: system_mprotect_calls(),
        mprotects: 0,
    };
    // The clamped configuration is what the model follows.
    r.config = *r.pools().config();
    r.go(inp);
    assert_eq!(
        src.syscalls().mapped_bytes,
        r.mapped_before,
        "every pool unmapped at the end"
    );
}

fuzz_target!(|data: &[u8]| {
    pagewise_fuzz::init();
    let mut inp = Input::new(data);
    let c1 = inp.u8();
    let c2 = inp.u8();
    let pool_size = [
        64 * KIB,
        4 * KIB,
        16 * KIB,
        256 * KIB,
        12 * KIB,
        64 * KIB,
        100,
        64 * KIB,
    ][(c1 & 7) as usize];
    let config = PoolConfig {
        pool_size,
        open_pools: ((c1 >> 3) & 7) as usize, // 0 is clamped to 1
        fit: [Fit::Best, Fit::First, Fit::Worst, Fit::Best][(c1 >> 6) as usize],
        large_threshold: [pool_size, pool_size / 2, KIB, 0, usize::MAX][(c2 % 5) as usize],
        granule: 1 << [4, 0, 3, 6, 12, 4, 4, 4][((c2 >> 3) & 7) as usize],
        executable: c2 & 0x40 != 0,
    };
    trace!("{config:?} fake {}", c2 & 0x80 != 0);
    if c2 & 0x80 == 0 {
        run(&SYSTEM, true, config, &mut inp);
    } else {
        run(&FAKE, false, config, &mut inp);
    }
});
