//! `supervise report --session S --html OUT.html` (issue 30): one
//! self-contained page a reviewer opens in a browser — no script, no
//! network (a Content-Security-Policy forbids every fetch), every string
//! the agent could choose escaped.
//!
//! At the top: whether both ledgers verify, and the newest kept checkpoint
//! (its signature checked when `--pubkey` is given) with whether today's
//! ledgers still match it. Then a timeline of the turns coloured by
//! outcome, and one section per turn: command, exit, duration, committed
//! outputs with their hashes, violations with hints, network flows.
//!
//! A session whose ledgers do not verify still gets a page — saying so in
//! red, listing nothing it cannot vouch for — and the command exits with
//! the integrity status, so a script notices.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;

use super::audit::{SessionSel, open_session};
use super::to_json;
use crate::error::{Result, SupervisorError};
use crate::store::ledger::LedgerKind;
use crate::store::record::{Event, EvidenceEntry, ExecEntry, read_all};
use crate::store::session::Session;
use crate::store::status::TurnStatus;
use crate::store::transparency as tp;
use crate::turn::outcome::Outcome;

#[derive(Debug, Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub sel: SessionSel,
    /// Write the page to FILE (replaced atomically).
    #[arg(long, value_name = "FILE")]
    pub html: PathBuf,
    /// Check the newest checkpoint's signature with this verifier key.
    #[arg(long, value_name = "KEY")]
    pub pubkey: Option<PathBuf>,
}

/// What the page says about the ledgers' integrity.
struct Integrity {
    /// `Ok(entries of exec, evidence)` or the error that failed them.
    ledgers: std::result::Result<(u64, u64), SupervisorError>,
    checkpoint: Option<CheckpointLine>,
}

struct CheckpointLine {
    path: PathBuf,
    size: u64,
    root: String,
    /// `Some(Ok(by))` checked with --pubkey, `Some(Err)` failed, `None`
    /// not checked.
    signature: Option<std::result::Result<String, String>>,
    /// Whether today's ledgers hold exactly what it signed, then more.
    matches: std::result::Result<u64, String>,
}

/// One turn as the page shows it.
struct TurnView {
    number: u64,
    evidence: EvidenceEntry,
    exec: Option<ExecEntry>,
}

pub fn report_cmd(a: &ReportArgs) -> Result<Outcome> {
    let session = open_session(&a.sel)?;
    if a.html.as_os_str().is_empty() || a.html.is_dir() {
        return Err(SupervisorError::invalid(
            "--html",
            format!("`{}` is not a file path", a.html.display()),
        ));
    }
    let integrity = integrity(&session, a.pubkey.as_deref())?;
    let turns = match &integrity.ledgers {
        Ok(_) => turns(&session)?,
        Err(_) => Vec::new(),
    };
    let page = render(&session, &integrity, &turns);
    crate::fsx::write_atomic(&a.html, page.as_bytes())?;
    let failed = integrity.ledgers.as_ref().err();
    let mut out = Outcome::ok(if a.sel.common.json {
        #[derive(serde::Serialize)]
        struct Written<'a> {
            session_id: &'a str,
            html: &'a Path,
            turns: usize,
            verified: bool,
            bytes: usize,
        }
        format!(
            "{}\n",
            to_json(&Written {
                session_id: session.id.as_str(),
                html: &a.html,
                turns: turns.len(),
                verified: failed.is_none(),
                bytes: page.len(),
            })
        )
    } else {
        format!(
            "wrote {} ({} turns, {} bytes)\n",
            a.html.display(),
            turns.len(),
            page.len()
        )
    });
    if let Some(e) = failed {
        out.status = e.exit_status();
        out.stderr = format!(
            "supervise: error[{} {}]: the ledgers do not verify; the page says so and lists no turn: {e}\n",
            e.code().code,
            e.code().name
        );
    }
    Ok(out)
}

