//! The settings' warnings: one line on stderr for each malformed value,
//! unknown `PAGEWISE_*` variable or bad `PAGEWISE_CONF` entry, saying what
//! is accepted, each once per process however often the setting is read.
//! Written in one `write` from a stack buffer: no allocation, so they can
//! come from inside the allocator, before `main`.

use super::variables::Variable;
use super::{ConfError, Setting};
use crate::report::FdWriter;
use core::fmt::Write;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One bit per [`Variable`] (its index in [`Variable::ALL`]) and the
/// extra ones below, set once its warning was written.
static WARNED: AtomicU64 = AtomicU64::new(0);
/// The embedded `pagewise_conf` string's warnings were written.
const EMBEDDED_CONF: u32 = 40;
/// The environment was checked for unknown variables.
const SCANNED: u32 = 41;
/// The limit's refusal was said.
const LIMIT_REFUSED: u32 = 42;

/// Whether `bit` was not set yet (and sets it).
fn first_time(bit: u32) -> bool {
    WARNED.fetch_or(1 << bit, Relaxed) & (1 << bit) == 0
}

fn bit_of(var: Variable) -> u32 {
    Variable::ALL.iter().position(|v| *v == var).unwrap_or(0) as u32
}

/// `bytes` as text (they are shown to a person; invalid UTF-8 as `?`).
fn text(w: &mut FdWriter, bytes: &[u8]) {
    for chunk in bytes.utf8_chunks() {
        let _ = w.write_str(chunk.valid());
        if !chunk.invalid().is_empty() {
            let _ = w.write_str("?");
        }
    }
}

/// `pagewise: ignoring malformed NAME=value (expected ...)`, once per
/// variable.
pub(crate) fn malformed(var: Variable, value: &[u8], accepted: &str) {
    if !first_time(bit_of(var)) {
        return;
    }
    let mut w = FdWriter::new(2);
    let _ = write!(w, "pagewise: ignoring malformed {}=", var.name());
    text(&mut w, value);
    let _ = writeln!(w, " (expected {accepted})");
}

/// Applies the `key:value,...` string `conf` from `source` to `c`,
/// reporting its bad entries the first time that source is read.
pub(crate) fn apply_conf_once(c: &mut super::Config, conf: &[u8], source: Option<Variable>) {
    let bit = source.map_or(EMBEDDED_CONF, bit_of);
    let first = first_time(bit);
    let name = source.map_or("the embedded pagewise_conf", Variable::name);
    super::apply_conf(c, conf, |e| {
        if first {
            conf_error(name, e);
        }
    });
}

/// One line for a bad entry of a `key:value,...` string.
fn conf_error(source: &str, e: ConfError<'_>) {
    let mut w = FdWriter::new(2);
    match e {
        ConfError::Unknown(key) => {
            let _ = w.write_str("pagewise: ignoring unknown setting ");
            text(&mut w, key);
            let _ = write!(w, " in {source} (known: ");
            for (i, s) in Setting::ALL.iter().enumerate() {
                let _ = write!(w, "{}{}", if i > 0 { ", " } else { "" }, s.name());
            }
            let _ = w.write_str(")\n");
        }
        ConfError::Malformed(entry) => {
            let _ = w.write_str("pagewise: ignoring malformed ");
            text(&mut w, entry);
            let _ = writeln!(
                w,
                " in {source} (expected key:value entries separated by commas)"
            );
        }
        ConfError::Value(setting, value, accepted) => {
            let _ = write!(w, "pagewise: ignoring malformed {}:", setting.name());
            text(&mut w, value);
            let _ = writeln!(w, " in {source} (expected {accepted})");
        }
    }
}

