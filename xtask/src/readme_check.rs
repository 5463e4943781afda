//! `cargo xtask readme-check`: fails when a figure or list the README
//! states has drifted from what the repository says. Reads files only (no
//! build, no network), so `cargo xtask test` runs it first.
//!
//! What it compares, each from its one source of truth:
//! - "Rust X or newer" with `rust-version` in the workspace Cargo.toml;
//! - every "N hostile turns" / "N probes" with the `probe!(` entries of
//!   `tests/src/redteam.rs`;
//! - every "N ignored" with the `#[ignore` attributes in the workspace;
//! - the test-binary list (between `<!-- readme-check:test-binaries -->`
//!   markers) with `tests/tests/*.rs`;
//! - the commands table (rows "| `supervise NAME …") with the variants of
//!   `cli::Command` (clap derives the subcommand names `supervise --help`
//!   lists from them: `PromptHeader` is `prompt-header`);
//! - the `cargo xtask …` line of the layout with xtask's own tasks;
//! - links: none leaves the repository (`../`), every relative one exists.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, bail};

pub fn readme_check(root: &Path) -> Result<()> {
    let read = |rel: &str| {
        std::fs::read_to_string(root.join(rel)).with_context(|| format!("reading {rel}"))
    };
    let readme = read("README.md")?;
    let mut problems = Vec::new();

    if !(readme.contains(CI_TIME_BEGIN) && readme.contains(CI_TIME_END)) {
        problems.push(format!(
            "README must hold the {CI_TIME_BEGIN} … {CI_TIME_END} markers (`cargo xtask test` writes its duration there)"
        ));
    }

    let rust = rust_version(&read("Cargo.toml")?).context("no rust-version in Cargo.toml")?;
    if !readme.contains(&format!("Rust {rust} or newer")) {
        problems.push(format!(
            "README must say \"Rust {rust} or newer\" (workspace rust-version)"
        ));
    }

    let probes = count_probes(&read("tests/src/redteam.rs")?);
    let stated = numbers_before(&readme, &["hostile", "probes"]);
    if stated.is_empty() {
        problems.push(format!(
            "README states no red-team probe count (tests/src/redteam.rs has {probes})"
        ));
    }
    for (line, n) in stated.into_iter().filter(|(_, n)| *n != probes) {
        problems.push(format!(
            "README line {line} says {n} probes; tests/src/redteam.rs has {probes}"
        ));
    }

    let mut sources = String::new();
    for dir in ["policy", "oci", "supervisor", "shim", "tests", "xtask"] {
        crate::collect_rs(&root.join(dir), &mut sources)?;
    }
    let ignored = sources
        .lines()
        .filter(|l| l.trim_start().starts_with("#[ignore"))
        .count();
    for (line, n) in numbers_before(&readme, &["ignored", "ignored,", "ignored)"]) {
        if n != ignored {
            problems.push(format!(
                "README line {line} says {n} ignored; the workspace has {ignored} #[ignore] tests"
            ));
        }
    }

    let mut binaries = BTreeSet::new();
    for e in std::fs::read_dir(root.join("tests/tests")).context("tests/tests")? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".rs") {
            binaries.insert(stem.to_owned());
        }
    }
    match marked(&readme, "test-binaries") {
        None => problems.push("README has no <!-- readme-check:test-binaries --> list".into()),
        Some(list) => compare(
            &mut problems,
            "test binaries (tests/tests/*.rs)",
            &backticked(list),
            &binaries,
        ),
    }

    let commands = cli_commands(&read("supervisor/src/cli/mod.rs")?);
    let table: BTreeSet<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `supervise "))
        .filter_map(|l| l.split([' ', '`']).next())
        .map(str::to_owned)
        .collect();
    compare(
        &mut problems,
        "commands table (supervisor/src/cli/mod.rs Command)",
        &table,
        &commands,
    );

    let tasks = xtask_tasks(&read("xtask/src/main.rs")?);
    let line = readme
        .lines()
        .find(|l| l.starts_with("xtask/") && l.contains("`cargo xtask "));
    match line {
        None => problems.push("README layout has no \"xtask/ `cargo xtask …`\" line".into()),
        Some(l) => {
            let listed: BTreeSet<String> = l
                .split("`cargo xtask ")
                .nth(1)
                .and_then(|s| s.split('`').next())
                .unwrap_or_default()
                .split('|')
                .filter_map(|t| t.split_whitespace().next())
                .map(str::to_owned)
                .collect();
            compare(
                &mut problems,
                "xtask tasks (xtask/src/main.rs)",
                &listed,
                &tasks,
            );
        }
    }

    for (line, target) in links(&readme) {
        if target.contains("../") {
            problems.push(format!(
                "README line {line} links outside the repository: {target}"
            ));
        } else if !root
            .join(target.split('#').next().unwrap_or_default())
            .exists()
        {
            problems.push(format!(
                "README line {line} links to a missing file: {target}"
            ));
        }
    }
    for (i, l) in readme.lines().enumerate() {
        if l.contains("`../") {
            problems.push(format!(
                "README line {} names a path outside the repository",
                i + 1
            ));
        }
    }

    if !problems.is_empty() {
        bail!(
            "README.md has drifted from the repository:\n  {}",
            problems.join("\n  ")
        );
    }
    eprintln!(
        "xtask: README figures match (Rust {rust}, {probes} probes, {} test binaries, {} commands, {} xtask tasks)",
        binaries.len(),
        commands.len(),
        tasks.len()
    );
    Ok(())
}

