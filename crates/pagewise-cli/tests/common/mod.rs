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

/// Debian's program at `/usr/bin/<name>`, or None when it is not installed
/// (see [`missing`]).
pub fn debian_program(name: &str, package: &str) -> Option<std::path::PathBuf> {
    let p = std::path::Path::new("/usr/bin").join(name);
    if p.exists() {
        Some(p)
    } else {
        missing(&p.display().to_string(), package);
        None
    }
}