/// Checks the whole environment, once per process: every variable of the
/// table that is set is parsed (a malformed one is said, if it was not
/// already), and each `PAGEWISE_*` name the table does not know gets a
/// line naming the closest known one. Names starting with
/// `PAGEWISE_TEST_` are left to test harnesses.
pub(crate) fn check_environment() {
    if !first_time(SCANNED) {
        return;
    }
    for v in Variable::ALL {
        if v != Variable::Conf {
            let _ = v.read();
        }
    }
    for_each_environment_name(|name| {
        if name.starts_with(b"PAGEWISE_")
            && !name.starts_with(b"PAGEWISE_TEST_")
            && Variable::from_name(name).is_none()
        {
            unknown(name);
        }
    });
}

/// `pagewise: ignoring unknown variable NAME (did you mean ...? known: ...)`.
fn unknown(name: &[u8]) {
    let mut w = FdWriter::new(2);
    let _ = w.write_str("pagewise: ignoring unknown variable ");
    text(&mut w, name);
    let _ = w.write_str(" (");
    let closest = Variable::ALL
        .into_iter()
        .map(|v| (distance(name, v.name().as_bytes()), v))
        .min_by_key(|&(d, _)| d);
    if let Some((d, v)) = closest.filter(|&(d, _)| d <= 3) {
        let _ = write!(w, "did you mean {}? ", v.name());
        let _ = d;
    }
    let _ = w.write_str("known: ");
    for (i, v) in Variable::ALL.iter().enumerate() {
        let _ = write!(w, "{}{}", if i > 0 { ", " } else { "" }, v.name());
    }
    let _ = w.write_str(")\n");
}

/// The edit distance of two names (insertions, deletions, substitutions),
/// or a large number for names longer than 63 bytes.
fn distance(a: &[u8], b: &[u8]) -> usize {
    const MAX: usize = 64;
    if a.len() >= MAX || b.len() >= MAX {
        return usize::MAX;
    }
    let mut row = [0usize; MAX];
    for (j, r) in row.iter_mut().enumerate().take(b.len() + 1) {
        *r = j;
    }
    for i in 1..=a.len() {
        let mut diagonal = row[0];
        row[0] = i;
        for j in 1..=b.len() {
            let above = row[j];
            let cost = (a[i - 1] != b[j - 1]) as usize;
            row[j] = (above + 1).min(row[j - 1] + 1).min(diagonal + cost);
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Calls `f` with the name of every environment variable (Linux: the
/// process's `environ`; elsewhere nothing is checked).
fn for_each_environment_name(mut f: impl FnMut(&[u8])) {
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        extern "C" {
            static environ: *const *const libc::c_char;
        }
        // SAFETY: `environ` is libc's NULL-terminated array of
        // NUL-terminated strings; it is read at once, as getenv reads it.
        unsafe {
            let mut p = environ;
            while !p.is_null() && !(*p).is_null() {
                let entry = core::ffi::CStr::from_ptr(*p).to_bytes();
                let end = entry.iter().position(|&b| b == b'=').unwrap_or(entry.len());
                f(&entry[..end]);
                p = p.add(1);
            }
        }
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    let _ = &mut f;
}

/// An allocation was refused by the limit of the global allocator
/// (`PAGEWISE_LIMIT`): says so, with the limit and the bytes committed
/// against it, the first time only.
#[cold]
pub(crate) fn limit_refused(limit: usize, charged: usize) {
    if !first_time(LIMIT_REFUSED) {
        return;
    }
    use crate::report::Bytes;
    let mut w = FdWriter::new(2);
    let _ = writeln!(
        w,
        "pagewise: an allocation was refused: it would pass PAGEWISE_LIMIT={} ({} committed against it; said once, later ones fail alike)",
        Bytes(limit as u64),
        Bytes(charged as u64)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(distance(b"PAGEWISE_DECAYMS", b"PAGEWISE_DECAY_MS"), 1);
        assert_eq!(distance(b"abc", b"abc"), 0);
        assert_eq!(distance(b"", b"abc"), 3);
        assert_eq!(distance(b"kitten", b"sitting"), 3);
        assert_eq!(distance(&[b'x'; 70], b"x"), usize::MAX);
    }

    #[test]
    fn bits_fit() {
        assert!((Variable::ALL.len() as u32) < EMBEDDED_CONF);
    }
}
