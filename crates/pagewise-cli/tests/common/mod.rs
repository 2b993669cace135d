//! What a test does when a program it needs (python3) is missing.

#![allow(dead_code)]

#[path = "../../../pagewise-c/tests/common/missing.rs"]
mod missing;
pub use missing::missing;

/// Go's command (Debian's golang-go, for `go tool pprof`), or None when it
/// is not installed (see [`missing`]).
pub fn go() -> Option<&'static str> {
    let p = "/usr/bin/go";
    if std::path::Path::new(p).exists() {
        Some(p)
    } else {
        missing(p, "golang-go");
        None
    }
}
