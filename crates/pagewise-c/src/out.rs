//! Output without allocation: fixed stack buffers behind `core::fmt::Write`.
//!
//! Everything the library prints (reports at exit, `pagewise_stats_print`,
//! `pagewise_stats_json`, the sampler's lines) goes through these writers, so
//! no byte of output ever comes from the heap being reported on.

use core::fmt;

/// Writes to a file descriptor through a 4 KiB stack buffer.
pub struct FdWriter {
    fd: libc::c_int,
    buf: [u8; 4096],
    len: usize,
}

impl FdWriter {
    /// A writer on `fd` (not closed on drop).
    pub fn new(fd: libc::c_int) -> Self {
        FdWriter {
            fd,
            buf: [0; 4096],
            len: 0,
        }
    }

    /// Writes out what is buffered (errors are ignored: there is nowhere to
    /// report them).
    pub fn flush(&mut self) {
        let mut at = 0;
        while at < self.len {
            // SAFETY: writing initialised bytes of our own buffer.
            let n = unsafe { libc::write(self.fd, self.buf[at..].as_ptr().cast(), self.len - at) };
            if n <= 0 {
                if n < 0 && errno() == libc::EINTR {
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
pub struct SliceWriter<'a> {
    buf: &'a mut [u8],
    /// Bytes that would have been written with unlimited room.
    pub total: usize,
}

impl<'a> SliceWriter<'a> {
    /// A writer over `buf` (may be empty).
    pub fn new(buf: &'a mut [u8]) -> Self {
        SliceWriter { buf, total: 0 }
    }

    /// Writes the terminating NUL (at the end of the text, or truncating it).
    pub fn terminate(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let at = self.total.min(self.buf.len() - 1);
        self.buf[at] = 0;
    }

    /// The text written so far (what fitted).
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

pub use pw::c_malloc::{errno, set_errno};

/// Bytes as a short human figure: `12.3 MiB`.
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b < 1024 {
            return write!(f, "{b} B");
        }
        let units = ["KiB", "MiB", "GiB", "TiB"];
        let mut v = b as f64 / 1024.0;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < units.len() {
            v /= 1024.0;
            u += 1;
        }
        write!(f, "{v:.1} {}", units[u])
    }
}

/// Copies `template` into `out` as a NUL-terminated path, replacing `%p`
/// with the process id. Returns false if it does not fit.
pub fn expand_path(template: &[u8], out: &mut [u8; 4096]) -> bool {
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

pub use pw::fault::decimal;

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
        write!(w, "{}|{}", Bytes(512), Bytes(3 << 20)).unwrap();
        assert_eq!(w.written(), b"512 B|3.0 MiB");
    }

    #[test]
    fn expands_pid() {
        let mut out = [0u8; 4096];
        assert!(expand_path(b"/tmp/x.%p.json", &mut out));
        let s = core::ffi::CStr::from_bytes_until_nul(&out).unwrap();
        let want = format!("/tmp/x.{}.json", std::process::id());
        assert_eq!(s.to_str().unwrap(), want);
    }
}
