//! Progress of a suite run on stderr. The bar counts worker runs; its
//! message says which run is going and whether it ends with an idle
//! period (a run can sit still for seconds then, and the ticking clock
//! shows it has not hung). A line per finished workload stays above the
//! bar, and is all that is printed when stderr is not a terminal (a long
//! run logged to a file), where the bar hides itself.

use indicatif::{ProgressBar, ProgressStyle};
use std::time::{Duration, Instant};

pub(crate) struct Progress {
    bar: ProgressBar,
    workloads: usize,
    done: usize,
    started: Instant,
    workload_started: Instant,
}

impl Progress {
    /// A bar for `runs` worker runs over `workloads` workloads.
    pub fn new(runs: usize, workloads: usize) -> Progress {
        let bar = ProgressBar::new(runs as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:32.cyan/blue}] {pos}/{len} {msg} (eta {eta})",
            )
            .expect("template")
            .progress_chars("=> "),
        );
        // Redraws the clock while a worker idles.
        bar.enable_steady_tick(Duration::from_millis(500));
        Progress {
            bar,
            workloads,
            done: 0,
            started: Instant::now(),
            workload_started: Instant::now(),
        }
    }

    /// A line above the bar, or on stderr when the bar is hidden.
    fn line(&self, s: String) {
        if self.bar.is_hidden() {
            eprintln!("{s}");
        } else {
            self.bar.println(s);
        }
    }

    /// Says which run starts now.
    pub fn run(&self, w: &str, alloc: &str, rep: usize, reps: usize, idle_ms: u64) {
        let idle = if idle_ms > 0 {
            format!(" · then {:.1} s idle", idle_ms as f64 / 1e3)
        } else {
            String::new()
        };
        self.bar
            .set_message(format!("{w} · {alloc} · run {}/{reps}{idle}", rep + 1));
    }

    /// A run ended (`error` if it failed).
    pub fn ran(&self, w: &str, alloc: &str, rep: usize, error: Option<&str>) {
        if let Some(e) = error {
            self.line(format!("FAILED {w} under {alloc} (run {}): {e}", rep + 1));
        }
        self.bar.inc(1);
    }

    /// Workload `w` starts.
    pub fn workload(&mut self) {
        self.workload_started = Instant::now();
    }

    /// Workload `w` ended after `runs` runs.
    pub fn workload_done(&mut self, w: &str, runs: usize) {
        self.done += 1;
        self.line(format!(
            "[{}/{}] {w}: {runs} runs in {:.0} s ({:.0} s so far)",
            self.done,
            self.workloads,
            self.workload_started.elapsed().as_secs_f64(),
            self.started.elapsed().as_secs_f64()
        ));
    }

    /// Clears the bar before the report is printed.
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}
