//! Every environment variable pagewise reads, in one table ([`Variable`]):
//! its name, its default, what it accepts, what it does, and the parser of
//! its value. The policy settings ([`Setting`]), the reports, the profiler,
//! the guard pages, the sampler of `pagewise run` and the testing aids all
//! go through it, and so do the warnings (`warn.rs`): a malformed
//! value, or a `PAGEWISE_*` variable that is not in the table, gets one
//! line on stderr, once per process. The header `include/pagewise.h` and
//! the README list the same variables (`tests/documented_variables.rs`
//! checks it).
//!
//! Rules every variable follows:
//! - an empty value is the same as no value (the default);
//! - booleans are `1`, `true`, `yes` or `on`, and `0`, `false`, `no` or
//!   `off`, in any case ([`parse_bool`]);
//! - sizes are `64M`, `64MB`, `64MiB`, `1.5G` or a number of bytes
//!   ([`parse_size`]);
//! - names that start with `PAGEWISE_TEST_` are left to test harnesses and
//!   are not checked.

use super::parse::{parse_bool, parse_size, parse_u64};
use super::Setting;

/// One environment variable pagewise reads: the table of them all is
/// [`Variable::ALL`].
///
/// ```
/// use pagewise::config::Variable;
/// let v = Variable::from_name(b"PAGEWISE_STATS_INTERVAL_MS").unwrap();
/// assert_eq!(v.name(), "PAGEWISE_STATS_INTERVAL_MS");
/// assert!(v.parse(b"250").is_ok());
/// assert_eq!(v.parse(b"soon").unwrap_err(), v.accepted());
/// assert_eq!(Variable::from_name(b"PAGEWISE_DECAYMS"), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Variable {
    /// `PAGEWISE_CONF`: the policy settings as one `key:value,...` string.
    Conf,
    /// `PAGEWISE_DECAY_MS`: [`Setting::DecayMs`].
    DecayMs,
    /// `PAGEWISE_RETAIN_MAX`: [`Setting::RetainMax`].
    RetainMax,
    /// `PAGEWISE_LIMIT`: [`Setting::Limit`].
    Limit,
    /// `PAGEWISE_PURGE`: [`Setting::Purge`].
    Purge,
    /// `PAGEWISE_BACKGROUND`: [`Setting::Background`].
    Background,
    /// `PAGEWISE_RESERVE`: [`Setting::Reserve`].
    Reserve,
    /// `PAGEWISE_MESH`: [`Setting::Mesh`].
    Mesh,
    /// `PAGEWISE_THP`: [`Setting::Thp`].
    Thp,
    /// `PAGEWISE_STATS`: the text report on stderr at exit.
    Stats,
    /// `PAGEWISE_STATS_FILE`: the JSON report to a file instead.
    StatsFile,
    /// `PAGEWISE_STATS_SIGNAL`: a report when this signal arrives.
    StatsSignal,
    /// `PAGEWISE_STATS_INTERVAL_MS`: a report every so many ms.
    StatsIntervalMs,
    /// `PAGEWISE_PROF`: the sampled heap profiler.
    Prof,
    /// `PAGEWISE_PROF_SAMPLE`: mean bytes between the profiler's samples.
    ProfSample,
    /// `PAGEWISE_PROF_FILE`: where the profile is written.
    ProfFile,
    /// `PAGEWISE_GUARD_SAMPLE`: one allocation in this many is guarded.
    GuardSample,
    /// `PAGEWISE_GUARD_SLOTS`: guarded blocks alive at once.
    GuardSlots,
    /// `PAGEWISE_SAMPLE_FILE`: the samples of `pagewise run --plot`.
    SampleFile,
    /// `PAGEWISE_SAMPLE_MS`: the sampler's period.
    SampleMs,
    /// `PAGEWISE_SAMPLE_PARENT`: sample only a child of this process.
    SampleParent,
    /// `PAGEWISE_LIB`: the library `pagewise run` preloads.
    Lib,
    /// `PAGEWISE_OS_PAGE`: testing aid, a larger OS page.
    OsPage,
    /// `PAGEWISE_PERTURB`: testing aid, the perturbation build's rate.
    Perturb,
}

/// What a variable is for (the sections of the documentation).
///
/// ```
/// use pagewise::config::{Group, Variable};
/// assert_eq!(Variable::Limit.group(), Group::Policy);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// The retention policy ([`super::Config`]; also `PAGEWISE_CONF` keys).
    Policy,
    /// Reports ([`mod@crate::report`]).
    Report,
    /// The heap profiler ([`crate::profile`]).
    Profile,
    /// Sampled guard pages ([`crate::guard`]).
    Guard,
    /// Set or read by the `pagewise run` command.
    Run,
    /// Testing aids.
    Testing,
}

