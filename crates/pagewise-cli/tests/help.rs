//! The help texts are for users: they name no issue, seed or session (the
//! project's internal history), in any command.

use std::process::Command;

#[test]
fn help_texts_name_no_internal_reference() {
    let exe = env!("CARGO_BIN_EXE_pagewise");
    for args in [&["--help"][..], &["run", "--help"], &["bench", "--help"]] {
        let o = Command::new(exe).args(args).output().unwrap();
        assert!(o.status.success(), "pagewise {args:?}");
        let text = String::from_utf8_lossy(&o.stdout).to_lowercase();
        assert!(text.len() > 100, "pagewise {args:?}: {text}");
        for word in ["issue", "seed", "session"] {
            assert!(
                !text.contains(word),
                "`pagewise {}` says {word:?}:\n{text}",
                args.join(" ")
            );
        }
    }
}
