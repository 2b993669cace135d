//! Output without allocation: the core's fixed-buffer writers
//! (`pw::report`), and the errno and decimal helpers the exports use.

pub use pw::c_malloc::{errno, set_errno};
pub use pw::fault::decimal;
pub use pw::report::{Bytes, FdWriter, SliceWriter};
