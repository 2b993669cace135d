//! The names `mallctl` answers, and their MIBs.
//!
//! A name is dot-separated components; `#` in a pattern below stands for
//! a decimal index (`arena.4096.purge`). A MIB (`mallctlnametomib`) has one
//! number per component: the entry's place in [`TABLE`] first, then the
//! index where the pattern has `#`, and 0 elsewhere, so that a program can
//! put another index into the MIB and call `mallctlbymib`, as jemalloc
//! allows.

/// What a name reads or does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Name {
    /// `version`: the interface version, and that it is pagewise.
    Version,
    /// `epoch`: a write refreshes the statistics' snapshot.
    Epoch,
    /// `stats.allocated`.
    Allocated,
    /// `stats.active`.
    Active,
    /// `stats.metadata`.
    Metadata,
    /// `stats.resident`.
    Resident,
    /// `stats.mapped`.
    Mapped,
    /// `stats.retained`.
    Retained,
    /// `arenas.narenas`: 1.
    Narenas,
    /// `arenas.page`: the OS page.
    Page,
    /// `arenas.dirty_decay_ms`: pagewise's `decay_ms`, read and written.
    DirtyDecayMs,
    /// `opt.dirty_decay_ms`: pagewise's `decay_ms`, read only.
    OptDirtyDecayMs,
    /// `opt.background_thread`: pagewise's `background`.
    OptBackgroundThread,
    /// `background_thread`: pagewise's `background` (fixed at start).
    BackgroundThread,
    /// `arena.<i>.purge`: gives back everything retained (`pagewise_trim`).
    Purge,
    /// `thread.allocated`: bytes the calling thread allocated.
    ThreadAllocated,
    /// `thread.deallocated`: bytes the calling thread freed.
    ThreadDeallocated,
}

/// Every name, in MIB order.
pub const TABLE: [(&str, Name); 17] = [
    ("version", Name::Version),
    ("epoch", Name::Epoch),
    ("stats.allocated", Name::Allocated),
    ("stats.active", Name::Active),
    ("stats.metadata", Name::Metadata),
    ("stats.resident", Name::Resident),
    ("stats.mapped", Name::Mapped),
    ("stats.retained", Name::Retained),
    ("arenas.narenas", Name::Narenas),
    ("arenas.page", Name::Page),
    ("arenas.dirty_decay_ms", Name::DirtyDecayMs),
    ("opt.dirty_decay_ms", Name::OptDirtyDecayMs),
    ("opt.background_thread", Name::OptBackgroundThread),
    ("background_thread", Name::BackgroundThread),
    ("arena.#.purge", Name::Purge),
    ("thread.allocated", Name::ThreadAllocated),
    ("thread.deallocated", Name::ThreadDeallocated),
];

/// Components in a MIB at most (the longest pattern's).
pub const MAX_DEPTH: usize = 3;

/// A name found: its entry, the index its `#` matched, its components.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    /// Place in [`TABLE`] (the MIB's first number).
    pub entry: usize,
    /// What it reads or does.
    pub name: Name,
    /// The index given where the pattern has `#`.
    pub index: Option<usize>,
    /// Components (the MIB's length).
    pub depth: usize,
    /// Which component holds the index.
    pub index_at: usize,
}

/// The entry for `name` (without its NUL), if any.
pub fn lookup(name: &[u8]) -> Option<Found> {
    TABLE
        .iter()
        .enumerate()
        .find_map(|(entry, (pattern, n))| matching(entry, *n, pattern.as_bytes(), name))
}

fn matching(entry: usize, name: Name, pattern: &[u8], text: &[u8]) -> Option<Found> {
    let mut found = Found {
        entry,
        name,
        index: None,
        depth: 0,
        index_at: 0,
    };
    let (mut p, mut t) = (pattern.split(|&b| b == b'.'), text.split(|&b| b == b'.'));
    loop {
        match (p.next(), t.next()) {
            (None, None) => return Some(found),
            (Some(b"#"), Some(c)) => {
                found.index = Some(number(c)?);
                found.index_at = found.depth;
            }
            (Some(a), Some(c)) if a == c => {}
            _ => return None,
        }
        found.depth += 1;
    }
}

/// A decimal index: digits only, as jemalloc reads them.
fn number(c: &[u8]) -> Option<usize> {
    if c.is_empty() || !c.iter().all(u8::is_ascii_digit) {
        return None;
    }
    c.iter().try_fold(0usize, |v, &d| {
        v.checked_mul(10)?.checked_add((d - b'0') as usize)
    })
}

impl Found {
    /// The MIB of this name, in `mib[..depth]`.
    pub fn mib(&self) -> [usize; MAX_DEPTH] {
        let mut mib = [0; MAX_DEPTH];
        mib[0] = self.entry;
        if let Some(i) = self.index {
            mib[self.index_at] = i;
        }
        mib
    }

    /// The name a MIB stands for: its entry, the index where the pattern
    /// has `#`, 0 in every other place, and one number per component.
    pub fn from_mib(mib: &[usize]) -> Option<Found> {
        let (pattern, name) = TABLE.get(*mib.first()?)?;
        let mut found = Found {
            entry: mib[0],
            name: *name,
            index: None,
            depth: 0,
            index_at: 0,
        };
        for (at, component) in pattern.split('.').enumerate() {
            let value = *mib.get(at)?;
            if component == "#" {
                found.index = Some(value);
                found.index_at = at;
            } else if at > 0 && value != 0 {
                return None;
            }
            found.depth += 1;
        }
        (found.depth == mib.len()).then_some(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_indexes_are_found_and_nothing_else() {
        let f = lookup(b"stats.allocated").unwrap();
        assert_eq!((f.name, f.depth, f.index), (Name::Allocated, 2, None));
        let f = lookup(b"arena.4096.purge").unwrap();
        assert_eq!((f.name, f.depth, f.index), (Name::Purge, 3, Some(4096)));
        for unknown in [
            &b"stats"[..],
            b"stats.allocated.x",
            b"stats.allocatedx",
            b"arena.x.purge",
            b"arena..purge",
            b"arena.99999999999999999999999.purge",
            b"opt.junk",
            b"",
        ] {
            assert_eq!(
                lookup(unknown),
                None,
                "{}",
                String::from_utf8_lossy(unknown)
            );
        }
        assert!(TABLE.iter().all(|(p, _)| p.split('.').count() <= MAX_DEPTH));
    }

    #[test]
    fn a_mib_round_trips_and_takes_another_index() {
        let f = lookup(b"arena.0.purge").unwrap();
        let mut mib = f.mib();
        assert_eq!(Found::from_mib(&mib[..f.depth]), Some(f));
        mib[1] = 4096;
        assert_eq!(Found::from_mib(&mib[..3]).unwrap().index, Some(4096));
        assert_eq!(Found::from_mib(&mib[..2]), None, "too short");
        let e = lookup(b"epoch").unwrap();
        assert_eq!(Found::from_mib(&e.mib()[..1]), Some(e));
        assert_eq!(Found::from_mib(&[TABLE.len()]), None);
        let s = lookup(b"stats.active").unwrap().mib();
        assert_eq!(Found::from_mib(&[s[0], 1]), None, "not a child it has");
    }
}
