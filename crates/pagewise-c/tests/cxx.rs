//! The C++ test program (`tests/c/cxx.cpp`): every form of `operator new`
//! and `operator delete` resolves to libpagewise.so and serves pagewise
//! memory, and failure follows the standard (the new handler, then
//! `std::bad_alloc`; null from the nothrow forms).

mod common;

use common::*;

fn assert_ok(o: &std::process::Output, what: &str) {
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && stdout.contains("cxx: all ok"),
        "{what}: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        o.status
    );
}

#[test]
fn every_operator_form_under_preload() {
    let Some(cxx) = cxx_program() else { return };
    // The limit makes a 40 MiB `new` fail while a 40 MiB reserve is held,
    // so that the new handler can free the reserve and the retry succeed.
    let o = preloaded({
        let mut c = command(cxx);
        c.arg("pagewise").env("PAGEWISE_LIMIT", "64M");
        c
    });
    assert_ok(&o, "cxx pagewise (LD_PRELOAD)");
}

#[test]
fn the_same_semantics_hold_under_libstdcxx() {
    let Some(cxx) = cxx_program() else { return };
    let o = command(cxx).arg("glibc").output().unwrap();
    assert_ok(&o, "cxx glibc (no preload)");
}
