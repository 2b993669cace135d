//! jemalloc's `malloc_stats_print`: pagewise's report, through the
//! caller's callback.

use core::ffi::{c_char, c_void, CStr};
use core::fmt::{self, Write};

/// jemalloc's `write_cb`: called with the caller's opaque pointer and a
/// NUL-terminated piece of the text.
pub type WriteCb = unsafe extern "C" fn(*mut c_void, *const c_char);

/// Hands text to a `write_cb` in pieces of up to 1 KiB, each
/// NUL-terminated, from a buffer on the stack.
struct CallbackWriter {
    cb: WriteCb,
    opaque: *mut c_void,
    buf: [u8; 1025],
    len: usize,
}

impl CallbackWriter {
    fn flush(&mut self) {
        if self.len == 0 {
            return;
        }
        self.buf[self.len] = 0;
        self.len = 0;
        // SAFETY: a NUL-terminated buffer; the callback and its pointer
        // are the caller's (`malloc_stats_print`'s contract).
        unsafe { (self.cb)(self.opaque, self.buf.as_ptr().cast()) };
    }
}

impl Write for CallbackWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - 1;
        // A NUL inside the text would cut a piece short: none is written.
        for chunk in s.as_bytes().split(|&b| b == 0).flat_map(|p| p.chunks(room)) {
            if self.len + chunk.len() > room {
                self.flush();
            }
            self.buf[self.len..self.len + chunk.len()].copy_from_slice(chunk);
            self.len += chunk.len();
        }
        Ok(())
    }
}

/// Writes the report: JSON when `json`, else the text.
fn write_report(w: &mut impl Write, json: bool) {
    let r = pw::report();
    let _ = if json {
        r.write_json(w).and_then(|()| w.write_char('\n'))
    } else {
        write!(w, "{r}")
    };
}

/// jemalloc's `malloc_stats_print`: pagewise's report (the text of
/// `pagewise_stats_print`, or its JSON document when `opts` contains `J`,
/// jemalloc's JSON option; the other option letters select jemalloc's
/// sections and are ignored), handed to `write_cb(cbopaque, piece)` in
/// NUL-terminated pieces of up to 1 KiB, or written to stderr when
/// `write_cb` is null. The report is taken and formatted on the stack,
/// with no pagewise lock held while the callback runs (it may allocate).
///
/// # Safety
/// `write_cb` is null or a function taking `cbopaque`; `opts` is null or
/// NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn malloc_stats_print(
    write_cb: Option<WriteCb>,
    cbopaque: *mut c_void,
    opts: *const c_char,
) {
    // SAFETY: NUL-terminated when not null (caller).
    let json = !opts.is_null() && unsafe { CStr::from_ptr(opts) }.to_bytes().contains(&b'J');
    match write_cb {
        Some(cb) => {
            let mut w = CallbackWriter {
                cb,
                opaque: cbopaque,
                buf: [0; 1025],
                len: 0,
            };
            write_report(&mut w, json);
            w.flush();
        }
        None => write_report(&mut crate::out::FdWriter::new(2), json),
    }
}
