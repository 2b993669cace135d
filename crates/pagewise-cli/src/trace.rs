//! Following the program's process tree with ptrace, so that every process
//! of it is known, however it ended: a library report needs exit handlers,
//! which `_exit`, a fatal signal or `exec` into a static binary never run.
//!
//! The tracer stops the tree only at events, never at system calls:
//! `PTRACE_O_TRACEFORK`, `TRACEVFORK` and `TRACECLONE` attach every new
//! task (threads too: a thread that forks must be followed, and `exec` from
//! a thread replaces the leader; threads are then left out of the report),
//! `TRACEEXEC` names each new image and `TRACEEXIT` reads the kernel's
//! figures (`VmHWM`, `VmRSS`, the mapped libraries) while the process still
//! has its memory. The program must not see a difference:
//!
//! - it is attached with `PTRACE_SEIZE`, so a stop for a signal and a
//!   group-stop (SIGSTOP, ^Z) are told apart: every signal is delivered
//!   again as it came, and a group-stop is left in place with
//!   `PTRACE_LISTEN` until SIGCONT (its parent is told of it as usual);
//! - the child waits on a pipe before `exec` until it is attached, rather
//!   than stopping itself with a signal its parent would see;
//! - each traced task costs a few stops per fork, exec, thread and exit,
//!   nothing between them.
//!
//! What it cannot hide: a traced program cannot be traced by another
//! debugger, and a set-user-ID program runs without its privileges unless
//! pagewise runs as root. `pagewise run --no-trace` runs without it.
//!
//! Why ptrace: the other ways to see every process miss some. The kernel's
//! process-events connector needs CAP_NET_ADMIN; polling /proc misses a
//! process shorter than the period; the library's own handlers (even an
//! interposed `_exit`) never run in a process killed by a signal or in a
//! static program.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// `PTRACE_EVENT_STOP` (glibc 2.26; not in the libc crate for glibc).
const PTRACE_EVENT_STOP: i32 = 128;
const OPTIONS: libc::c_int = libc::PTRACE_O_TRACEFORK
    | libc::PTRACE_O_TRACEVFORK
    | libc::PTRACE_O_TRACECLONE
    | libc::PTRACE_O_TRACEEXEC
    | libc::PTRACE_O_TRACEEXIT;

/// One process of the tree, as the tracer saw it.
#[derive(Clone, Debug, Default)]
pub struct Traced {
    /// Process id.
    pub pid: u32,
    /// The process that forked it (0 for the program itself).
    pub ppid: u32,
    /// Its name (`/proc/PID/comm`) when last seen.
    pub comm: String,
    /// The command line of its last image (a forked child's is its
    /// parent's until it execs).
    pub command: Vec<String>,
    /// The executable of its last image, if it execed.
    pub exe: Option<PathBuf>,
    /// Its last image is a statically linked program (LD_PRELOAD cannot
    /// reach it).
    pub static_image: bool,
    /// Whether libpagewise was mapped in it at exit (None: not seen at exit).
    pub loaded: Option<bool>,
    /// The highest `VmHWM` read at its exit (or before an `exec`).
    pub peak_rss: Option<u64>,
    /// `VmRSS` at its exit.
    pub final_rss: Option<u64>,
    /// `ru_maxrss` of its end (wait4): its own peak and its reaped
    /// children's, the only figure for a process killed by SIGKILL (which
    /// does not stop at exit).
    pub maxrss: Option<u64>,
    /// Its wait status (None: still running when the waiting stopped).
    pub status: Option<i32>,
    /// When it was first seen and when it ended, in ms since the start.
    pub start_ms: u64,
    /// See `start_ms`.
    pub end_ms: Option<u64>,
}

/// What the tracer learned about the whole run.
#[derive(Debug, Default)]
pub struct Tree {
    /// Every process, in order of appearance; the program first.
    pub processes: Vec<Traced>,
    /// The program's wait status.
    pub status: i32,
    /// Milliseconds until the program exited.
    pub elapsed_ms: u64,
    /// Set if ^C stopped the waiting for descendants still running.
    pub stopped_waiting: bool,
}

/// The program started, stopped before `exec` until released.
pub struct Child {
    /// Its pid.
    pub pid: libc::pid_t,
    go: libc::c_int,
    err: libc::c_int,
}

