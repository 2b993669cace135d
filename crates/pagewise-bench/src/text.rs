//! Text that fits a terminal: paragraphs wrapped and markdown tables split
//! into column groups, each at most [`WIDTH`] characters wide.

use std::fmt::Write as _;

/// The report's width in characters.
pub const WIDTH: usize = 120;

/// `text` wrapped at `width` characters, line by line: a line that starts
/// with `- ` (a list item) continues indented by two spaces. Words longer
/// than a line stay whole.
pub fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    for line in text.split('\n') {
        let indent = if line.starts_with("- ") { "  " } else { "" };
        let mut current = String::new();
        // Whether `current` holds a word yet (past the indent).
        let mut words = false;
        for word in line.split(' ').filter(|w| !w.is_empty()) {
            let len = current.chars().count();
            if words && len + 1 + word.chars().count() > width {
                out.push_str(&current);
                out.push('\n');
                current = indent.to_string();
            } else if words {
                current.push(' ');
            }
            current.push_str(word);
            words = true;
        }
        out.push_str(&current);
        out.push('\n');
    }
    out.pop();
    out
}

/// A markdown table with aligned columns (the first `keys` left-aligned,
/// the others right-aligned). With a `width`, a table wider than it is
/// split into tables of fewer columns, each repeating the `keys` columns.
pub fn table(
    out: &mut String,
    head: &[&str],
    rows: &[Vec<String>],
    keys: usize,
    width: Option<usize>,
) {
    let n = head.len();
    let cell = |r: &Vec<String>, i: usize| r.get(i).cloned().unwrap_or_default();
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, wi) in w.iter_mut().enumerate() {
            *wi = (*wi).max(cell(r, i).chars().count());
        }
    }
    // Each column takes its width plus three (` x |`), the line one more.
    let cost = |cols: &[usize]| 1 + cols.iter().map(|&i| w[i] + 3).sum::<usize>();
    let keys = keys.min(n);
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = (0..keys).collect();
    for i in keys..n {
        let mut with = current.clone();
        with.push(i);
        if width.is_some_and(|max| cost(&with) > max) && current.len() > keys {
            groups.push(current);
            current = (0..keys).collect();
        }
        current.push(i);
    }
    groups.push(current);
    for (g, cols) in groups.iter().enumerate() {
        if g > 0 {
            out.push('\n');
        }
        let line = |out: &mut String, cells: &[String]| {
            out.push('|');
            for (k, &i) in cols.iter().enumerate() {
                let c = &cells[k];
                let pad = " ".repeat(w[i] - c.chars().count());
                if i < keys {
                    let _ = write!(out, " {c}{pad} |");
                } else {
                    let _ = write!(out, " {pad}{c} |");
                }
            }
            out.push('\n');
        };
        let h: Vec<String> = cols.iter().map(|&i| head[i].to_string()).collect();
        line(out, &h);
        out.push('|');
        for &i in cols {
            if i < keys {
                let _ = write!(out, "{}|", "-".repeat(w[i] + 2));
            } else {
                let _ = write!(out, "{}:|", "-".repeat(w[i] + 1));
            }
        }
        out.push('\n');
        for r in rows {
            let cells: Vec<String> = cols.iter().map(|&i| cell(r, i)).collect();
            line(out, &cells);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_paragraphs_and_indents_list_items() {
        assert_eq!(wrap("one two three four", 9), "one two\nthree\nfour");
        assert_eq!(wrap("- aaa bbb ccc", 8), "- aaa\n  bbb\n  ccc");
        assert_eq!(wrap("a\n\nb", 10), "a\n\nb");
        assert_eq!(
            wrap("averyveryverylongword x", 5),
            "averyveryverylongword\nx"
        );
    }

    #[test]
    fn a_wide_table_is_split_repeating_its_key_columns() {
        let head = ["key", "aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc"];
        let rows = vec![vec!["k".to_string(), "1".into(), "2".into(), "3".into()]];
        let mut one = String::new();
        table(&mut one, &head, &rows, 1, None);
        assert_eq!(one.lines().count(), 3);
        let mut split = String::new();
        table(&mut split, &head, &rows, 1, Some(35));
        assert!(split.lines().all(|l| l.chars().count() <= 35), "{split}");
        assert_eq!(split.matches("| key").count(), 2, "{split}");
        assert!(
            split.contains("cccccccccc") && split.contains("| k   |"),
            "{split}"
        );
    }
}
