//! Why LD_PRELOAD may not reach a program: it is statically linked (no
//! `PT_INTERP`: no dynamic loader runs, so nothing reads LD_PRELOAD), or it
//! is set-user-ID or set-group-ID (the loader then ignores LD_PRELOAD). Just
//! enough ELF to read the program headers of the resolved executable.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What the executable is, as far as LD_PRELOAD is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An ELF program without an interpreter: statically linked (including
    /// static-pie).
    Static,
    /// An ELF program run by the dynamic loader.
    Dynamic,
    /// A `#!` script and its interpreter.
    Script(PathBuf),
    /// Something else (or too short to tell).
    Other,
}

/// The file `exec` would run for `cmd`: itself if it contains a `/`, else
/// the first executable file of that name in `$PATH`.
pub fn resolve(cmd: &OsStr) -> Option<PathBuf> {
    if cmd.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(cmd));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|d| d.join(cmd)).find(|p| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
    })
}

/// Reads enough of `path` to say what [`Kind`] it is.
pub fn kind(path: &Path) -> std::io::Result<Kind> {
    let f = File::open(path)?;
    let mut head = [0u8; 256];
    let n = read_at(&f, &mut head, 0)?;
    let head = &head[..n];
    if let Some(rest) = head.strip_prefix(b"#!") {
        let line = rest.split(|&b| b == b'\n').next().unwrap_or(&[]);
        let interp = line
            .split(|&b| b == b' ' || b == b'\t')
            .find(|w| !w.is_empty());
        return Ok(match interp {
            Some(i) => Kind::Script(PathBuf::from(OsStr::from_bytes(i))),
            None => Kind::Other,
        });
    }
    if n < 64 || &head[..4] != b"\x7fELF" {
        return Ok(Kind::Other);
    }
    let le = match head[5] {
        1 => true,
        2 => false,
        _ => return Ok(Kind::Other),
    };
    let num = |at: usize, len: usize| -> u64 {
        let b = &head[at..at + len];
        let mut v = 0u64;
        for i in 0..len {
            let byte = if le { b[len - 1 - i] } else { b[i] };
            v = v << 8 | byte as u64;
        }
        v
    };
    // (e_phoff, e_phentsize, e_phnum) for ELFCLASS32 and ELFCLASS64.
    let (phoff, entsize, phnum) = match head[4] {
        1 => (num(0x1c, 4), num(0x2a, 2), num(0x2c, 2)),
        2 => (num(0x20, 8), num(0x36, 2), num(0x38, 2)),
        _ => return Ok(Kind::Other),
    };
    if entsize < 4 || phnum == 0 || phnum == 0xffff {
        // No program headers (or more than fit the field): not something
        // the loader would have run either way.
        return Ok(Kind::Other);
    }
    let mut table = vec![0u8; (entsize * phnum) as usize];
    let got = read_at(&f, &mut table, phoff)?;
    const PT_INTERP: u32 = 3;
    for entry in table[..got].chunks_exact(entsize as usize) {
        let t = [entry[0], entry[1], entry[2], entry[3]];
        let p_type = if le {
            u32::from_le_bytes(t)
        } else {
            u32::from_be_bytes(t)
        };
        if p_type == PT_INTERP {
            return Ok(Kind::Dynamic);
        }
    }
    Ok(Kind::Static)
}

/// Whether running `path` is a secure execution (set-user-ID or
/// set-group-ID to someone else), for which the loader ignores LD_PRELOAD.
pub fn is_secure_exec(path: &Path) -> bool {
    let Ok(m) = path.metadata() else {
        return false;
    };
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    (m.mode() & libc::S_ISUID != 0 && m.uid() != uid)
        || (m.mode() & libc::S_ISGID != 0 && m.gid() != gid)
}

fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Why the program `cmd` (as typed; `shown` quoted for the message) sent
/// neither a report nor a sample, if its executable says why.
pub fn never_loaded(cmd: &OsStr, shown: &str) -> String {
    let generic = format!(
        "libpagewise.so was never loaded in {shown} (neither a report nor a sample arrived):\n  \
         something cleared LD_PRELOAD, or the program could not write to the temporary directory"
    );
    let Some(path) = resolve(cmd) else {
        return generic;
    };
    match kind(&path) {
        Ok(Kind::Static) => {
            format!("{shown} is statically linked: LD_PRELOAD cannot reach it, so pagewise saw none of its allocations")
        }
        Ok(Kind::Script(interp)) => match resolve(interp.as_os_str()).map(|p| kind(&p)) {
            Some(Ok(Kind::Static)) => format!(
                "{shown} runs under {}, which is statically linked: LD_PRELOAD cannot reach it",
                interp.display()
            ),
            _ => generic,
        },
        Ok(Kind::Dynamic) if is_secure_exec(&path) => {
            format!("{shown} is set-user-ID or set-group-ID: the loader ignores LD_PRELOAD for it")
        }
        _ => generic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_is_dynamic_and_sh_is_found() {
        let me = std::env::current_exe().unwrap();
        assert_eq!(kind(&me).unwrap(), Kind::Dynamic);
        let sh = resolve(OsStr::new("sh")).expect("sh in PATH");
        assert!(sh.is_absolute());
        assert!(resolve(OsStr::new("no-such-program-pagewise")).is_none());
    }

    #[test]
    fn a_script_names_its_interpreter() {
        let p = std::env::temp_dir().join(format!("pagewise-elf-test-{}", std::process::id()));
        std::fs::write(&p, "#!/bin/sh -e\necho hi\n").unwrap();
        assert_eq!(kind(&p).unwrap(), Kind::Script("/bin/sh".into()));
        std::fs::write(&p, "just text").unwrap();
        assert_eq!(kind(&p).unwrap(), Kind::Other);
        std::fs::remove_file(&p).unwrap();
    }
}
