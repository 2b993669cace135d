//! Output without allocation: fixed buffers behind `core::fmt::Write`.
//!
//! Every report goes through these writers (at exit, on a signal, the
//! sampler's lines, the C library's `pagewise_stats_print` and
//! `pagewise_stats_json`), so no byte of output ever comes from the heap
//! being reported on.

use core::fmt;

/// Writes to a file descriptor through a 4 KiB buffer of its own (on the
/// stack where it lives), flushed when full and when dropped.
///
/// ```
/// use core::fmt::Write;
/// let mut w = pagewise::report::FdWriter::new(1); // stdout
/// writeln!(w, "{} bytes committed", pagewise::stats().committed_bytes).unwrap();
/// ```
pub struct FdWriter {
    fd: libc::c_int,
    buf: [u8; 4096],
    len: usize,
}

impl FdWriter {
    /// A writer on `fd` (not closed on drop).
    ///
    /// ```
    /// let w = pagewise::report::FdWriter::new(2);
    /// # drop(w);
    /// ```
    pub fn new(fd: libc::c_int) -> Self {
        FdWriter {
            fd,
            buf: [0; 4096],
            len: 0,
        }
    }

    /// Writes out what is buffered (errors are ignored: there is nowhere to
    /// report them).
    ///
    /// ```
    /// use core::fmt::Write;
    /// let mut w = pagewise::report::FdWriter::new(2);
    /// w.write_str("").unwrap();
    /// w.flush();
    /// ```
    pub fn flush(&mut self) {
        let mut at = 0;
        while at < self.len {
            // SAFETY: writing initialised bytes of our own buffer.
            let n = unsafe { libc::write(self.fd, self.buf[at..].as_ptr().cast(), self.len - at) };
            if n <= 0 {
                if n < 0 && crate::c_malloc::errno() == libc::EINTR {
                    continue;
                }
                break;
            }
            at += n as usize;
        }
        self.len = 0;
    }
}

impl fmt::Write for FdWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for chunk in s.as_bytes().chunks(self.buf.len()) {
            if self.len + chunk.len() > self.buf.len() {
                self.flush();
            }
            self.buf[self.len..self.len + chunk.len()].copy_from_slice(chunk);
            self.len += chunk.len();
        }
        Ok(())
    }
}

impl Drop for FdWriter {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Writes into a caller's buffer like `snprintf`: keeps what fits, always
/// leaves room for a terminating NUL, and counts the full length.
///
/// ```
/// use core::fmt::Write;
/// let mut buf = [0u8; 6];
/// let mut w = pagewise::report::SliceWriter::new(&mut buf);
/// write!(w, "hello world").unwrap();
/// assert_eq!((w.written(), w.total), (&b"hello"[..], 11));
/// ```
pub struct SliceWriter<'a> {
    buf: &'a mut [u8],
    /// Bytes that would have been written with unlimited room.
    pub total: usize,
}

impl<'a> SliceWriter<'a> {
    /// A writer over `buf` (may be empty).
    ///
    /// ```
    /// let w = pagewise::report::SliceWriter::new(&mut []);
    /// assert_eq!(w.total, 0);
    /// ```
    pub fn new(buf: &'a mut [u8]) -> Self {
        SliceWriter { buf, total: 0 }
    }

    /// Writes the terminating NUL (at the end of the text, or truncating it).
    ///
    /// ```
    /// use core::fmt::Write;
    /// let mut buf = [0xffu8; 4];
    /// let mut w = pagewise::report::SliceWriter::new(&mut buf);
    /// w.write_str("ab").unwrap();
    /// w.terminate();
    /// assert_eq!(&buf[..3], b"ab\0");
    /// ```
    pub fn terminate(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let at = self.total.min(self.buf.len() - 1);
        self.buf[at] = 0;
    }

    /// The text written so far (what fitted).
    ///
    /// ```
    /// use core::fmt::Write;
    /// let mut buf = [0u8; 8];
    /// let mut w = pagewise::report::SliceWriter::new(&mut buf);
    /// write!(w, "{}", 42).unwrap();
    /// assert_eq!(w.written(), b"42");
    /// ```
    pub fn written(&self) -> &[u8] {
        let cap = self.buf.len().saturating_sub(1);
        &self.buf[..self.total.min(cap)]
    }
}