/// A parsed value.
///
/// ```
/// use pagewise::config::{Value, Variable};
/// assert_eq!(Variable::Stats.parse(b"yes"), Ok(Value::Bool(true)));
/// assert_eq!(Variable::ProfSample.parse(b"1M"), Ok(Value::Number(1 << 20)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    /// A boolean.
    Bool(bool),
    /// A number: milliseconds, bytes, a count, a pid or a signal number.
    Number(u64),
    /// A path or a policy value, as given (checked).
    Text(&'a [u8]),
}

/// The text of the boolean spellings (error messages, documentation).
pub const BOOL_ACCEPTED: &str = "1, true, yes or on; 0, false, no or off";

impl Variable {
    /// Every variable, in the order of the documentation.
    ///
    /// ```
    /// use pagewise::config::Variable;
    /// assert!(Variable::ALL.iter().all(|v| v.name().starts_with("PAGEWISE_")));
    /// ```
    pub const ALL: [Variable; 24] = [
        Variable::Conf,
        Variable::DecayMs,
        Variable::RetainMax,
        Variable::Limit,
        Variable::Purge,
        Variable::Background,
        Variable::Reserve,
        Variable::Mesh,
        Variable::Thp,
        Variable::Stats,
        Variable::StatsFile,
        Variable::StatsSignal,
        Variable::StatsIntervalMs,
        Variable::Prof,
        Variable::ProfSample,
        Variable::ProfFile,
        Variable::GuardSample,
        Variable::GuardSlots,
        Variable::SampleFile,
        Variable::SampleMs,
        Variable::SampleParent,
        Variable::Lib,
        Variable::OsPage,
        Variable::Perturb,
    ];

