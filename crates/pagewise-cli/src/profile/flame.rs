//! Collapsed stacks (`frame;frame;frame bytes`, outermost first, one line
//! per stack: the flamegraph format) and flamegraph SVGs drawn from them
//! with `inferno` (the Rust port of Brendan Gregg's flamegraph.pl).

use super::symbols::Symbolizer;
use super::{Figures, Profile, Site};

/// Which figure of each site a flamegraph shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Live at the peak of the process's committed memory.
    Peak,
    /// Live when the profile was written (at exit: the leaks).
    Live,
    /// Allocated over the process's life.
    Allocated,
}

impl View {
    pub fn of(self, s: &Site) -> Figures {
        match self {
            View::Peak => s.peak,
            View::Live => s.live,
            View::Allocated => s.allocated,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            View::Peak => "bytes in use at the peak",
            View::Live => "bytes still in use at exit (leaks)",
            View::Allocated => "bytes allocated",
        }
    }
}

/// The collapsed stacks of `view`, heaviest first (sites of 0 bytes left
/// out; stacks that symbolize alike are merged).
pub fn collapsed(p: &Profile, sym: &mut Symbolizer<'_>, view: View) -> Vec<String> {
    let mut merged: Vec<(String, u64)> = Vec::new();
    for s in &p.sites {
        let bytes = view.of(s).bytes;
        if bytes == 0 {
            continue;
        }
        let stack = sym.stack(&s.frames);
        let mut names: Vec<String> = stack.iter().map(|f| f.function.replace(';', ":")).collect();
        if names.is_empty() {
            names.push("[unknown]".into());
        }
        let key = names.join(";");
        match merged.iter_mut().find(|(k, _)| *k == key) {
            Some((_, b)) => *b += bytes,
            None => merged.push((key, bytes)),
        }
    }
    merged.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    merged
        .into_iter()
        .map(|(k, b)| format!("{k} {b}"))
        .collect()
}

/// Draws the collapsed stacks `lines` as a flamegraph SVG (nothing is
/// written for no stacks: there is nothing to draw).
pub fn svg(lines: &[String], title: &str, out: &std::path::Path) -> Result<(), String> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = "bytes".to_string();
    opts.colors =
        inferno::flamegraph::color::Palette::Multi(inferno::flamegraph::color::MultiPalette::Rust);
    let file = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let lines: Vec<&str> = if lines.is_empty() {
        vec!["[no samples] 0"]
    } else {
        lines.iter().map(|s| s.as_str()).collect()
    };
    inferno::flamegraph::from_lines(&mut opts, lines, std::io::BufWriter::new(file))
        .map_err(|e| e.to_string())
}