impl fmt::Write for SliceWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let cap = self.buf.len().saturating_sub(1);
        if self.total < cap {
            let n = s.len().min(cap - self.total);
            self.buf[self.total..self.total + n].copy_from_slice(&s.as_bytes()[..n]);
        }
        self.total += s.len();
        Ok(())
    }
}

/// Bytes as a short human figure: `12.3 MiB` (binary units; padded to the
/// formatter's width, so it lines up in columns).
///
/// ```
/// use pagewise::report::Bytes;
/// assert_eq!(format!("{}|{:>9}|{}", Bytes(512), Bytes(3 << 20), Bytes(1536)), "512 B|  3.0 MiB|1.5 KiB");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 32];
        let mut w = SliceWriter::new(&mut buf);
        let b = self.0;
        if b < 1024 {
            fmt::Write::write_fmt(&mut w, format_args!("{b} B"))?;
        } else {
            let units = ["KiB", "MiB", "GiB", "TiB", "PiB"];
            let mut v = b as f64 / 1024.0;
            let mut u = 0;
            while v >= 1024.0 && u + 1 < units.len() {
                v /= 1024.0;
                u += 1;
            }
            fmt::Write::write_fmt(&mut w, format_args!("{v:.1} {}", units[u]))?;
        }
        // ASCII only: digits, a dot, a space and a unit.
        f.pad(core::str::from_utf8(w.written()).unwrap_or("?"))
    }
}

/// Indents every line written through it by two spaces (the allocator's
/// lines inside the process report).
pub(crate) struct Indent<'a, W: fmt::Write> {
    pub(crate) out: &'a mut W,
    pub(crate) at_line_start: bool,
}

impl<W: fmt::Write> fmt::Write for Indent<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for line in s.split_inclusive('\n') {
            if self.at_line_start && line != "\n" {
                self.out.write_str("  ")?;
            }
            self.out.write_str(line)?;
            self.at_line_start = line.ends_with('\n');
        }
        Ok(())
    }
}

/// Copies `template` into `out` as a NUL-terminated path, replacing `%p`
/// with the process id. Returns false if it does not fit.
#[cfg(all(target_os = "linux", not(miri)))]
pub(crate) fn expand_path(template: &[u8], out: &mut [u8; 4096]) -> bool {
    let mut len = 0;
    let mut i = 0;
    while i < template.len() {
        if template[i] == b'%' && template.get(i + 1) == Some(&b'p') {
            // SAFETY: getpid has no preconditions.
            let pid = unsafe { libc::getpid() };
            let mut w = SliceWriter::new(&mut out[len..]);
            let _ = fmt::Write::write_fmt(&mut w, format_args!("{pid}"));
            if w.total + 1 >= 4096 - len {
                return false;
            }
            len += w.total;
            i += 2;
            continue;
        }
        if len + 1 >= out.len() {
            return false;
        }
        out[len] = template[i];
        len += 1;
        i += 1;
    }
    out[len] = 0;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write;

    #[test]
    fn slice_writer_truncates_like_snprintf() {
        let mut buf = [0xffu8; 6];
        let mut w = SliceWriter::new(&mut buf);
        write!(w, "hello world").unwrap();
        w.terminate();
        assert_eq!(w.total, 11);
        assert_eq!(&buf, b"hello\0");
    }

    #[test]
    fn formats_bytes() {
        let mut buf = [0u8; 32];
        let mut w = SliceWriter::new(&mut buf);
        write!(w, "{}|{}|{:>8}", Bytes(512), Bytes(3 << 20), Bytes(1 << 10)).unwrap();
        assert_eq!(w.written(), b"512 B|3.0 MiB| 1.0 KiB");
    }

    #[test]
    fn indents_lines() {
        let mut buf = [0u8; 32];
        let mut w = SliceWriter::new(&mut buf);
        let mut i = Indent {
            out: &mut w,
            at_line_start: true,
        };
        write!(i, "a\nb").unwrap();
        write!(i, "c\n\nd\n").unwrap();
        assert_eq!(w.written(), b"  a\n  bc\n\n  d\n");
    }

    #[cfg(all(target_os = "linux", not(miri)))]
    #[test]
    fn expands_pid() {
        let mut out = [0u8; 4096];
        assert!(expand_path(b"/tmp/x.%p.json", &mut out));
        let s = core::ffi::CStr::from_bytes_until_nul(&out).unwrap();
        let want = format!("/tmp/x.{}.json", std::process::id());
        assert_eq!(s.to_str().unwrap(), want);
    }
}
