//! What a panic inside the library does: one line on stderr, then
//! `abort()`, at once.
//!
//! Nothing here panics on purpose (bad input is reported by the core's
//! `fault` module, which aborts with its own message); a panic is a bug in
//! pagewise, such as an index out of bounds. The library is built with
//! `panic = "abort"`, but Rust's default panic hook runs first, and with
//! `RUST_BACKTRACE` set in the environment it captures and prints a
//! backtrace, which allocates: through this library's own `malloc`, while
//! the code that panicked may hold one of the allocator's locks. The
//! process then hangs where it should have stopped: an index out of bounds
//! put under a transfer-cache lock (on purpose, in a build made for the
//! trial) hung mimalloc's test-stress until it was killed, where with this
//! hook it aborted at once. The hook formats the message and its place
//! into a buffer on the stack, writes it with one `write(2)` and aborts:
//! it allocates nothing and takes no lock. (A message with arguments is
//! formatted into a `String` by the standard library before any hook runs:
//! one small allocation, which a thread cache usually serves.)
//!
//! The hook is this library's: `libpagewise.so` carries its own copy of
//! Rust's standard library, so the hook of a Rust program that loads it
//! is not touched.

use core::fmt::Write;
use std::panic::PanicHookInfo;

/// Makes [`report_and_abort`] the library's panic hook.
pub fn install() {
    std::panic::set_hook(Box::new(report_and_abort));
}

/// Runs [`install`] when the library is loaded, before the program's own
/// code (a panic during the loader's first `malloc` calls, before this,
/// would still find the default hook). Not in the unit tests' binary, whose
/// harness reports a failed assertion by its panic.
#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INSTALL: extern "C" fn() = {
    extern "C" fn run() {
        install();
    }
    run
};

/// The hook: `pagewise: internal error: MESSAGE, at FILE:LINE`, then
/// `abort()`.
fn report_and_abort(info: &PanicHookInfo<'_>) {
    let mut line = Line::new();
    let _ = write!(line, "pagewise: internal error: ");
    let payload = info.payload();
    if let Some(s) = payload.downcast_ref::<&str>() {
        let _ = line.write_str(s);
    } else if let Some(s) = payload.downcast_ref::<String>() {
        let _ = line.write_str(s);
    } else {
        let _ = line.write_str("a panic");
    }
    if let Some(at) = info.location() {
        let _ = write!(line, ", at {}:{}", at.file(), at.line());
    }
    line.end();
    // SAFETY: `line` holds `len` initialised bytes; fd 2 may be closed
    // (then the write fails, and the abort follows anyway).
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        libc::abort();
    }
}

/// A line of at most [`Line::MAX`] bytes on the stack: longer text is cut.
struct Line {
    buf: [u8; Line::MAX],
    len: usize,
}

impl Line {
    const MAX: usize = 512;

    fn new() -> Line {
        Line {
            buf: [0; Line::MAX],
            len: 0,
        }
    }

    /// Ends the line with a newline, over its last byte if it is full.
    fn end(&mut self) {
        self.len = self.len.min(Line::MAX - 1);
        self.buf[self.len] = b'\n';
        self.len += 1;
    }
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let n = s.len().min(Line::MAX - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    /// In a child process with `RUST_BACKTRACE=full` (as the library's
    /// hook would see it in a user's shell): the hook writes one line and
    /// aborts, with no backtrace. Without [`install`], the default hook
    /// prints a backtrace and the test's panic unwinds (exit status 101).
    #[test]
    fn a_panic_writes_one_line_and_aborts_without_a_backtrace() {
        const NAME: &str =
            "panic_abort::tests::a_panic_writes_one_line_and_aborts_without_a_backtrace";
        if std::env::var_os("PAGEWISE_TEST_PANIC_CHILD").is_some() {
            install();
            let slot = std::hint::black_box(7);
            panic!("slot {slot} out of bounds");
        }
        let out = Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env("PAGEWISE_TEST_PANIC_CHILD", "1")
            .env("RUST_BACKTRACE", "full")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("pagewise: "))
            .unwrap_or_else(|| panic!("no report in {err}"));
        assert!(
            line.starts_with("pagewise: internal error: slot 7 out of bounds, at ")
                && line.contains("panic_abort.rs:"),
            "{line}"
        );
        assert!(!err.contains("backtrace"), "{err}");
    }

    #[test]
    fn a_long_message_is_cut_to_one_line() {
        let mut line = Line::new();
        for _ in 0..100 {
            let _ = line.write_str("0123456789");
        }
        line.end();
        assert_eq!(line.len, Line::MAX);
        assert_eq!(line.buf[Line::MAX - 1], b'\n');
        assert!(line.buf[..Line::MAX - 1].iter().all(|b| b.is_ascii_digit()));
    }
}