/// Builds a NUL-terminated C string (an interior NUL cannot be passed to
/// exec; such an argument is cut there, as a shell would have).
fn c_string(s: &OsStr) -> CString {
    let bytes = s.as_bytes();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    CString::new(&bytes[..end]).expect("no NUL before end")
}

/// Forks the child that will exec `command` (searched in `PATH`) with
/// `env`; it waits on a pipe until [`Child::release`]. Everything exec
/// needs is built before the fork: the child only calls async-signal-safe
/// functions.
pub fn fork_child(command: &[OsString], env: &[(OsString, OsString)]) -> std::io::Result<Child> {
    let file = c_string(&command[0]);
    let args: Vec<CString> = command.iter().map(|a| c_string(a)).collect();
    let vars: Vec<CString> = env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.clone();
            kv.push("=");
            kv.push(v);
            c_string(&kv)
        })
        .collect();
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = vars.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());
    let mut go = [0; 2];
    let mut err = [0; 2];
    // SAFETY: valid out-arrays of two descriptors.
    if unsafe { libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::pipe2(err.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        let e = std::io::Error::last_os_error();
        close(go[0]);
        close(go[1]);
        return Err(e);
    }
    // SAFETY: this process has one thread here (the sampler starts after),
    // and the child calls only async-signal-safe functions before exec.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        for fd in [go[0], go[1], err[0], err[1]] {
            close(fd);
        }
        return Err(e);
    }
    if pid == 0 {
        // SAFETY: async-signal-safe calls on our own descriptors and the
        // arrays built before the fork; the child never returns.
        unsafe {
            libc::close(go[1]);
            let mut byte = 0u8;
            while libc::read(go[0], (&mut byte as *mut u8).cast(), 1) < 0
                && *libc::__errno_location() == libc::EINTR
            {}
            // As std::process::Command does: an empty signal mask, and
            // SIGPIPE (which Rust ignores) back to its default.
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::execvpe(file.as_ptr(), argv.as_ptr(), envp.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(err[1], (&errno as *const i32).cast(), 4);
            libc::_exit(127);
        }
    }
    close(go[0]);
    close(err[1]);
    Ok(Child {
        pid,
        go: go[1],
        err: err[0],
    })
}

fn close(fd: libc::c_int) {
    // SAFETY: a descriptor this module opened and closes once.
    unsafe { libc::close(fd) };
}

impl Child {
    /// Attaches the tracer to the waiting child (from the thread that will
    /// wait for the tree).
    pub fn seize(&self) -> std::io::Result<()> {
        // SAFETY: PTRACE_SEIZE of our own child with an options word.
        let r = unsafe {
            libc::ptrace(
                libc::PTRACE_SEIZE,
                self.pid,
                std::ptr::null_mut::<libc::c_void>(),
                OPTIONS as usize as *mut libc::c_void,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Lets the child exec.
    pub fn release(&mut self) {
        let byte = 1u8;
        // SAFETY: one byte to our pipe; if the child died, EPIPE is
        // ignored (SIGPIPE is ignored in Rust programs).
        unsafe { libc::write(self.go, (&byte as *const u8).cast(), 1) };
        close(self.go);
        self.go = -1;
    }

    /// After the child ended: why its exec failed, if it did.
    pub fn exec_error(&self) -> Option<std::io::Error> {
        let mut errno = 0i32;
        // SAFETY: reads into a local; every write end is closed by now
        // (the child's at exec or exit), so this does not block.
        let n = unsafe { libc::read(self.err, (&mut errno as *mut i32).cast(), 4) };
        (n == 4).then(|| std::io::Error::from_raw_os_error(errno))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.go >= 0 {
            close(self.go);
        }
        close(self.err);
    }
}

/// The fields of `/proc/PID/status` the tracer uses.
#[derive(Default)]
struct Status {
    tgid: u32,
    ppid: u32,
    hwm: Option<u64>,
    rss: Option<u64>,
}

fn read_status(path: &str) -> Option<Status> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut s = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let number = || value.split_whitespace().next()?.parse::<u64>().ok();
        match key {
            "Tgid" => s.tgid = number().unwrap_or(0) as u32,
            "PPid" => s.ppid = number().unwrap_or(0) as u32,
            "VmHWM" => s.hwm = number().map(|kb| kb * 1024),
            "VmRSS" => s.rss = number().map(|kb| kb * 1024),
            _ => {}
        }
    }
    Some(s)
}

fn read_cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let words: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    (!words.is_empty()).then_some(words)
}