fn integrity(session: &Session, pubkey: Option<&Path>) -> Result<Integrity> {
    let ledgers = session.verify().map(|r| {
        let n = |k: LedgerKind| r.iter().find(|v| v.kind == k).map_or(0, |v| v.entries);
        (n(LedgerKind::Exec), n(LedgerKind::Evidence))
    });
    let dir = tp::checkpoint_dir(&session.workspace().ledger_dir(&session.tier, &session.id));
    let checkpoint = match tp::newest_kept(&dir)? {
        None => None,
        Some((path, bytes, head)) => {
            let signature = pubkey.map(|key| {
                let key = tp::load_verifier_key(key).map_err(|e| e.to_string())?;
                tp::open(
                    &path,
                    &bytes,
                    &tp::Trust {
                        supervisor: &key,
                        witnesses: &[],
                        witnesses_required: 0,
                    },
                )
                .map(|_| key.describe())
                .map_err(|e| e.to_string())
            });
            let matches = tp::check_against(
                &path,
                &head,
                &session.id,
                &session.ledger(LedgerKind::Exec).path,
                &session.ledger(LedgerKind::Evidence).path,
            )
            .map(|c| c.size)
            .map_err(|e| e.to_string());
            Some(CheckpointLine {
                path,
                size: head.size,
                root: tp::hash_b64(&head.root),
                signature,
                matches,
            })
        }
    };
    Ok(Integrity {
        ledgers,
        checkpoint,
    })
}

fn turns(session: &Session) -> Result<Vec<TurnView>> {
    let unreadable = |e: serde_json::Error| {
        SupervisorError::invalid("--session", format!("an entry does not read as one: {e}"))
    };
    let evidence = session.ledger(LedgerKind::Evidence).verified_entries()?;
    let exec = session.ledger(LedgerKind::Exec).verified_entries()?;
    let mut execs: BTreeMap<u64, ExecEntry> = read_all::<ExecEntry>(&exec)
        .map_err(unreadable)?
        .into_iter()
        .map(|r| r.body)
        .filter(|e| e.event == Event::TurnFinished)
        .map(|e| (e.turn_number, e))
        .collect();
    Ok(read_all::<EvidenceEntry>(&evidence)
        .map_err(unreadable)?
        .into_iter()
        .map(|r| r.body)
        .filter(|e| e.event == Event::TurnFinished)
        .map(|e| TurnView {
            number: e.turn_number,
            exec: execs.remove(&e.turn_number),
            evidence: e,
        })
        .collect())
}

