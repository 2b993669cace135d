//! Every environment variable pagewise reads is documented, in the C
//! header, the README and the guide's configuration page, and nothing else
//! is: the list comes from the code's one table
//! (`pagewise::config::Variable::ALL`), so a variable added to the table
//! and not to the documents fails here. A variable the
//! code reads without the table fails too: every `PAGEWISE_*` name in a
//! string literal of the crates' sources must be in the table (or start
//! with `PAGEWISE_TEST_`, the harnesses' prefix).

use pagewise::config::{Setting, Variable};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative)).unwrap()
}

/// The `PAGEWISE_*` words of `text` (`PAGEWISE_` followed by capitals,
/// digits and underscores), each with the character before it.
fn words(text: &str) -> Vec<(char, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    let mut before = ' ';
    while let Some(at) = rest.find("PAGEWISE_") {
        let prev = rest[..at].chars().next_back().unwrap_or(before);
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.push((prev, tail[..end].trim_end_matches('_').to_owned()));
        before = tail[..end].chars().next_back().unwrap_or(' ');
        rest = &tail[end..];
    }
    out
}

/// Misspellings the documents show on purpose, as what gets a warning.
const MISSPELLINGS: [&str; 1] = ["PAGEWISE_DECAYMS"];

fn table() -> BTreeSet<String> {
    Variable::ALL.iter().map(|v| v.name().to_owned()).collect()
}

#[test]
fn every_variable_is_in_the_header_and_the_readme() {
    for (file, text) in [
        ("include/pagewise.h", read("include/pagewise.h")),
        ("README.md", read("README.md")),
        (
            "docs/guide/configuration.md",
            read("docs/guide/configuration.md"),
        ),
    ] {
        let found: BTreeSet<String> = words(&text).into_iter().map(|(_, w)| w).collect();
        for name in table() {
            assert!(found.contains(&name), "{file} does not document {name}");
        }
        for s in Setting::ALL {
            assert!(
                text.contains(s.name()),
                "{file} does not name the PAGEWISE_CONF key {}",
                s.name()
            );
        }
        // Nothing stale: every variable the document names is read.
        for w in found {
            let allowed = table().contains(&w)
                || w == "PAGEWISE"
                || w == "PAGEWISE_TEST"
                || w.starts_with("PAGEWISE_TEST_")
                || w == "PAGEWISE_H"
                || MISSPELLINGS.contains(&w.as_str());
            assert!(
                allowed,
                "{file} documents {w}, which the code does not read"
            );
        }
    }
}

/// The `.rs` files under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_code_reads_no_variable_outside_the_table() {
    let mut files = Vec::new();
    for krate in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = krate.unwrap().path().join("src");
        if src.is_dir() {
            sources(&src, &mut files);
        }
    }
    assert!(files.len() > 20, "found the sources: {files:?}");
    let mut literals = 0;
    for file in files {
        let whole = std::fs::read_to_string(&file).unwrap();
        // The code, without its unit tests and comments (doc examples
        // name misspellings on purpose).
        let code: String = whole
            .split("#[cfg(test)]")
            .next()
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for (prev, name) in words(&code) {
            // A name in a string literal ("...", b"...", c"...") is read
            // or set; one in a comment or an identifier is not.
            if prev != '"' || name == "PAGEWISE" {
                continue; // not a literal, or the bare prefix
            }
            literals += 1;
            assert!(
                table().contains(&name)
                    || name == "PAGEWISE_TEST"
                    || name.starts_with("PAGEWISE_TEST_"),
                "{} reads {name}, which is not in pagewise::config::Variable",
                file.display()
            );
        }
    }
    assert!(literals > 10, "the scan sees the literals ({literals})");
}