    /// Its name, NUL-terminated (for `getenv`).
    pub(crate) const fn c_name(self) -> &'static [u8] {
        match self {
            Variable::Conf => b"PAGEWISE_CONF\0",
            Variable::DecayMs => b"PAGEWISE_DECAY_MS\0",
            Variable::RetainMax => b"PAGEWISE_RETAIN_MAX\0",
            Variable::Limit => b"PAGEWISE_LIMIT\0",
            Variable::Purge => b"PAGEWISE_PURGE\0",
            Variable::Background => b"PAGEWISE_BACKGROUND\0",
            Variable::Reserve => b"PAGEWISE_RESERVE\0",
            Variable::Mesh => b"PAGEWISE_MESH\0",
            Variable::Thp => b"PAGEWISE_THP\0",
            Variable::Stats => b"PAGEWISE_STATS\0",
            Variable::StatsFile => b"PAGEWISE_STATS_FILE\0",
            Variable::StatsSignal => b"PAGEWISE_STATS_SIGNAL\0",
            Variable::StatsIntervalMs => b"PAGEWISE_STATS_INTERVAL_MS\0",
            Variable::Prof => b"PAGEWISE_PROF\0",
            Variable::ProfSample => b"PAGEWISE_PROF_SAMPLE\0",
            Variable::ProfFile => b"PAGEWISE_PROF_FILE\0",
            Variable::GuardSample => b"PAGEWISE_GUARD_SAMPLE\0",
            Variable::GuardSlots => b"PAGEWISE_GUARD_SLOTS\0",
            Variable::SampleFile => b"PAGEWISE_SAMPLE_FILE\0",
            Variable::SampleMs => b"PAGEWISE_SAMPLE_MS\0",
            Variable::SampleParent => b"PAGEWISE_SAMPLE_PARENT\0",
            Variable::Lib => b"PAGEWISE_LIB\0",
            Variable::OsPage => b"PAGEWISE_OS_PAGE\0",
            Variable::Perturb => b"PAGEWISE_PERTURB\0",
        }
    }

    /// Its name.
    ///
    /// ```
    /// assert_eq!(pagewise::config::Variable::Limit.name(), "PAGEWISE_LIMIT");
    /// ```
    pub fn name(self) -> &'static str {
        let n = self.c_name();
        core::str::from_utf8(&n[..n.len() - 1]).unwrap_or("PAGEWISE_")
    }

    /// The variable called `name`, if pagewise reads one.
    ///
    /// ```
    /// use pagewise::config::Variable;
    /// assert_eq!(Variable::from_name(b"PAGEWISE_MESH"), Some(Variable::Mesh));
    /// ```
    pub fn from_name(name: &[u8]) -> Option<Variable> {
        Variable::ALL
            .into_iter()
            .find(|v| v.name().as_bytes() == name)
    }

    /// The policy setting it sets, if it is one.
    ///
    /// ```
    /// use pagewise::config::{Setting, Variable};
    /// assert_eq!(Variable::DecayMs.setting(), Some(Setting::DecayMs));
    /// assert_eq!(Variable::Stats.setting(), None);
    /// ```
    pub fn setting(self) -> Option<Setting> {
        Setting::ALL.into_iter().find(|s| s.variable() == self)
    }

    /// What it is for.
    ///
    /// ```
    /// use pagewise::config::{Group, Variable};
    /// assert_eq!(Variable::StatsSignal.group(), Group::Report);
    /// ```
    pub const fn group(self) -> Group {
        match self {
            Variable::Conf
            | Variable::DecayMs
            | Variable::RetainMax
            | Variable::Limit
            | Variable::Purge
            | Variable::Background
            | Variable::Reserve
            | Variable::Mesh
            | Variable::Thp => Group::Policy,
            Variable::Stats
            | Variable::StatsFile
            | Variable::StatsSignal
            | Variable::StatsIntervalMs => Group::Report,
            Variable::Prof | Variable::ProfSample | Variable::ProfFile => Group::Profile,
            Variable::GuardSample | Variable::GuardSlots => Group::Guard,
            Variable::SampleFile | Variable::SampleMs | Variable::SampleParent | Variable::Lib => {
                Group::Run
            }
            Variable::OsPage | Variable::Perturb => Group::Testing,
        }
    }

    /// Its default, as documented.
    ///
    /// ```
    /// assert_eq!(pagewise::config::Variable::DecayMs.default(), "1000");
    /// ```
    pub const fn default(self) -> &'static str {
        match self {
            Variable::DecayMs => "1000",
            Variable::Purge => "dontneed",
            Variable::Background => "1",
            Variable::Reserve => "1G",
            Variable::Mesh | Variable::Stats | Variable::Prof => "0",
            Variable::Thp => "auto",
            Variable::ProfSample => "512K",
            Variable::GuardSample => "0 (off)",
            Variable::GuardSlots => "64",
            Variable::SampleMs => "50",
            Variable::OsPage => "the system's",
            Variable::Perturb => "64",
            Variable::Lib => "beside the command",
            Variable::RetainMax | Variable::Limit => "none",
            Variable::Conf
            | Variable::StatsFile
            | Variable::StatsSignal
            | Variable::StatsIntervalMs
            | Variable::ProfFile
            | Variable::SampleFile
            | Variable::SampleParent => "unset",
        }
    }

    /// What a value may be (the text of the warnings).
    ///
    /// ```
    /// assert!(pagewise::config::Variable::Stats.accepted().contains("yes"));
    /// ```
    pub fn accepted(self) -> &'static str {
        if let Some(s) = self.setting() {
            return s.accepted();
        }
        match self {
            Variable::Conf => "key:value entries separated by commas",
            Variable::Stats | Variable::Prof => BOOL_ACCEPTED,
            Variable::StatsFile | Variable::ProfFile | Variable::SampleFile => {
                "a file path (%p: the process id)"
            }
            Variable::StatsSignal => "SIGUSR1, SIGUSR2, SIGHUP or a real-time signal number",
            Variable::StatsIntervalMs | Variable::SampleMs => "milliseconds, more than 0",
            Variable::ProfSample => "a size such as 512K, 512KiB or 1M (0: off)",
            Variable::GuardSample => "a count such as 1000 (0: off)",
            Variable::GuardSlots => "a count from 1 to 16384",
            Variable::SampleParent => "a process id",
            Variable::Lib => "the path of libpagewise.so",
            Variable::OsPage => {
                "a power of two such as 16K or 64K, a multiple of the OS page, at most 64K"
            }
            Variable::Perturb => "a count, at least 8",
            _ => "",
        }
    }

    /// What it does, in one line (the documentation's).
    ///
    /// ```
    /// assert!(!pagewise::config::Variable::GuardSlots.about().is_empty());
    /// ```
    pub const fn about(self) -> &'static str {
        match self {
            Variable::Conf => "the policy settings as one string, decay_ms:500,retain_max:32M",
            Variable::DecayMs => "ms a freed span stays committed before it is purged; -1: never",
            Variable::RetainMax => "ceiling on the committed free bytes the whole process keeps",
            Variable::Limit => "hard limit on committed bytes; an allocation past it fails",
            Variable::Purge => "dontneed (RSS drops at once) or free (MADV_FREE)",
            Variable::Background => "a background thread purges expired memory of idle threads",
            Variable::Reserve => "address space mapped at a time (at least 32M)",
            Variable::Mesh => "mesh sparse pages (Linux)",
            Variable::Thp => "auto, never or always: where the heap asks for 2 MiB huge pages",
            Variable::Stats => "the text report on stderr at exit",
            Variable::StatsFile => "the JSON report to this file at exit instead",
            Variable::StatsSignal => "a report each time this signal arrives",
            Variable::StatsIntervalMs => "a report every N ms",
            Variable::Prof => "sample allocations by call site (heap profile)",
            Variable::ProfSample => "mean bytes between samples",
            Variable::ProfFile => "write the heap profile here at exit and on the report signal",
            Variable::GuardSample => "about one allocation in N (of at most a page) guarded",
            Variable::GuardSlots => "guarded blocks alive at once",
            Variable::SampleFile => "append a sample line every PAGEWISE_SAMPLE_MS (pagewise run)",
            Variable::SampleMs => "the sampler's period",
            Variable::SampleParent => "sample only in a process whose parent is this pid",
            Variable::Lib => "the library pagewise run preloads",
            Variable::OsPage => "testing aid: treat 16K or 64K as the OS page",
            Variable::Perturb => "testing aid: one point in N yields (perturbation build)",
        }
    }

    /// Parses `value` as this variable's value, or says what is accepted.
    /// A policy setting is checked as [`Setting::apply`] checks it and
    /// given back as text.
    ///
    /// ```
    /// use pagewise::config::{Value, Variable};
    /// assert_eq!(Variable::StatsSignal.parse(b"SIGUSR2"), Ok(Value::Number(libc::SIGUSR2 as u64)));
    /// assert!(Variable::StatsSignal.parse(b"SIGKILL").is_err());
    /// assert!(Variable::Reserve.parse(b"1M").is_err());
    /// assert_eq!(Variable::GuardSlots.parse(b"0"), Err(Variable::GuardSlots.accepted()));
    /// ```
    pub fn parse(self, value: &[u8]) -> Result<Value<'_>, &'static str> {
        let refused = self.accepted();
        if let Some(s) = self.setting() {
            let mut scratch = super::Config::DEFAULT;
            return s.apply(&mut scratch, value).map(|()| Value::Text(value));
        }
        let number = |v: Option<u64>| v.map(Value::Number).ok_or(refused);
        match self {
            Variable::Conf => {
                let mut ok = true;
                let mut scratch = super::Config::DEFAULT;
                super::apply_conf(&mut scratch, value, |_| ok = false);
                ok.then_some(Value::Text(value)).ok_or(refused)
            }
            Variable::Stats | Variable::Prof => parse_bool(value).map(Value::Bool).ok_or(refused),
            Variable::StatsFile | Variable::ProfFile | Variable::SampleFile | Variable::Lib => {
                // Room for the pid in place of %p, and the NUL.
                (!value.is_empty() && value.len() < 4000)
                    .then_some(Value::Text(value))
                    .ok_or(refused)
            }
            Variable::StatsSignal => number(parse_signal(value).map(|s| s as u64)),
            Variable::StatsIntervalMs | Variable::SampleMs => {
                number(parse_u64(value).filter(|&ms| ms > 0))
            }
            Variable::ProfSample => number(parse_size(value).map(|v| v.min(1 << 40))),
            Variable::GuardSample => number(parse_u64(value).map(|v| v.min(1 << 40))),
            Variable::GuardSlots => number(parse_u64(value).filter(|v| (1..=16384).contains(v))),
            Variable::SampleParent => number(parse_u64(value)),
            Variable::Perturb => number(parse_u64(value).filter(|&n| n >= 8)),
            Variable::OsPage => number(
                crate::memory::layout::choose_os_page(
                    crate::memory::layout::system_page(),
                    Some(value),
                )
                .ok()
                .map(|p| p as u64),
            ),
            _ => Err(refused),
        }
    }

    /// Its value in the environment, as given: `None` if unset or empty.
    /// Reads with `getenv`: no allocation.
    ///
    /// ```
    /// std::env::set_var("PAGEWISE_PROF_FILE", "");
    /// assert_eq!(pagewise::config::Variable::ProfFile.raw(), None, "empty is unset");
    /// std::env::remove_var("PAGEWISE_PROF_FILE");
    /// ```
    pub fn raw(self) -> Option<&'static [u8]> {
        super::getenv(self.c_name()).filter(|v| !v.is_empty())
    }

    /// Its value in the environment, parsed: `None` if unset or empty, or
    /// malformed (which is then said on stderr, once per process).
    ///
    /// ```
    /// use pagewise::config::{Value, Variable};
    /// std::env::set_var("PAGEWISE_SAMPLE_MS", "20");
    /// assert_eq!(Variable::SampleMs.read(), Some(Value::Number(20)));
    /// std::env::remove_var("PAGEWISE_SAMPLE_MS");
    /// assert_eq!(Variable::SampleMs.read(), None);
    /// ```
    pub fn read(self) -> Option<Value<'static>> {
        let value = self.raw()?;
        match self.parse(value) {
            Ok(v) => Some(v),
            Err(accepted) => {
                super::warn::malformed(self, value, accepted);
                None
            }
        }
    }

    /// [`Variable::read`] of a boolean or number variable, as a number
    /// (`false`/`true` as 0/1); text variables read `None`.
    pub(crate) fn number(self) -> Option<u64> {
        match self.read()? {
            Value::Number(n) => Some(n),
            Value::Bool(b) => Some(b as u64),
            Value::Text(_) => None,
        }
    }

    /// [`Variable::read`] of a path.
    pub(crate) fn text(self) -> Option<&'static [u8]> {
        match self.read()? {
            Value::Text(t) => Some(t),
            _ => None,
        }
    }
}

