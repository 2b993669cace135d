//! What a user reads names nothing the user cannot see: no issue of the
//! project's tracker ("issue 11", "issue-11"), no background document
//! ("seed 000", "shared/seeds/", "shared/reference/"), no work session. The
//! README, the changelog, everything under docs/, the C header, the
//! crates' manifests and their sources (doc comments, help texts and
//! messages are all in `src/`) are scanned; references to other projects'
//! trackers ("jemalloc #1398") are not matched.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The files under `dir` whose name ends with one of `exts`.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, exts, out);
        } else if exts.iter().any(|e| path.to_string_lossy().ends_with(e)) {
            out.push(path);
        }
    }
}

/// The user-facing files.
fn user_facing() -> Vec<PathBuf> {
    let root = root();
    let mut out = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    files(&root.join("docs"), &[".md"], &mut out);
    files(&root.join("include"), &[".h"], &mut out);
    for krate in std::fs::read_dir(root.join("crates")).unwrap() {
        let krate = krate.unwrap().path();
        if krate.join("Cargo.toml").is_file() {
            out.push(krate.join("Cargo.toml"));
            if krate.join("src").is_dir() {
                files(&krate.join("src"), &[".rs", ".md"], &mut out);
            }
        }
    }
    out
}

/// The internal names in `line` (lowercased): "issue" followed by a
/// number (after a space, a hyphen, a '#' or nothing), "seed 0..."
/// (the background documents are numbered 000, 001, ...), the shared
/// folders, and work sessions.
fn internal_names(line: &str) -> Vec<&'static str> {
    let l = line.to_lowercase();
    let mut found = Vec::new();
    for (at, _) in l.match_indices("issue") {
        let rest = l[at + "issue".len()..].trim_start_matches([' ', '-', '#']);
        if rest.starts_with(|c: char| c.is_ascii_digit()) {
            found.push("an issue number");
        }
    }
    for (needle, what) in [
        ("seed 0", "a seed"),
        ("seeds/", "the seeds folder"),
        ("shared/seeds", "the seeds folder"),
        ("shared/reference", "the reference notes"),
        ("session", "a session"),
    ] {
        if l.contains(needle) {
            found.push(what);
        }
    }
    found
}

#[test]
fn the_scan_finds_each_kind_of_internal_name() {
    for bad in [
        "BEFORE/AFTER the issue-11 fixes",
        "see Issue 12",
        "issue #5",
        "as in seed 000's reproducer",
        "shared/seeds/003.md",
        "See `shared/reference/anchors.md`",
        "found in this session",
        "--json issue11-after.json",
    ] {
        assert!(!internal_names(bad).is_empty(), "{bad:?} passes");
    }
    for good in [
        "jemalloc #1398, #2688",
        "its issues 37 and 91",
        "--seed 1",
        "a fixed seed",
        "the issue is the kernel's mapping limit",
    ] {
        assert!(internal_names(good).is_empty(), "{good:?} is refused");
    }
}

#[test]
fn no_user_facing_file_names_an_issue_a_seed_or_a_session() {
    let files = user_facing();
    assert!(files.len() > 50, "found the files: {}", files.len());
    let mut hits = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for what in internal_names(line) {
                let shown = file.strip_prefix(root()).unwrap_or(file).display();
                hits.push(format!("{shown}:{}: {what}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "a user reads these; say what is meant instead (history goes in git):\n{}",
        hits.join("\n")
    );
}
