//! Progress of long operations on stderr (issue 31): a bar when stderr is
//! a terminal and the caller is not printing JSON, nothing otherwise (a
//! pipe, a log file, `--json`, the daemon). Drawn by `indicatif`, at most
//! a few times a second, and cleared when done, so the command's own
//! output is never interleaved with it.

use std::io::IsTerminal;

/// A bar, or nothing.
#[derive(Debug)]
pub struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    /// A bar of `total` steps labelled `what`, shown only when `wanted`
    /// (not `--json`), stderr is a terminal and `total` reaches `min`.
    pub fn new(what: &str, total: u64, min: u64, wanted: bool) -> Self {
        if !wanted || total < min || !std::io::stderr().is_terminal() {
            return Self(None);
        }
        let bar = indicatif::ProgressBar::new(total);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {pos}/{len} {per_sec} eta {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(what.to_owned());
        Self(Some(bar))
    }

    pub fn inc(&self) {
        if let Some(b) = &self.0 {
            b.inc(1);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}
