//! What a test does when something it needs from the system is missing:
//! shared by the test crates of pagewise-c, pagewise-bench and pagewise-cli
//! (included by path).

/// Whether the tests run in CI (`PAGEWISE_TEST_CI=1`, exported by `.ci/run`),
/// where `.ci/clib-deps.sh` has installed every program and library they
/// use.
fn in_ci() -> bool {
    std::env::var_os("PAGEWISE_TEST_CI").is_some_and(|v| v == "1")
}

/// Something the running test needs (`what`, from Debian's `package`) is
/// not installed. In CI that is a failure: this panics. Elsewhere it writes
/// one line, `SKIPPED <test>: <what> not installed (apt-get install
/// <package>)`, straight to stderr, where libtest's capture (which takes
/// only the print macros) does not hide it; the caller then skips.
pub fn missing(what: &str, package: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    if in_ci() {
        panic!(
            "{test}: {what} not installed, and PAGEWISE_TEST_CI=1 says it must be \
             (apt-get install {package}; .ci/clib-deps.sh does)"
        );
    }
    use std::io::Write;
    let line = format!("SKIPPED {test}: {what} not installed (apt-get install {package})\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}
