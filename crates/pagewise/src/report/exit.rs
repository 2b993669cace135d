//! The report at `exit()`: `PAGEWISE_STATS_FILE=path` writes the JSON
//! document there (`%p`: the pid); otherwise `PAGEWISE_STATS=1` prints the
//! text report on stderr. Run by the process-exit destructor
//! (`global/thread.rs`), after the program's own `atexit` handlers.

use super::{expand_path, report, FdWriter};
use crate::config::Variable;
use core::fmt::Write;

/// Stops the sampler (after its last line) and writes the exit report.
pub(crate) fn at_exit() {
    super::sampler::stop();
    if let Some(path) = stats_file() {
        if !write_file(path, false) {
            crate::fault::write_stderr(&[
                b"pagewise: cannot write PAGEWISE_STATS_FILE=",
                path,
                b"\n",
            ]);
        }
        return;
    }
    if Variable::Stats.number() == Some(1) {
        print(2);
    }
}

/// `PAGEWISE_STATS_FILE`, if set.
pub(crate) fn stats_file() -> Option<&'static [u8]> {
    Variable::StatsFile.text()
}

/// Writes the text report to `fd`.
pub(crate) fn print(fd: libc::c_int) {
    let r = report();
    let mut w = FdWriter::new(fd);
    let _ = write!(w, "{r}");
}

/// Writes the JSON document to the file `template` names (`%p`: the pid):
/// in place, or (`atomically`) beside it and renamed over it, so that a
/// reader never sees half of one. False if it could not be written.
pub(crate) fn write_file(template: &[u8], atomically: bool) -> bool {
    let mut name = [0u8; 4096];
    let mut tmp = [0u8; 4096];
    if !expand_path(template, &mut name) {
        return false;
    }
    let target = if atomically {
        if !with_suffix(&name, b".tmp", &mut tmp) {
            return false;
        }
        &tmp
    } else {
        &name
    };
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC;
    // SAFETY: `target` is NUL-terminated.
    let fd = unsafe { libc::open(target.as_ptr().cast(), flags, 0o644 as libc::c_uint) };
    if fd < 0 {
        return false;
    }
    let r = report();
    {
        let mut w = FdWriter::new(fd);
        let _ = r.write_json(&mut w);
        let _ = w.write_str("\n");
    }
    // SAFETY: our descriptor; both paths NUL-terminated.
    unsafe {
        libc::close(fd);
        if atomically {
            libc::rename(tmp.as_ptr().cast(), name.as_ptr().cast());
        }
    }
    true
}

/// `path` (NUL-terminated) with `suffix` appended into `out`; false if it
/// does not fit.
fn with_suffix(path: &[u8; 4096], suffix: &[u8], out: &mut [u8; 4096]) -> bool {
    let len = path.iter().position(|&b| b == 0).unwrap_or(path.len());
    if len + suffix.len() + 1 > out.len() {
        return false;
    }
    out[..len].copy_from_slice(&path[..len]);
    out[len..len + suffix.len()].copy_from_slice(suffix);
    out[len + suffix.len()] = 0;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffix_fits_or_refuses() {
        let mut p = [0u8; 4096];
        p[..5].copy_from_slice(b"/a/b\0");
        let mut out = [0u8; 4096];
        assert!(with_suffix(&p, b".tmp", &mut out));
        assert_eq!(&out[..9], b"/a/b.tmp\0");
        let long = [b'x'; 4096];
        assert!(!with_suffix(&long, b".tmp", &mut out));
    }
}