/// Signals a report may be tied to: those a program sends on purpose and
/// whose default action is to end it (so nothing relies on them otherwise);
/// the real-time signals too (Linux).
fn parse_signal(v: &[u8]) -> Option<libc::c_int> {
    let name = v.strip_prefix(b"SIG").unwrap_or(v);
    let sig = match name {
        b"USR1" => libc::SIGUSR1,
        b"USR2" => libc::SIGUSR2,
        b"HUP" => libc::SIGHUP,
        _ => {
            let n = libc::c_int::try_from(parse_u64(name)?).ok()?;
            #[cfg(target_os = "linux")]
            let realtime = (libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&n);
            #[cfg(not(target_os = "linux"))]
            let realtime = false;
            let allowed = [libc::SIGUSR1, libc::SIGUSR2, libc::SIGHUP].contains(&n);
            if !(realtime || allowed) {
                return None;
            }
            n
        }
    };
    Some(sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_and_number() {
        assert_eq!(parse_signal(b"SIGUSR2"), Some(libc::SIGUSR2));
        assert_eq!(parse_signal(b"USR1"), Some(libc::SIGUSR1));
        assert_eq!(parse_signal(b"HUP"), Some(libc::SIGHUP));
        assert_eq!(parse_signal(b"12"), Some(libc::SIGUSR2));
        assert_eq!(parse_signal(b"SIGKILL"), None);
        assert_eq!(parse_signal(b"9"), None);
        assert_eq!(parse_signal(b"11"), None, "SIGSEGV is the program's");
        assert_eq!(parse_signal(b"99999999999"), None);
        #[cfg(target_os = "linux")]
        assert!(parse_signal(libc::SIGRTMIN().to_string().as_bytes()).is_some());
    }

    #[test]
    fn the_table_is_consistent() {
        for (i, v) in Variable::ALL.iter().enumerate() {
            assert_eq!(Variable::from_name(v.name().as_bytes()), Some(*v));
            assert!(!v.accepted().is_empty(), "{v:?}");
            assert!(!v.about().is_empty(), "{v:?}");
            assert!(
                !v.name().starts_with("PAGEWISE_TEST_"),
                "reserved for harnesses"
            );
            assert_eq!(Variable::ALL.iter().position(|w| w == v), Some(i));
        }
        for s in Setting::ALL {
            assert_eq!(s.variable().setting(), Some(s));
            assert_eq!(s.variable().group(), Group::Policy);
        }
        assert!(Variable::ALL.len() < 40, "one warning bit each (warn.rs)");
    }

    #[test]
    fn every_kind_refuses_nonsense() {
        for v in Variable::ALL {
            if matches!(
                v,
                Variable::StatsFile | Variable::ProfFile | Variable::SampleFile | Variable::Lib
            ) {
                continue; // any path is a path
            }
            assert_eq!(v.parse(b"nonsense!"), Err(v.accepted()), "{v:?}");
        }
    }
}
