//! Parsing settings without allocating (it runs before the allocator is
//! up): numbers, sizes, the `PAGEWISE_*` variables' values, and the
//! `key:value,key:value` form of `PAGEWISE_CONF` and the embedded
//! `pagewise_conf` string.
//!
//! Sizes are a decimal number, optionally with a fraction, and an optional
//! binary suffix: `K`, `M`, `G`, `T`, each alone or followed by `B` or `iB`
//! (`64M`, `64MB`, `64MiB` and `67108864` are the same size; `1.5G` is
//! 1536 MiB). Case does not matter.

use super::{Config, Variable};
use crate::os::source::Purge;
use crate::os::thp::Thp;

/// Parses a decimal integer.
///
/// ```
/// use pagewise::config::parse_u64;
/// assert_eq!(parse_u64(b"1500"), Some(1500));
/// assert_eq!(parse_u64(b"-1"), None);
/// ```
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add((b - b'0') as u64)
    })
}

/// Parses a size: digits, an optional fraction, an optional `K`/`M`/`G`/`T`
/// suffix (binary), optionally followed by `B` or `iB`.
///
/// ```
/// use pagewise::config::parse_size;
/// assert_eq!(parse_size(b"64M"), Some(64 << 20));
/// assert_eq!(parse_size(b"64MB"), Some(64 << 20));
/// assert_eq!(parse_size(b"64MiB"), Some(64 << 20));
/// assert_eq!(parse_size(b"1.5G"), Some(3 << 29));
/// assert_eq!(parse_size(b"12"), Some(12));
/// assert_eq!(parse_size(b"x"), None);
/// ```
pub fn parse_size(s: &[u8]) -> Option<u64> {
    let digits_end = s
        .iter()
        .position(|b| !(b.is_ascii_digit() || *b == b'.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    let shift = match suffix {
        b"" | b"b" | b"B" => 0,
        [k, rest @ ..] => {
            let shift = match k.to_ascii_lowercase() {
                b'k' => 10,
                b'm' => 20,
                b'g' => 30,
                b't' => 40,
                _ => return None,
            };
            match rest {
                b"" | b"b" | b"B" | b"ib" | b"iB" | b"IB" | b"Ib" => shift,
                _ => return None,
            }
        }
    };
    let (whole, fraction) = match number.iter().position(|&b| b == b'.') {
        Some(dot) => (&number[..dot], &number[dot + 1..]),
        None => (number, &b""[..]),
    };
    if whole.is_empty() || (fraction.is_empty() && number.len() > whole.len()) {
        return None;
    }
    let whole = parse_u64(whole)?.checked_mul(1u64 << shift)?;
    if fraction.is_empty() {
        return Some(whole);
    }
    // At most 9 fraction digits, scaled exactly: 0.d1d2... * 2^shift.
    if fraction.len() > 9 {
        return None;
    }
    let f = parse_u64(fraction)?;
    let scale = 10u64.pow(fraction.len() as u32);
    let part = ((f as u128) << shift) / scale as u128;
    whole.checked_add(part as u64)
}

/// Parses a boolean: `1`, `true`, `yes` or `on`, and `0`, `false`, `no`
/// or `off`, in any case: the one set of spellings every boolean setting
/// accepts ([`super::BOOL_ACCEPTED`]).
///
/// ```
/// use pagewise::config::parse_bool;
/// assert_eq!(parse_bool(b"Yes"), Some(true));
/// assert_eq!(parse_bool(b"off"), Some(false));
/// assert_eq!(parse_bool(b"2"), None);
/// ```
pub fn parse_bool(s: &[u8]) -> Option<bool> {
    const TRUE: [&[u8]; 4] = [b"1", b"true", b"yes", b"on"];
    const FALSE: [&[u8]; 4] = [b"0", b"false", b"no", b"off"];
    if TRUE.iter().any(|t| t.eq_ignore_ascii_case(s)) {
        Some(true)
    } else if FALSE.iter().any(|f| f.eq_ignore_ascii_case(s)) {
        Some(false)
    } else {
        None
    }
}

fn parse_purge(s: &[u8]) -> Option<Purge> {
    match s {
        b"dontneed" | b"DONTNEED" => Some(Purge::DontNeed),
        b"free" | b"FREE" => Some(Purge::Free),
        _ => None,
    }
}

fn parse_thp(s: &[u8]) -> Option<Thp> {
    match s {
        b"auto" => Some(Thp::Auto),
        b"never" => Some(Thp::Never),
        b"always" => Some(Thp::Always),
        _ => None,
    }
}

/// A size, or `-1` (and `none`, `unlimited`) for `usize::MAX`.
fn parse_size_or_none(s: &[u8]) -> Option<usize> {
    match s {
        b"-1" | b"none" | b"unlimited" => Some(usize::MAX),
        _ => parse_size(s).and_then(|v| usize::try_from(v).ok()),
    }
}

/// One setting of [`Config`], by its name in `PAGEWISE_CONF` and
/// [`crate::options`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// `decay_ms`, `PAGEWISE_DECAY_MS`: [`Config::decay_ms`].
    DecayMs,
    /// `retain_max`, `PAGEWISE_RETAIN_MAX`: [`Config::retain_max_bytes`].
    RetainMax,
    /// `limit`, `PAGEWISE_LIMIT`: [`Config::limit_bytes`].
    Limit,
    /// `purge`, `PAGEWISE_PURGE`: [`Config::purge`].
    Purge,
    /// `background`, `PAGEWISE_BACKGROUND`: [`Config::background`].
    Background,
    /// `reserve`, `PAGEWISE_RESERVE`: [`Config::reservation_bytes`].
    Reserve,
    /// `mesh`, `PAGEWISE_MESH`: [`Config::mesh`].
    Mesh,
    /// `thp`, `PAGEWISE_THP`: [`Config::thp`].
    Thp,
}

