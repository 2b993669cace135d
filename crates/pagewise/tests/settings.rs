//! No setting fails silently: a misspelled `PAGEWISE_*` variable, an
//! unknown `PAGEWISE_CONF` key, a malformed value of any variable (the
//! profiler's and the guard pages' included) and the first allocation the
//! limit refuses each print one line on stderr, naming it and what is
//! accepted, once per process however often the settings are read; the
//! documented boolean spellings are taken without a word.
//!
//! Each case re-executes this test binary with the variables set; the
//! child reads the settings several times (the configuration, the
//! profiler's and the guard pages' rates, a second `Config::from_env`) and
//! the parent compares its stderr line for line. Cost: nine short child
//! processes.

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;

const CHILD: &str = "PAGEWISE_TEST_SETTINGS_CHILD";

/// Runs in the child only: reads every setting twice over, then does what
/// the mode asks, and prints what it saw on stdout.
#[test]
fn child_entry() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    for _ in 0..2 {
        let _ = pagewise::Config::from_env();
        let _ = pagewise::profile::sample_bytes();
        let _ = pagewise::guard::sample_rate();
        let _ = pagewise::stats();
    }
    let c = pagewise::thread::config();
    println!(
        "settings: background={} mesh={} decay_ms={}",
        c.background as u8,
        pagewise::options::get("mesh").unwrap(),
        c.decay_ms
    );
    if mode == "limit" {
        // Refused twice: said once.
        for _ in 0..2 {
            let mut v: Vec<u8> = Vec::new();
            assert!(
                v.try_reserve_exact(80 << 20).is_err(),
                "80 MiB under a 64 MiB limit"
            );
        }
        let small = vec![1u8; 1 << 20];
        println!("settings: limit refused, 1 MiB fine ({})", small.len());
    }
}

/// The child's lines from pagewise on stderr, and its stdout.
fn run_child(mode: &str, vars: &[(&str, &str)]) -> (Vec<String>, String) {
    let mut cmd = reexec::this_binary();
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, mode);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PAGEWISE_") && k != "PAGEWISE_TEST_RUNNER" {
            cmd.env_remove(k);
        }
    }
    cmd.env(CHILD, mode);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let lines = stderr
        .lines()
        .filter(|l| l.starts_with("pagewise"))
        .map(str::to_owned)
        .collect();
    (lines, stdout)
}

/// The list of known variables that ends an unknown variable's line.
const KNOWN: &str = "known: PAGEWISE_CONF, PAGEWISE_DECAY_MS, PAGEWISE_RETAIN_MAX, \
PAGEWISE_LIMIT, PAGEWISE_PURGE, PAGEWISE_BACKGROUND, PAGEWISE_RESERVE, PAGEWISE_MESH, PAGEWISE_THP, \
PAGEWISE_STATS, PAGEWISE_STATS_FILE, PAGEWISE_STATS_SIGNAL, PAGEWISE_STATS_INTERVAL_MS, \
PAGEWISE_PROF, PAGEWISE_PROF_SAMPLE, PAGEWISE_PROF_FILE, PAGEWISE_GUARD_SAMPLE, \
PAGEWISE_GUARD_SLOTS, PAGEWISE_SAMPLE_FILE, PAGEWISE_SAMPLE_MS, PAGEWISE_SAMPLE_PARENT, \
PAGEWISE_LIB, PAGEWISE_OS_PAGE, PAGEWISE_PERTURB";

const BOOLS: &str = "1, true, yes or on; 0, false, no or off";

#[test]
fn a_misspelled_variable_is_named_once_with_the_closest_and_every_known_one() {
    let (lines, _) = run_child("plain", &[("PAGEWISE_DECAYMS", "5")]);
    assert_eq!(
        lines,
        [format!(
            "pagewise: ignoring unknown variable PAGEWISE_DECAYMS (did you mean PAGEWISE_DECAY_MS? {KNOWN})"
        )]
    );
    // A name far from every known one: no guess.
    let (lines, _) = run_child("plain", &[("PAGEWISE_COLOUR", "blue")]);
    assert_eq!(
        lines,
        [format!(
            "pagewise: ignoring unknown variable PAGEWISE_COLOUR ({KNOWN})"
        )]
    );
}

