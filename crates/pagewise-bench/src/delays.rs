//! When each allocator gives free memory back to the kernel by itself, with
//! the settings the workers run it with. The idle period before "RSS after
//! idle" is read defaults to longer than every time-based delay here, so no
//! allocator's figure is taken before its own rule could act; the report
//! prints these rules, because a rule that only runs on allocator calls (or
//! is not time-based at all) does not act during an idle period however
//! long it is, and that is part of what the figure shows.

use crate::runner::AllocSpec;

/// What an allocator does with free memory when the program goes quiet.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PurgeRule {
    /// Longest time (ms) free memory waits before the allocator's own rule
    /// may return it, if the rule is time-based.
    pub delay_ms: Option<u64>,
    /// The rule, in a sentence.
    pub rule: String,
    /// Where the defaults were read.
    pub source: &'static str,
}

/// Margin added to the longest delay for the default idle period: the
/// purge itself takes time, and a decay curve ends at its delay.
pub const IDLE_MARGIN_MS: u64 = 2000;

/// The default idle period with `--quick`: twice pagewise's default decay,
/// the point by which an idle program should have its memory back. Shorter than
/// jemalloc's decay, which the report then says.
pub const QUICK_IDLE_MS: u64 = 2000;

/// The rule of the allocator `spec` runs, or None where it is not known
/// (a `.so` given by path).
pub fn purge_rule(spec: &AllocSpec) -> Option<PurgeRule> {
    if spec.preload.is_some() {
        return (spec.label == "tcmalloc").then(tcmalloc);
    }
    match spec.worker.as_str() {
        "pagewise" => Some(pagewise()),
        "system" => Some(glibc()),
        "jemalloc" => Some(jemalloc()),
        "mimalloc" => Some(mimalloc()),
        _ => None,
    }
}

/// The idle period longer than every known delay among `allocs`, plus
/// [`IDLE_MARGIN_MS`].
pub fn default_idle_ms(allocs: &[AllocSpec]) -> u64 {
    let longest = allocs
        .iter()
        .filter_map(purge_rule)
        .filter_map(|r| r.delay_ms)
        .max()
        .unwrap_or(0);
    longest + IDLE_MARGIN_MS
}

/// pagewise: the decay, read from the environment the workers inherit,
/// plus one wake-up period of the purger thread, which only then sees
/// that a span has expired.
fn pagewise() -> PurgeRule {
    let decay = pagewise::Config::from_env().decay_ms;
    let wake = (decay / 4).clamp(10, 1000);
    PurgeRule {
        delay_ms: Some(decay + wake),
        rule: format!(
            "freed spans purged {decay} ms after their last free (PAGEWISE_DECAY_MS, default 1000), \
             by the owner or by the background purger, which wakes every {wake} ms (PAGEWISE_BACKGROUND=1)"
        ),
        source: "crates/pagewise/src/config.rs; crates/pagewise/src/global/purger.rs",
    }
}

fn glibc() -> PurgeRule {
    PurgeRule {
        delay_ms: None,
        rule: "no delay and no timer: free() trims the top of a heap once it exceeds M_TRIM_THRESHOLD \
               (128 KiB, raised dynamically); free pages inside a heap go back only on malloc_trim()"
            .into(),
        source: "mallopt(3) M_TRIM_THRESHOLD; glibc malloc/malloc.c, malloc/arena.c",
    }
}

fn jemalloc() -> PurgeRule {
    PurgeRule {
        delay_ms: Some(10_000),
        rule: "dirty_decay_ms 10000 (smootherstep curve), muzzy_decay_ms 0; background_thread off, so \
               decay advances only on allocator calls (about 1 in 1000) and an idle process keeps its pages"
            .into(),
        source: "jemalloc(3) opt.dirty_decay_ms, opt.background_thread; jemalloc 5.3.1 via tikv-jemalloc-sys 0.7.1",
    }
}

fn mimalloc() -> PurgeRule {
    PurgeRule {
        delay_ms: Some(1000),
        rule:
            "mimalloc 3.3 (the `mimalloc` crate 0.1.52 builds v3 unless its `v2` feature is on): \
               purge_delay 1000 ms x arena_purge_mult 1 (MIMALLOC_PURGE_DELAY; v2 was 10 ms x 10); \
               purges run from allocator calls only"
                .into(),
        source: "libmimalloc-sys 0.1.49 c_src/mimalloc/v3/src/options.c",
    }
}

fn tcmalloc() -> PurgeRule {
    PurgeRule {
        delay_ms: None,
        rule: "gperftools 2.10 (libtcmalloc_minimal): no timer, no background thread; after each span \
               freed to the page heap, one free span is released per 1000 pages freed \
               (TCMALLOC_RELEASE_RATE 1.0); memory in thread and central caches stays"
            .into(),
        source: "gperftools src/page_heap.cc (IncrementalScavenge, FLAGS_tcmalloc_release_rate)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> AllocSpec {
        AllocSpec::parse(s).expect("built-in")
    }

    #[test]
    fn default_idle_outlasts_every_delay() {
        let all: Vec<AllocSpec> = ["pagewise", "system", "jemalloc", "mimalloc"]
            .iter()
            .map(|s| spec(s))
            .collect();
        // jemalloc's 10 s decay is the longest.
        assert_eq!(default_idle_ms(&all), 10_000 + IDLE_MARGIN_MS);
        let glibc = [spec("system")];
        assert_eq!(default_idle_ms(&glibc), IDLE_MARGIN_MS);
        for a in &all {
            let d = purge_rule(a).and_then(|r| r.delay_ms).unwrap_or(0);
            assert!(default_idle_ms(&all) > d, "{}", a.label);
        }
    }

    #[test]
    fn unknown_libraries_have_no_rule() {
        let exe = AllocSpec {
            label: "other".into(),
            worker: "other".into(),
            preload: None,
            exe: Some("/x".into()),
            env: Vec::new(),
        };
        assert_eq!(purge_rule(&exe), None);
        let so = AllocSpec {
            label: "libfoo.so".into(),
            worker: "system".into(),
            preload: Some("/x/libfoo.so".into()),
            exe: None,
            env: Vec::new(),
        };
        assert_eq!(purge_rule(&so), None);
    }
}