fn compare(
    problems: &mut Vec<String>,
    what: &str,
    readme: &BTreeSet<String>,
    repo: &BTreeSet<String>,
) {
    let missing: Vec<&str> = repo.difference(readme).map(String::as_str).collect();
    let extra: Vec<&str> = readme.difference(repo).map(String::as_str).collect();
    if !missing.is_empty() || !extra.is_empty() {
        problems.push(format!(
            "{what}: missing from README [{}], in README only [{}]",
            missing.join(", "),
            extra.join(", ")
        ));
    }
}

fn rust_version(cargo_toml: &str) -> Option<String> {
    cargo_toml
        .lines()
        .find_map(|l| l.trim().strip_prefix("rust-version"))
        .and_then(|v| v.split('"').nth(1))
        .map(str::to_owned)
}

fn count_probes(redteam: &str) -> usize {
    redteam
        .lines()
        .filter(|l| l.trim_start().starts_with("probe!("))
        .count()
}

/// (line number, N) for every "N WORD" where WORD is one of `words`.
fn numbers_before(text: &str, words: &[&str]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        for pair in tokens.windows(2) {
            if words.contains(&pair[1]) {
                if let Ok(n) = pair[0].trim_start_matches('(').parse::<usize>() {
                    out.push((i + 1, n));
                }
            }
        }
    }
    out
}

/// The text between `<!-- readme-check:NAME -->` and `<!-- /readme-check:NAME -->`.
fn marked<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = format!("<!-- readme-check:{name} -->");
    let end = format!("<!-- /readme-check:{name} -->");
    let from = text.find(&start)? + start.len();
    let to = text[from..].find(&end)? + from;
    Some(&text[from..to])
}

fn backticked(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Subcommand names of `cli::Command`: its tuple variants, kebab-cased as
/// clap derives them.
fn cli_commands(cli: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Some(start) = cli.find("pub enum Command {") else {
        return out;
    };
    for line in cli[start..].lines().skip(1) {
        if line.starts_with('}') {
            break;
        }
        let Some(rest) = line.strip_prefix("    ") else {
            continue;
        };
        if rest.starts_with(char::is_uppercase) {
            let name = rest.split(['(', ',']).next().unwrap_or_default();
            out.insert(kebab(name));
        }
    }
    out
}

fn kebab(camel: &str) -> String {
    let mut s = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            s.push('-');
        }
        s.push(c.to_ascii_lowercase());
    }
    s
}

/// xtask's tasks: the `Some("NAME") =>` arms of its `main`.
fn xtask_tasks(main_rs: &str) -> BTreeSet<String> {
    let body = main_rs
        .split("fn main()")
        .nth(1)
        .and_then(|s| s.split("\n}\n").next())
        .unwrap_or_default();
    body.lines()
        .filter_map(|l| l.trim_start().strip_prefix("Some(\""))
        .filter_map(|l| l.split('"').next())
        .map(str::to_owned)
        .collect()
}

/// (line number, target) of every markdown link that is not a URL or an
/// anchor in the same file.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        for part in line.split("](").skip(1) {
            let Some(target) = part.split(')').next() else {
                continue;
            };
            if !(target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
                || target.starts_with('#'))
            {
                out.push((i + 1, target.to_owned()));
            }
        }
    }
    out
}

/// The markers around the line `cargo xtask test` writes with its own
/// duration when it passes.
const CI_TIME_BEGIN: &str = "<!-- readme-check:ci-time -->";
const CI_TIME_END: &str = "<!-- /readme-check:ci-time -->";

/// Writes the measured duration of a passing `cargo xtask test` into the
/// README between the ci-time markers (with the commit and the cores), so
/// the figure is the run's own, never copied by hand.
pub fn record_ci_time(root: &Path, took: std::time::Duration) -> Result<()> {
    let path = root.join("README.md");
    let readme = std::fs::read_to_string(&path).context("reading README.md")?;
    let (Some(b), Some(e)) = (readme.find(CI_TIME_BEGIN), readme.find(CI_TIME_END)) else {
        anyhow::bail!("README.md has no {CI_TIME_BEGIN} … {CI_TIME_END} markers");
    };
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let line = format!(
        "{CI_TIME_BEGIN}\nLast passing `cargo xtask test`: **{} min {} s** on {cores} cores \
         (commit `{commit}`, {date}; written by the run itself, build and apt \
         installs included).\n",
        took.as_secs() / 60,
        took.as_secs() % 60
    );
    let updated = format!("{}{line}{}", &readme[..b], &readme[e..]);
    std::fs::write(&path, updated).context("writing README.md")?;
    eprintln!("xtask: README.md: CI time recorded");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers() {
        assert_eq!(kebab("PromptHeader"), "prompt-header");
        assert_eq!(
            numbers_before(
                "runs 132 hostile turns; (2 ignored)",
                &["hostile", "ignored)"]
            ),
            vec![(1, 132), (1, 2)]
        );
        let cli = "pub enum Command {\n    /// doc\n    Run(RunArgs),\n    #[command(subcommand)]\n    Session(S),\n}\n";
        assert_eq!(
            cli_commands(cli).into_iter().collect::<Vec<_>>(),
            ["run", "session"]
        );
        assert_eq!(
            links("see [a](docs/DESIGN.md) and [b](https://x) [c](#y)"),
            vec![(1, "docs/DESIGN.md".to_owned())]
        );
        assert_eq!(
            marked(
                "x <!-- readme-check:t --> `a` `b` <!-- /readme-check:t -->",
                "t"
            )
            .map(backticked)
            .unwrap_or_default()
            .len(),
            2
        );
    }
}