impl Setting {
    /// Every setting, in the order the environment is read.
    pub const ALL: [Setting; 8] = [
        Setting::DecayMs,
        Setting::RetainMax,
        Setting::Limit,
        Setting::Purge,
        Setting::Background,
        Setting::Reserve,
        Setting::Mesh,
        Setting::Thp,
    ];

    /// Its short name (`PAGEWISE_CONF`, [`crate::options`]).
    pub const fn name(self) -> &'static str {
        match self {
            Setting::DecayMs => "decay_ms",
            Setting::RetainMax => "retain_max",
            Setting::Limit => "limit",
            Setting::Purge => "purge",
            Setting::Background => "background",
            Setting::Reserve => "reserve",
            Setting::Mesh => "mesh",
            Setting::Thp => "thp",
        }
    }

    /// Its environment variable.
    ///
    /// ```
    /// use pagewise::config::{Setting, Variable};
    /// assert_eq!(Setting::Limit.variable(), Variable::Limit);
    /// ```
    pub const fn variable(self) -> Variable {
        match self {
            Setting::DecayMs => Variable::DecayMs,
            Setting::RetainMax => Variable::RetainMax,
            Setting::Limit => Variable::Limit,
            Setting::Purge => Variable::Purge,
            Setting::Background => Variable::Background,
            Setting::Reserve => Variable::Reserve,
            Setting::Mesh => Variable::Mesh,
            Setting::Thp => Variable::Thp,
        }
    }

    /// The setting called `name` (its short name).
    ///
    /// ```
    /// use pagewise::config::Setting;
    /// assert_eq!(Setting::from_name(b"retain_max"), Some(Setting::RetainMax));
    /// assert_eq!(Setting::from_name(b"colour"), None);
    /// ```
    pub fn from_name(name: &[u8]) -> Option<Setting> {
        Setting::ALL
            .into_iter()
            .find(|s| s.name().as_bytes() == name)
    }

    /// What a value of this setting may be (the text of error messages).
    pub const fn accepted(self) -> &'static str {
        match self {
            Setting::DecayMs => "milliseconds, or -1 for never",
            Setting::RetainMax => "a size such as 64M, 64MB, 64MiB or 1.5G, or -1 for none",
            Setting::Limit => "a size above 0 such as 512M, 512MiB or 1.5G, or -1 for none",
            Setting::Purge => "dontneed or free",
            Setting::Background => super::BOOL_ACCEPTED,
            Setting::Reserve => "a size of at least 32M (a segment) such as 1G or 256MiB",
            Setting::Mesh => super::BOOL_ACCEPTED,
            Setting::Thp => "auto, never or always",
        }
    }

    /// Sets this field of `c` to `value`, or says what is accepted: a
    /// malformed value, or one that would make pagewise misbehave (a
    /// reservation smaller than a segment, a limit of 0), is refused.
    ///
    /// ```
    /// use pagewise::config::Setting;
    /// let mut c = pagewise::Config::DEFAULT;
    /// Setting::DecayMs.apply(&mut c, b"-1").unwrap();
    /// assert_eq!(c.decay_ms, u64::MAX);
    /// assert!(Setting::Reserve.apply(&mut c, b"0").is_err());
    /// ```
    pub fn apply(self, c: &mut Config, value: &[u8]) -> Result<(), &'static str> {
        let refused = self.accepted();
        match self {
            Setting::DecayMs => {
                c.decay_ms = match value {
                    b"-1" | b"never" => u64::MAX,
                    _ => parse_u64(value).filter(|&v| v < u64::MAX).ok_or(refused)?,
                }
            }
            Setting::RetainMax => c.retain_max_bytes = parse_size_or_none(value).ok_or(refused)?,
            Setting::Limit => {
                c.limit_bytes = parse_size_or_none(value)
                    .filter(|&v| v > 0)
                    .ok_or(refused)?
            }
            Setting::Purge => c.purge = parse_purge(value).ok_or(refused)?,
            Setting::Background => c.background = parse_bool(value).ok_or(refused)?,
            Setting::Mesh => c.mesh = parse_bool(value).ok_or(refused)?,
            Setting::Thp => c.thp = parse_thp(value).ok_or(refused)?,
            Setting::Reserve => {
                c.reservation_bytes = parse_size(value)
                    .and_then(|v| usize::try_from(v).ok())
                    .filter(|&v| (crate::memory::layout::SEGMENT..=1 << 46).contains(&v))
                    .ok_or(refused)?
            }
        }
        Ok(())
    }
}