fn read_comm(pid: u32) -> Option<String> {
    let c = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(c.trim_end_matches('\n').to_string())
}

/// Whether a library of pagewise's is mapped in `pid`.
fn maps_pagewise(pid: u32) -> Option<bool> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    Some(maps.lines().any(|l| {
        l.rsplit('/')
            .next()
            .is_some_and(|f| f.starts_with("libpagewise"))
    }))
}

/// Restarts a stopped task with `sig` (0: none); a task killed meanwhile
/// (ESRCH) is no error.
fn resume(request: libc::c_uint, tid: libc::pid_t, sig: i32) {
    // SAFETY: ptrace restart requests on a tracee; bad pids fail harmlessly.
    unsafe {
        libc::ptrace(
            request,
            tid,
            std::ptr::null_mut::<libc::c_void>(),
            sig as usize as *mut libc::c_void,
        )
    };
}

fn event_message(tid: libc::pid_t) -> u64 {
    let mut msg: libc::c_ulong = 0;
    // SAFETY: a valid out-pointer for PTRACE_GETEVENTMSG.
    unsafe {
        libc::ptrace(
            libc::PTRACE_GETEVENTMSG,
            tid,
            std::ptr::null_mut::<libc::c_void>(),
            &mut msg as *mut libc::c_ulong,
        )
    };
    msg as u64
}

/// The tracer's state while the tree runs.
struct Tracer<'a> {
    top: u32,
    processes: Vec<Traced>,
    /// Live processes: pid to index in `processes`.
    live: HashMap<u32, usize>,
    /// Every traced task: tid to its process's pid.
    tasks: HashMap<u32, u32>,
    watch: &'a dyn Fn(u32, bool),
    now_ms: &'a dyn Fn() -> u64,
}

impl Tracer<'_> {
    /// The process of task `tid`, learned from /proc on first sight (a new
    /// task's first stop may come before its creator's fork event).
    fn process_of(&mut self, tid: u32, creator: Option<u32>) -> u32 {
        if let Some(&pid) = self.tasks.get(&tid) {
            return pid;
        }
        let status = read_status(&format!("/proc/{tid}/status"));
        let (tgid, ppid) = match &status {
            Some(s) if s.tgid != 0 => (s.tgid, s.ppid),
            _ => (tid, creator.unwrap_or(0)),
        };
        self.tasks.insert(tid, tgid);
        if tgid == tid && !self.live.contains_key(&tid) {
            let parent = self.live.get(&ppid).map(|&i| &self.processes[i]);
            let p = Traced {
                pid: tid,
                ppid,
                comm: read_comm(tid)
                    .or_else(|| parent.map(|p| p.comm.clone()))
                    .unwrap_or_default(),
                command: read_cmdline(tid)
                    .or_else(|| parent.map(|p| p.command.clone()))
                    .unwrap_or_default(),
                start_ms: (self.now_ms)(),
                ..Default::default()
            };
            self.live.insert(tid, self.processes.len());
            self.processes.push(p);
            (self.watch)(tid, true);
        }
        tgid
    }

    fn at_exec(&mut self, pid: u32) {
        let Some(&i) = self.live.get(&pid) else {
            return;
        };
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let image = PathBuf::from(format!("/proc/{pid}/exe"));
        let p = &mut self.processes[i];
        p.static_image = crate::elf::kind(&image).is_ok_and(|k| k == crate::elf::Kind::Static);
        p.exe = exe;
        p.loaded = None;
        if let Some(c) = read_cmdline(pid) {
            p.command = c;
        }
        if let Some(c) = read_comm(pid) {
            p.comm = c;
        }
    }

    /// At a task's exit stop: the process's figures while it still has
    /// its memory (any task's exit may be the last).
    fn at_exit(&mut self, tid: u32, pid: u32) {
        let Some(&i) = self.live.get(&pid) else {
            return;
        };
        let s = read_status(&format!("/proc/{pid}/task/{tid}/status"));
        let p = &mut self.processes[i];
        if let Some(s) = s {
            if let Some(hwm) = s.hwm {
                p.peak_rss = Some(p.peak_rss.map_or(hwm, |x| x.max(hwm)));
                p.final_rss = s.rss;
            }
        }
        if p.loaded.is_none() {
            p.loaded = maps_pagewise(pid);
        }
        if tid == pid {
            if let Some(c) = read_cmdline(pid) {
                p.command = c;
            }
        }
    }

    fn at_end(&mut self, tid: u32, status: i32, usage: &libc::rusage) -> bool {
        let pid = self.tasks.remove(&tid).unwrap_or(tid);
        if pid != tid {
            return false;
        }
        let Some(i) = self.live.remove(&pid) else {
            return false;
        };
        let p = &mut self.processes[i];
        p.status = Some(status);
        p.end_ms = Some((self.now_ms)());
        p.maxrss = Some(usage.ru_maxrss as u64 * 1024);
        (self.watch)(pid, false);
        pid == self.top
    }

    /// Handles one stop of `tid`, then restarts it.
    fn at_stop(&mut self, tid: u32, status: i32) {
        let pid = self.process_of(tid, None);
        let sig = libc::WSTOPSIG(status);
        let t = tid as libc::pid_t;
        match status >> 16 {
            0 => {
                // A signal on its way: delivered as it came.
                return resume(libc::PTRACE_CONT, t, sig);
            }
            libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK | libc::PTRACE_EVENT_CLONE => {
                let new = event_message(t) as u32;
                self.process_of(new, Some(pid));
            }
            libc::PTRACE_EVENT_EXEC => {
                // An exec from a thread takes the leader's pid; the
                // thread's own id is gone (no exit is reported for it).
                let former = event_message(t) as u32;
                if former != tid {
                    self.tasks.remove(&former);
                }
                self.at_exec(pid);
            }
            libc::PTRACE_EVENT_EXIT => self.at_exit(tid, pid),
            PTRACE_EVENT_STOP
                if matches!(
                    sig,
                    libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                ) =>
            {
                // A group-stop: it stays stopped until SIGCONT.
                return resume(libc::PTRACE_LISTEN, t, 0);
            }
            _ => {}
        }
        resume(libc::PTRACE_CONT, t, 0);
    }
}