#[test]
fn an_unknown_conf_key_lists_every_key_and_mesh_is_one() {
    let (lines, _) = run_child("plain", &[("PAGEWISE_CONF", "colour:blue,decay_ms:250")]);
    assert_eq!(
        lines,
        [
            "pagewise: ignoring unknown setting colour in PAGEWISE_CONF \
          (known: decay_ms, retain_max, limit, purge, background, reserve, mesh, thp)"
        ]
    );
    let (lines, stdout) = run_child("plain", &[("PAGEWISE_CONF", "mesh:on,decay_ms:250")]);
    assert_eq!(lines, Vec::<String>::new());
    #[cfg(target_os = "linux")]
    assert!(stdout.contains("mesh=1 decay_ms=250"), "{stdout}");
}

#[test]
fn the_profilers_and_guard_pages_malformed_values_are_said_once() {
    let (lines, _) = run_child(
        "plain",
        &[
            ("PAGEWISE_PROF", "maybe"),
            ("PAGEWISE_PROF_SAMPLE", "lots"),
            ("PAGEWISE_GUARD_SAMPLE", "often"),
            ("PAGEWISE_GUARD_SLOTS", "0"),
        ],
    );
    assert_eq!(
        lines,
        [
            format!("pagewise: ignoring malformed PAGEWISE_PROF=maybe (expected {BOOLS})"),
            "pagewise: ignoring malformed PAGEWISE_PROF_SAMPLE=lots (expected a size such as 512K, 512KiB or 1M (0: off))".to_owned(),
            "pagewise: ignoring malformed PAGEWISE_GUARD_SAMPLE=often (expected a count such as 1000 (0: off))".to_owned(),
            "pagewise: ignoring malformed PAGEWISE_GUARD_SLOTS=0 (expected a count from 1 to 16384)".to_owned(),
        ]
    );
}

#[test]
fn the_reports_malformed_values_are_said_once() {
    let (lines, _) = run_child(
        "plain",
        &[
            ("PAGEWISE_STATS", "maybe"),
            ("PAGEWISE_STATS_SIGNAL", "SIGKILL"),
            ("PAGEWISE_STATS_INTERVAL_MS", "0"),
        ],
    );
    assert_eq!(
        lines,
        [
            format!("pagewise: ignoring malformed PAGEWISE_STATS=maybe (expected {BOOLS})"),
            "pagewise: ignoring malformed PAGEWISE_STATS_SIGNAL=SIGKILL (expected SIGUSR1, SIGUSR2, SIGHUP or a real-time signal number)".to_owned(),
            "pagewise: ignoring malformed PAGEWISE_STATS_INTERVAL_MS=0 (expected milliseconds, more than 0)".to_owned(),
        ]
    );
}

#[test]
fn booleans_take_one_set_of_spellings_everywhere() {
    let (lines, stdout) = run_child(
        "plain",
        &[
            ("PAGEWISE_BACKGROUND", "No"),
            ("PAGEWISE_MESH", "off"),
            ("PAGEWISE_PROF", "false"),
            ("PAGEWISE_STATS", "0"),
        ],
    );
    assert_eq!(lines, Vec::<String>::new());
    assert!(stdout.contains("background=0 mesh=0"), "{stdout}");
    let (lines, stdout) = run_child("plain", &[("PAGEWISE_BACKGROUND", "2")]);
    assert_eq!(
        lines,
        [format!(
            "pagewise: ignoring malformed PAGEWISE_BACKGROUND=2 (expected {BOOLS})"
        )]
    );
    assert!(stdout.contains("background=1"), "the default: {stdout}");
}

#[test]
fn the_limits_first_refusal_is_said_once() {
    let (lines, stdout) = run_child("limit", &[("PAGEWISE_LIMIT", "64M")]);
    assert!(stdout.contains("limit refused, 1 MiB fine"), "{stdout}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(
            "pagewise: an allocation was refused: it would pass PAGEWISE_LIMIT=64.0 MiB ("
        ),
        "{lines:?}"
    );
    assert!(lines[0].contains(" committed against it"), "{lines:?}");
}
