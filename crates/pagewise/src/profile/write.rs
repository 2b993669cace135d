//! The profile as a file: the sites and the process's module map, in a
//! line-oriented text form, written without allocating (a stack buffer and
//! `write(2)`), so it can be written at `exit()`, from a signal handler's
//! thread or while other threads allocate.
//!
//! ```text
//! pagewise heap profile 1
//! sample_bytes 524288
//! site LIVE_N LIVE_BYTES PEAK_N PEAK_BYTES ALLOC_N ALLOC_BYTES 0x55d0c8e1a2b4 0x55d0c8e19f10 ...
//! ...
//! maps
//! (the process's /proc/self/maps, as the kernel wrote it)
//! ```
//!
//! Counts are estimated allocations, bytes estimated bytes; the frames are
//! return addresses, innermost first. `pagewise` (the command) reads it.

use super::sites::COUNT_ONE;
use core::ffi::CStr;

/// A buffer that writes itself to `fd` when full.
struct Out {
    fd: i32,
    buf: [u8; 4096],
    len: usize,
    ok: bool,
}

impl Out {
    fn bytes(&mut self, b: &[u8]) {
        for chunk in b.chunks(self.buf.len()) {
            if self.len + chunk.len() > self.buf.len() {
                self.flush();
            }
            self.buf[self.len..self.len + chunk.len()].copy_from_slice(chunk);
            self.len += chunk.len();
        }
    }

    fn number(&mut self, mut n: u64, base: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[(n % base) as usize];
            n /= base;
            if n == 0 {
                break;
            }
        }
        self.bytes(&digits[i..]);
    }

    fn flush(&mut self) {
        let mut done = 0;
        while done < self.len {
            // SAFETY: writes from our own buffer.
            let r =
                unsafe { libc::write(self.fd, self.buf[done..].as_ptr().cast(), self.len - done) };
            if r <= 0 {
                if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                self.ok = false;
                break;
            }
            done += r as usize;
        }
        self.len = 0;
    }
}

/// Writes the profile to `path` (created or truncated, mode 0644). False if
/// the file could not be written.
///
/// ```
/// let path = std::env::temp_dir().join(format!("pagewise-doc-{}.prof", std::process::id()));
/// let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
/// assert!(pagewise::profile::write(&c));
/// let text = std::fs::read_to_string(&path).unwrap();
/// assert!(text.starts_with("pagewise heap profile 1\n"));
/// assert!(text.contains("\nmaps\n"));
/// # std::fs::remove_file(path).unwrap();
/// ```
pub fn write(path: &CStr) -> bool {
    // SAFETY: a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd < 0 {
        return false;
    }
    let mut out = Out {
        fd,
        buf: [0; 4096],
        len: 0,
        ok: true,
    };
    out.bytes(b"pagewise heap profile 1\nsample_bytes ");
    out.number(super::sample_bytes() as u64, 10);
    out.bytes(b"\n");
    super::for_each_site(|s| {
        out.bytes(b"site");
        for f in [s.live, s.peak, s.allocated] {
            out.bytes(b" ");
            out.number(f.count.div_ceil(COUNT_ONE), 10);
            out.bytes(b" ");
            out.number(f.bytes, 10);
        }
        for &ip in s.frames {
            out.bytes(b" 0x");
            out.number(ip as u64, 16);
        }
        out.bytes(b"\n");
    });
    out.bytes(b"maps\n");
    copy_maps(&mut out);
    out.flush();
    // SAFETY: our descriptor.
    let closed = unsafe { libc::close(fd) } == 0;
    out.ok && closed
}

/// Appends `/proc/self/maps` (nothing where there is none).
fn copy_maps(out: &mut Out) {
    // SAFETY: a constant NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return;
    }
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reads into our own buffer.
        let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if r <= 0 {
            break;
        }
        out.bytes(&buf[..r as usize]);
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
}

/// Writes the profile to `PAGEWISE_PROF_FILE` (`%p` in it replaced by the
/// process id), if it is set and the process samples: what happens at
/// `exit()`, and in the C library on `PAGEWISE_STATS_SIGNAL`. Says on
/// stderr if the file could not be written. Allocates nothing and takes no
/// lock. False if nothing was written.
///
/// ```
/// // Not sampling (no PAGEWISE_PROF=1): nothing to write.
/// assert!(!pagewise::profile::dump());
/// ```
pub fn dump() -> bool {
    let Some(template) = crate::config::Variable::ProfFile.text() else {
        return false;
    };
    if super::sample_bytes() == 0 || template.is_empty() {
        return false;
    }
    let mut path = [0u8; 4096];
    let Some(len) = expand(template, &mut path) else {
        return false;
    };
    let Ok(p) = CStr::from_bytes_with_nul(&path[..=len]) else {
        return false;
    };
    let ok = write(p);
    if !ok {
        crate::fault::write_stderr(&[
            b"pagewise: could not write the heap profile to ",
            p.to_bytes(),
            b"\n",
        ]);
    }
    ok
}

/// `template` with `%p` replaced by the process id, NUL-terminated in
/// `out`; its length, or `None` if it does not fit.
fn expand(template: &[u8], out: &mut [u8; 4096]) -> Option<usize> {
    let mut len = 0;
    let mut push = |b: &[u8], len: &mut usize| -> Option<()> {
        let end = *len + b.len();
        if end >= out.len() {
            return None;
        }
        out[*len..end].copy_from_slice(b);
        *len = end;
        Some(())
    };
    let mut i = 0;
    while i < template.len() {
        if template[i..].starts_with(b"%p") {
            // SAFETY: getpid has no preconditions.
            let mut pid = unsafe { libc::getpid() } as u64;
            let mut digits = [0u8; 20];
            let mut k = digits.len();
            loop {
                k -= 1;
                digits[k] = b'0' + (pid % 10) as u8;
                pid /= 10;
                if pid == 0 {
                    break;
                }
            }
            push(&digits[k..], &mut len)?;
            i += 2;
        } else {
            push(&template[i..i + 1], &mut len)?;
            i += 1;
        }
    }
    out[len] = 0;
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_p_is_the_process_id() {
        let mut out = [0u8; 4096];
        let n = expand(b"/tmp/x.%p.prof", &mut out).unwrap();
        let want = format!("/tmp/x.{}.prof", std::process::id());
        assert_eq!(&out[..n], want.as_bytes());
        assert_eq!(out[n], 0);
    }
}