/// Escapes text for HTML element content and double-quoted attributes.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// The outcome class a turn is coloured by.
fn class_of(status: Option<TurnStatus>) -> &'static str {
    match status {
        Some(TurnStatus::Committed) => "ok",
        Some(TurnStatus::Blocked | TurnStatus::Violation) => "blocked",
        Some(TurnStatus::Aborted | TurnStatus::Interrupted) => "stopped",
        None => "unknown",
        Some(_) => "failed",
    }
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:1.5em;color:#1b1b1b;max-width:72em}\
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.2em 0 .4em}\
.integrity{padding:.6em 1em;border-radius:6px;margin:.5em 0}\
.integrity.good{background:#e6f4ea;border:1px solid #34a853}.integrity.bad{background:#fce8e6;border:1px solid #d93025}\
.timeline{display:flex;flex-wrap:wrap;gap:3px;margin:.6em 0}\
.timeline a{display:block;min-width:2.2em;padding:.25em .3em;text-align:center;border-radius:4px;color:#fff;text-decoration:none;font-size:12px}\
.ok{background:#1e8e3e}.blocked{background:#d93025}.failed{background:#e37400}.stopped{background:#5f6368}.unknown{background:#9aa0a6}\
section.turn{border:1px solid #dadce0;border-left-width:6px;border-radius:4px;padding:.4em .9em;margin:.7em 0}\
section.turn.ok{border-left-color:#1e8e3e;background:none}section.turn.blocked{border-left-color:#d93025;background:none}\
section.turn.failed{border-left-color:#e37400;background:none}section.turn.stopped,section.turn.unknown{border-left-color:#5f6368;background:none}\
code,pre{font-family:ui-monospace,monospace;font-size:12.5px;background:#f1f3f4;border-radius:3px;padding:0 .25em}\
pre{padding:.4em;white-space:pre-wrap;word-break:break-all}\
table{border-collapse:collapse;margin:.3em 0}td,th{border:1px solid #dadce0;padding:.15em .5em;text-align:left;font-size:13px}\
.hint{color:#1a73e8}.muted{color:#5f6368}";

fn render(session: &Session, integrity: &Integrity, turns: &[TurnView]) -> String {
    let mut h = String::new();
    let title = format!("turnstile session {}", session.id);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">\
         <title>{t}</title><style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n",
        t = esc(&title)
    );
    let packages: std::collections::BTreeSet<&str> = turns
        .iter()
        .filter_map(|t| t.evidence.package_id.as_deref())
        .collect();
    let _ = writeln!(
        h,
        "<p class=\"muted\">tier <code>{}</code> · package {} · {} turn(s)</p>",
        esc(&session.tier),
        if packages.is_empty() {
            "—".to_owned()
        } else {
            packages
                .iter()
                .map(|p| format!("<code>{}</code>", esc(p)))
                .collect::<Vec<_>>()
                .join(", ")
        },
        turns.len()
    );
    render_integrity(&mut h, integrity);
    if integrity.ledgers.is_ok() {
        render_timeline(&mut h, turns);
        for t in turns {
            render_turn(&mut h, t);
        }
    }
    h.push_str("</body></html>\n");
    h
}

fn render_integrity(h: &mut String, i: &Integrity) {
    let good = i.ledgers.is_ok()
        && i.checkpoint
            .as_ref()
            .is_none_or(|c| c.matches.is_ok() && c.signature.as_ref().is_none_or(|s| s.is_ok()));
    let _ = write!(
        h,
        "<div id=\"integrity\" class=\"integrity {}\" data-verified=\"{}\">",
        if good { "good" } else { "bad" },
        i.ledgers.is_ok()
    );
    match &i.ledgers {
        Ok((exec, evidence)) => {
            let _ = write!(
                h,
                "<strong>Ledgers verified</strong>: every hash, link and anchored head of exec ({exec} entries) and evidence ({evidence} entries)."
            );
        }
        Err(e) => {
            let _ = write!(
                h,
                "<strong>Ledgers FAILED verification</strong> [{} {}]: {}. No turn is listed: nothing in them can be vouched for.",
                e.code().code,
                e.code().name,
                esc(&e.to_string())
            );
        }
    }
    match &i.checkpoint {
        None => h.push_str(
            "<br><span id=\"checkpoint\" data-state=\"none\">No checkpoint kept for this session (take one with <code>supervise ledger checkpoint</code>).</span>",
        ),
        Some(c) => {
            let sig = match &c.signature {
                None => "signature not checked (pass --pubkey)".to_owned(),
                Some(Ok(by)) => format!("signed by {}", esc(by)),
                Some(Err(e)) => format!("<strong>signature does not verify</strong>: {}", esc(e)),
            };
            let matches = match &c.matches {
                Ok(now) => format!("today's ledgers hold what it signed ({now} entries now)"),
                Err(e) => format!("<strong>the ledgers differ from it</strong>: {}", esc(e)),
            };
            let _ = write!(
                h,
                "<br><span id=\"checkpoint\" data-state=\"{}\">Checkpoint <code>{}</code>: {} entries, root <code>{}</code>; {sig}; {matches}.</span>",
                if c.matches.is_ok() { "matches" } else { "differs" },
                esc(&c.path.file_name().unwrap_or_default().to_string_lossy()),
                c.size,
                esc(&c.root)
            );
        }
    }
    h.push_str("</div>\n");
}

fn status_name(s: Option<TurnStatus>) -> &'static str {
    s.map_or("unknown", TurnStatus::as_str)
}

fn render_timeline(h: &mut String, turns: &[TurnView]) {
    h.push_str("<h2>Timeline</h2>\n<nav class=\"timeline\" id=\"timeline\">");
    for t in turns {
        let _ = write!(
            h,
            "<a class=\"{c}\" href=\"#turn-{n}\" title=\"turn {n}: {s}\">{n}</a>",
            c = class_of(t.evidence.status),
            n = t.number,
            s = status_name(t.evidence.status)
        );
    }
    h.push_str("</nav>\n");
}

fn render_turn(h: &mut String, t: &TurnView) {
    let e = &t.evidence;
    let _ = writeln!(
        h,
        "<section class=\"turn {c}\" id=\"turn-{n}\" data-status=\"{s}\"><h2>Turn {n} — {s}</h2>",
        c = class_of(e.status),
        n = t.number,
        s = status_name(e.status)
    );
    let command = e.command.as_deref().unwrap_or_default();
    let _ = writeln!(
        h,
        "<p>command <code class=\"command\">{}</code></p>",
        esc(&command.join(" "))
    );
    let mut facts = Vec::new();
    if let Some(x) = &t.exec {
        if let Some(code) = x.exit_code {
            facts.push(format!("exit {code}"));
        }
        if let Some(tm) = &x.timings {
            facts.push(format!("{:.1} ms", tm.wall_us as f64 / 1000.0));
        }
        if !x.backend.is_empty() {
            facts.push(format!("backend {}", esc(&x.backend)));
        }
    }
    if let Some(p) = &e.package_id {
        facts.push(format!("package {}", esc(p)));
    }
    if !e.ts.is_empty() {
        facts.push(format!("finished {}", esc(&e.ts)));
    }
    if let Some(err) = &e.error {
        facts.push(format!(
            "error <code>{}</code>",
            esc(&serde_json::to_string(err).unwrap_or_default())
        ));
    }
    let _ = writeln!(h, "<p class=\"muted\">{}</p>", facts.join(" · "));
    if !e.committed.is_empty() {
        h.push_str(
            "<table class=\"outputs\"><tr><th>committed</th><th>bytes</th><th>sha256</th></tr>",
        );
        for c in &e.committed {
            let _ = write!(
                h,
                "<tr><td><code>{}</code></td><td>{}</td><td><code>{}</code></td></tr>",
                esc(&c.path),
                c.size,
                esc(&c.sha256)
            );
        }
        h.push_str("</table>\n");
    }
    if !e.violations.is_empty() {
        h.push_str("<ul class=\"violations\">");
        for v in &e.violations {
            let _ = write!(
                h,
                "<li class=\"violation\">[{}] {} <code>{}</code> ×{} — {}",
                v.layer.as_str(),
                esc(&v.attempted_operation),
                esc(&v.target),
                v.count,
                esc(&v.details)
            );
            if let Some(hint) = &v.hint {
                let _ = write!(h, "<br><span class=\"hint\">hint: {}</span>", esc(hint));
            }
            h.push_str("</li>");
        }
        h.push_str("</ul>\n");
    }
    if !e.external_calls.is_empty() {
        h.push_str("<ul class=\"flows\">");
        for c in &e.external_calls {
            let _ = write!(
                h,
                "<li class=\"flow\"><code>{}</code></li>",
                esc(&serde_json::to_string(c).unwrap_or_default())
            );
        }
        h.push_str("</ul>\n");
    }
    h.push_str("</section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup() {
        let s = esc("<script>alert('x')</script>&\"\u{7}");
        assert!(!s.contains('<') && !s.contains('>') && !s.contains('"'));
        assert_eq!(
            s,
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;\\u{7}"
        );
    }

    #[test]
    fn outcomes_have_their_colour_class() {
        assert_eq!(class_of(Some(TurnStatus::Committed)), "ok");
        assert_eq!(class_of(Some(TurnStatus::Blocked)), "blocked");
        assert_eq!(class_of(Some(TurnStatus::Violation)), "blocked");
        assert_eq!(class_of(Some(TurnStatus::Timeout)), "failed");
        assert_eq!(class_of(Some(TurnStatus::Aborted)), "stopped");
    }
}
