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

/// Runs `cmd` to completion as `Command::output` does, but gives it at
/// most `limit`: a child still running then (a lost wake-up leaves a test
/// hanging until CI's own limit, with nothing to show for it) is killed
/// and the test fails with what each of its threads was waiting in (the
/// kernel's wait channel and system call), where the futex words they
/// wait on lie relative to the test binary's load address (for `nm`), and
/// the child's output so far.
pub fn output_within(mut cmd: Command, limit: std::time::Duration) -> std::process::Output {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if start.elapsed() > limit {
            let threads = threads_of(child.id());
            let _ = child.kill();
            let _ = child.wait();
            let (out, err) = (out.join().unwrap(), err.join().unwrap());
            panic!(
                "the child ran for more than {limit:?} and was killed; its threads:\n{threads}\
                 stdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// One line per thread of process `pid`: its state, wait channel and
/// system call (`/proc/PID/task/TID/syscall`: number, then arguments; a
/// futex's first argument is its word), and the mapping that argument lies
/// in with its offset there (in this test binary's image: look the offset
/// up with `nm`, adding the image's first address as `readelf -l` shows
/// it; under an emulator, the guest binary's image).
fn threads_of(pid: u32) -> String {
    let read = |p: String| std::fs::read_to_string(p).unwrap_or_default();
    let maps = read(format!("/proc/{pid}/maps"));
    let exe = std::env::current_exe().unwrap_or_default();
    let exe = exe.to_string_lossy().into_owned();
    let range = |l: &str| -> Option<(usize, usize)> {
        let (a, b) = l.split(' ').next()?.split_once('-')?;
        Some((
            usize::from_str_radix(a, 16).ok()?,
            usize::from_str_radix(b, 16).ok()?,
        ))
    };
    // The image: the file's mappings and the anonymous one right after
    // them (the rest of its .bss), so a word is named by its offset from
    // the image's first address.
    let file: Vec<(usize, usize)> = maps
        .lines()
        .filter(|l| l.ends_with(&*exe))
        .filter_map(range)
        .collect();
    let start = file.iter().map(|r| r.0).min().unwrap_or(0);
    let mut end = file.iter().map(|r| r.1).max().unwrap_or(0);
    if let Some((_, e)) = maps.lines().filter_map(range).find(|r| r.0 == end) {
        end = e;
    }
    let place = |w: usize| -> String {
        if (start..end).contains(&w) {
            return format!("image + {:#x}", w - start);
        }
        maps.lines()
            .find(|l| range(l).is_some_and(|(a, b)| (a..b).contains(&w)))
            .map(|l| format!("in {}", l.split_whitespace().collect::<Vec<_>>().join(" ")))
            .unwrap_or_else(|| "unmapped".into())
    };
    let mut s = format!("(image: {exe})\n");
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return s + "(no /proc entry)\n";
    };
    for t in tasks.flatten() {
        let tid = t.file_name().to_string_lossy().into_owned();
        let dir = format!("/proc/{pid}/task/{tid}");
        let stat = read(format!("{dir}/stat"));
        let state = stat.rsplit(") ").next().and_then(|r| r.split(' ').next());
        let syscall = read(format!("{dir}/syscall"));
        let word = syscall
            .split(' ')
            .nth(1)
            .and_then(|a| usize::from_str_radix(a.trim_start_matches("0x"), 16).ok());
        s += &format!(
            "  {tid} {} {} syscall {}{}\n",
            state.unwrap_or("?"),
            read(format!("{dir}/wchan")),
            syscall.trim(),
            word.map(|w| format!(" (argument 1 {})", place(w)))
                .unwrap_or_default()
        );
    }
    s
}