/// A problem in a `key:value,...` string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfError<'a> {
    /// `key` names no setting.
    Unknown(&'a [u8]),
    /// An entry with no `:`.
    Malformed(&'a [u8]),
    /// The value of a setting was refused; the text says what is accepted.
    Value(Setting, &'a [u8], &'static str),
}

/// Applies a `key:value,key:value` string (`PAGEWISE_CONF`, the embedded
/// `pagewise_conf`) to `c`, entry by entry; a bad entry is reported to
/// `report` and skipped. Spaces around entries are ignored.
///
/// ```
/// use pagewise::config::{apply_conf, ConfError, Setting};
/// let mut c = pagewise::Config::DEFAULT;
/// let mut errors = 0;
/// apply_conf(&mut c, b"decay_ms:500, retain_max:32M,colour:blue", |e| {
///     assert_eq!(e, ConfError::Unknown(b"colour"));
///     errors += 1;
/// });
/// assert_eq!((c.decay_ms, c.retain_max_bytes, errors), (500, 32 << 20, 1));
/// ```
pub fn apply_conf<'a>(c: &mut Config, conf: &'a [u8], mut report: impl FnMut(ConfError<'a>)) {
    for entry in conf.split(|&b| b == b',') {
        let entry = entry.trim_ascii();
        if entry.is_empty() {
            continue;
        }
        let Some(colon) = entry.iter().position(|&b| b == b':') else {
            report(ConfError::Malformed(entry));
            continue;
        };
        let (key, value) = (entry[..colon].trim_ascii(), entry[colon + 1..].trim_ascii());
        match Setting::from_name(key) {
            None => report(ConfError::Unknown(key)),
            Some(s) => {
                if let Err(accepted) = s.apply(c, value) {
                    report(ConfError::Value(s, value, accepted));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_accepted_and_refused() {
        for (text, bytes) in [
            (&b"0"[..], 0u64),
            (b"12", 12),
            (b"12B", 12),
            (b"4k", 4096),
            (b"4KiB", 4096),
            (b"64M", 64 << 20),
            (b"64MB", 64 << 20),
            (b"64MiB", 64 << 20),
            (b"64mib", 64 << 20),
            (b"1G", 1 << 30),
            (b"1.5G", 3 << 29),
            (b"0.25M", 1 << 18),
            (b"2T", 2 << 40),
            (b"1.000000001G", (1 << 30) + 1),
        ] {
            assert_eq!(
                parse_size(text),
                Some(bytes),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
        for text in [
            &b""[..],
            b"M",
            b"x",
            b"-1",
            b"1.",
            b".5G",
            b"1..5G",
            b"1.5.5G",
            b"64Mi",
            b"64MBB",
            b"64 M",
            b"1X",
            b"1.0000000001G",
            b"99999999999999999999999",
            b"20000000000G",
        ] {
            assert_eq!(parse_size(text), None, "{}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn settings_accepted_and_refused() {
        let mut c = Config::DEFAULT;
        Setting::DecayMs.apply(&mut c, b"250").unwrap();
        assert_eq!(c.decay_ms, 250);
        Setting::DecayMs.apply(&mut c, b"-1").unwrap();
        assert_eq!(c.decay_ms, u64::MAX, "-1: never");
        assert!(Setting::DecayMs.apply(&mut c, b"soon").is_err());
        assert!(Setting::DecayMs.apply(&mut c, b"-2").is_err());
        Setting::RetainMax.apply(&mut c, b"-1").unwrap();
        assert_eq!(c.retain_max_bytes, usize::MAX);
        Setting::RetainMax.apply(&mut c, b"0").unwrap();
        assert_eq!(c.retain_max_bytes, 0, "retain nothing is legitimate");
        Setting::Limit.apply(&mut c, b"1.5G").unwrap();
        assert_eq!(c.limit_bytes, 3 << 29);
        assert!(
            Setting::Limit.apply(&mut c, b"0").is_err(),
            "no allocation could succeed"
        );
        Setting::Reserve.apply(&mut c, b"32MiB").unwrap();
        assert_eq!(c.reservation_bytes, 32 << 20);
        for bad in [&b"0"[..], b"1M", b"31M", b"-1", b"100T"] {
            let e = Setting::Reserve.apply(&mut c, bad).unwrap_err();
            assert!(e.contains("at least 32M"), "{e}");
        }
        assert_eq!(
            c.reservation_bytes,
            32 << 20,
            "a refused value changes nothing"
        );
        Setting::Purge.apply(&mut c, b"free").unwrap();
        assert_eq!(c.purge, Purge::Free);
        assert!(Setting::Purge.apply(&mut c, b"later").is_err());
        Setting::Background.apply(&mut c, b"off").unwrap();
        assert!(!c.background);
        assert!(Setting::Background.apply(&mut c, b"maybe").is_err());
        Setting::Thp.apply(&mut c, b"never").unwrap();
        assert_eq!(c.thp, Thp::Never);
        Setting::Thp.apply(&mut c, b"always").unwrap();
        assert_eq!(c.thp, Thp::Always);
        assert!(Setting::Thp.apply(&mut c, b"madvise").is_err());
        assert_eq!(c.thp, Thp::Always, "a refused value changes nothing");
    }

    #[test]
    fn conf_strings() {
        let mut c = Config::DEFAULT;
        let mut errors = Vec::new();
        apply_conf(
            &mut c,
            b"decay_ms:500,retain_max:32M, limit : 1G ,,purge:free,reserve:0,colour:blue,oops",
            |e| errors.push(e),
        );
        assert_eq!(c.decay_ms, 500);
        assert_eq!(c.retain_max_bytes, 32 << 20);
        assert_eq!(c.limit_bytes, 1 << 30);
        assert_eq!(c.purge, Purge::Free);
        assert_eq!(c.reservation_bytes, Config::DEFAULT.reservation_bytes);
        assert_eq!(
            errors,
            [
                ConfError::Value(Setting::Reserve, b"0", Setting::Reserve.accepted()),
                ConfError::Unknown(b"colour"),
                ConfError::Malformed(b"oops"),
            ]
        );
    }
}
