//! This test binary as a command, for the tests that re-execute it in a
//! child process.
//!
//! Under user-mode emulation (the aarch64 suite runs under `qemu-aarch64`
//! in CI) the binary cannot be executed directly unless the host has a
//! binfmt_misc handler, which a container usually cannot install: the child
//! must go through the emulator too. `PAGEWISE_TEST_RUNNER` names it, as
//! cargo's `CARGO_TARGET_<TRIPLE>_RUNNER` does (CI sets both to the same
//! command); unset or empty, the binary runs directly.

#![allow(dead_code)]

use std::process::Command;

/// The emulator's command line, if the tests run under one.
fn runner() -> String {
    std::env::var("PAGEWISE_TEST_RUNNER").unwrap_or_default()
}

/// Whether the tests run under an emulator (`PAGEWISE_TEST_RUNNER` set):
/// then `/proc/self` figures such as the resident set are the emulator's.
pub fn emulated() -> bool {
    !runner().trim().is_empty()
}

/// A command that runs this test binary (through the emulator, if any).
pub fn this_binary() -> Command {
    let exe = std::env::current_exe().expect("the test binary");
    let runner = runner();
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(exe);
            cmd
        }
        None => Command::new(exe),
    }
}
