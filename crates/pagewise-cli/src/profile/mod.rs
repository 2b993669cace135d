//! Heap profiles: what libpagewise.so writes with `PAGEWISE_PROF=1`
//! (sampled call sites, their estimated live, peak and allocated bytes,
//! and the process's module map), read, symbolized and written as the
//! files people already read: pprof's `profile.proto` (gzipped), collapsed
//! stacks and flamegraph SVGs.

pub mod flame;
pub mod pprof;
pub mod symbols;

use std::path::Path;

/// Estimated allocations and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    pub count: u64,
    pub bytes: u64,
}

/// One call site of the profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// Live at the time the profile was written (at exit: the leaks).
    pub live: Figures,
    /// Live when the process's committed memory was highest.
    pub peak: Figures,
    /// Allocated over the process's life.
    pub allocated: Figures,
    /// Return addresses, innermost first.
    pub frames: Vec<u64>,
}

/// One mapping of the process (a line of `/proc/PID/maps` with a file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub executable: bool,
    pub path: String,
}

/// A profile as written by the library.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// Mean bytes between samples.
    pub sample_bytes: u64,
    pub sites: Vec<Site>,
    pub mappings: Vec<Mapping>,
}

impl Profile {
    /// Parses the library's text form (`pagewise::profile::write`).
    ///
    /// ```ignore
    /// let p = Profile::parse("pagewise heap profile 1\nsample_bytes 524288\nsite 1 10 1 10 2 20 0x401000\nmaps\n").unwrap();
    /// assert_eq!(p.sites[0].frames, vec![0x401000]);
    /// ```
    pub fn parse(text: &str) -> Result<Profile, String> {
        let mut lines = text.lines();
        if lines.next() != Some("pagewise heap profile 1") {
            return Err("not a pagewise heap profile (version 1)".into());
        }
        let mut p = Profile::default();
        let mut in_maps = false;
        for line in lines {
            if in_maps {
                if let Some(m) = parse_mapping(line) {
                    p.mappings.push(m);
                }
                continue;
            }
            let mut w = line.split(' ');
            match w.next() {
                Some("sample_bytes") => p.sample_bytes = number(w.next())?,
                Some("site") => {
                    let mut f = [0u64; 6];
                    for v in &mut f {
                        *v = number(w.next())?;
                    }
                    let frames = w
                        .map(|a| {
                            u64::from_str_radix(a.trim_start_matches("0x"), 16)
                                .map_err(|e| format!("frame {a}: {e}"))
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    p.sites.push(Site {
                        live: Figures {
                            count: f[0],
                            bytes: f[1],
                        },
                        peak: Figures {
                            count: f[2],
                            bytes: f[3],
                        },
                        allocated: Figures {
                            count: f[4],
                            bytes: f[5],
                        },
                        frames,
                    });
                }
                Some("maps") => in_maps = true,
                _ => return Err(format!("unexpected line {line:?}")),
            }
        }
        Ok(p)
    }

    /// Reads and parses a profile file.
    pub fn read(path: &Path) -> Result<Profile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Profile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

fn number(w: Option<&str>) -> Result<u64, String> {
    let w = w.ok_or("a number is missing")?;
    w.parse().map_err(|e| format!("{w}: {e}"))
}

/// `start-end perms offset dev inode path` (only lines with a path).
fn parse_mapping(line: &str) -> Option<Mapping> {
    let mut w = line.split_whitespace();
    let range = w.next()?;
    let perms = w.next()?;
    let offset = u64::from_str_radix(w.next()?, 16).ok()?;
    let _dev = w.next()?;
    let _inode = w.next()?;
    let path: String = w.collect::<Vec<_>>().join(" ");
    if !path.starts_with('/') {
        return None;
    }
    let (s, e) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        offset,
        executable: perms.contains('x'),
        path,
    })
}

/// The files written for one process's profile, and the text report's
/// part for it: the top call sites by bytes in use at the peak and still
/// in use at exit.
pub fn convert(path: &Path, top: usize) -> Result<String, String> {
    let p = Profile::read(path)?;
    if p.sites.is_empty() {
        // A process that allocated too little to be sampled.
        return Ok(String::new());
    }
    let stem = path.with_extension("");
    let mut sym = symbols::Symbolizer::new(&p.mappings);
    let pprof = pprof::build(&p, &mut sym);
    let pb = stem.with_extension("pb.gz");
    pprof::write(&pprof, &pb).map_err(|e| format!("{}: {e}", pb.display()))?;
    let mut text = String::new();
    let pid = stem
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    text += &format!(
        "heap profile of process {pid} (one sample per {} on average): {}\n",
        crate::report::human(p.sample_bytes),
        pb.display()
    );
    for (view, name) in [
        (flame::View::Peak, "peak"),
        (flame::View::Live, "leaks"),
        (flame::View::Allocated, "alloc"),
    ] {
        let lines = flame::collapsed(&p, &mut sym, view);
        let folded = stem.with_extension(format!("{name}.folded"));
        std::fs::write(
            &folded,
            lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
        )
        .map_err(|e| format!("{}: {e}", folded.display()))?;
        flame::svg(
            &lines,
            &format!("{pid}: {}", view.title()),
            &stem.with_extension(format!("{name}.svg")),
        )?;
        if view == flame::View::Allocated {
            continue;
        }
        text += &format!("  top call sites by {}:\n", view.title());
        let mut sites: Vec<&Site> = p.sites.iter().filter(|s| view.of(s).bytes > 0).collect();
        sites.sort_by_key(|s| std::cmp::Reverse(view.of(s).bytes));
        if sites.is_empty() {
            text += "    (none)\n";
        }
        for s in sites.into_iter().take(top) {
            let f = view.of(s);
            let stack = sym.stack(&s.frames);
            let leaf = stack
                .last()
                .map_or("[unknown]".to_string(), |f| match &f.location {
                    Some(l) => format!("{} ({l})", f.function),
                    None => format!("{} ({})", f.function, f.module),
                });
            text += &format!(
                "    {:>10} in {:>8} allocations  {leaf}\n",
                crate::report::human(f.bytes),
                f.count
            );
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sites_and_maps() {
        let text = "pagewise heap profile 1\nsample_bytes 524288\nsite 1 10 2 20 3 30 0x401000 0x401234\nmaps\n00400000-00402000 r-xp 00000000 08:01 12 /usr/bin/prog\n7ffd0000-7ffd1000 rw-p 00000000 00:00 0 [stack]\n";
        let p = Profile::parse(text).unwrap();
        assert_eq!(p.sample_bytes, 524288);
        assert_eq!(p.sites.len(), 1);
        assert_eq!(
            p.sites[0].live,
            Figures {
                count: 1,
                bytes: 10
            }
        );
        assert_eq!(p.sites[0].allocated.bytes, 30);
        assert_eq!(p.sites[0].frames, vec![0x401000, 0x401234]);
        assert_eq!(p.mappings.len(), 1);
        assert_eq!(p.mappings[0].path, "/usr/bin/prog");
        assert!(Profile::parse("nope").is_err());
    }
}