/// Follows the tree of `child` (attached with [`Child::seize`]) until no
/// process of it remains, or ^C after the program's exit. `watch(pid,
/// alive)` is told of each process's start and end; `now_ms` is the run's
/// clock.
pub fn follow(child: &Child, watch: &dyn Fn(u32, bool), now_ms: &dyn Fn() -> u64) -> Tree {
    let top = child.pid as u32;
    let mut tracer = Tracer {
        top,
        processes: Vec::new(),
        live: HashMap::new(),
        tasks: HashMap::new(),
        watch,
        now_ms,
    };
    tracer.process_of(top, Some(0));
    tracer.processes[0].ppid = 0;
    let mut tree = Tree::default();
    let mut top_done = false;
    loop {
        let mut status = 0;
        // SAFETY: zeroed rusage is a valid out-value.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointers; __WALL waits for threads and for
        // tracees that are not our children.
        let tid = unsafe { libc::wait4(-1, &mut status, libc::__WALL, &mut usage) };
        if tid < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                if top_done && crate::run::interrupted() {
                    tree.stopped_waiting = true;
                    break;
                }
                continue;
            }
            // ECHILD: no task of the tree is left.
            break;
        }
        let tid = tid as u32;
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            if tracer.at_end(tid, status, &usage) {
                top_done = true;
                tree.status = status;
                tree.elapsed_ms = now_ms();
                // A ^C the program survived (or died of) is not for us.
                crate::run::INTERRUPTED.store(false, Ordering::Relaxed);
            }
        } else if libc::WIFSTOPPED(status) {
            tracer.at_stop(tid, status);
        }
    }
    tree.processes = tracer.processes;
    tree
}

/// The usual name of signal `sig` (`SIGKILL`), or its number.
pub fn signal_name(sig: i32) -> String {
    let names = [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGXCPU, "SIGXCPU"),
        (libc::SIGXFSZ, "SIGXFSZ"),
        (libc::SIGSYS, "SIGSYS"),
    ];
    names
        .iter()
        .find(|(n, _)| *n == sig)
        .map_or_else(|| format!("signal {sig}"), |(_, name)| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_signals() {
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(40), "signal 40");
    }

    #[test]
    fn reads_its_own_status() {
        let s = read_status("/proc/self/status").unwrap();
        assert_eq!(s.tgid, std::process::id());
        assert!(s.hwm.unwrap() > 0 && s.rss.unwrap() > 0);
    }
}
