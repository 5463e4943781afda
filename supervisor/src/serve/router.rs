//! Routing a receive's envelopes to the packages subscribed to their type
//! (issue 28; `subscriptions` in `serve --daemon-config`).
//!
//! Every envelope a committed receive emits is published to the daemon's
//! [`FileEventBus`] (under the state directory: agents cannot write it)
//! before the receive is answered or its own delivery acked; the router
//! thread then hands each pending delivery to its subscription's package
//! as a receive turn — in one session per subscription, created at start —
//! and acks it only once that turn's own envelopes are published. A
//! daemon killed anywhere leaves deliveries pending; the next start
//! delivers them again, and the receive's idempotency key (the envelope's)
//! returns the recorded envelopes instead of running the agent again: at
//! least once on the bus, exactly once in effect.
//!
//! A chain longer than `max_hops` routed hops is cut (TS1094): a
//! subscription loop A → B → A ends with a dead letter, not forever. A
//! delivery that cannot be run (no entry point, a refused or failed turn)
//! becomes a dead letter too: `eventbus/dead/<delivery>.json`, and a
//! warning in the log.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use turnstile_policy::envelope::EventEnvelope;
use turnstile_policy::error::codes;

use super::Daemon;
use super::config::{DaemonConfig, Subscription};
use super::eventbus::{Delivery, EventBus, FileEventBus};
use crate::error::{Result, SupervisorError};
use crate::store::record::ErrorRecord;

/// Attempts after the first for a delivery whose turns a crash cut.
const MAX_ATTEMPTS: u32 = 3;

/// A subscription and the session its receives run in.
#[derive(Debug)]
struct Target {
    sub: Subscription,
    session: String,
}

/// A delivery that was not run, and why.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeadLetter {
    pub delivery: Delivery,
    pub package: String,
    pub error: ErrorRecord,
}

/// The daemon's router.
#[derive(Debug)]
pub struct Router {
    bus: Mutex<FileEventBus>,
    targets: Vec<Target>,
    max_hops: u32,
    dead: PathBuf,
    wake: (Mutex<bool>, Condvar),
}

fn record(code: turnstile_policy::error::ErrorCode, message: String) -> ErrorRecord {
    ErrorRecord {
        code: code.code.to_owned(),
        name: code.name.to_owned(),
        message,
    }
}

impl Router {
    /// The router of `config`'s subscriptions (`None` without any): the
    /// durable bus, and a session per subscription (created now, its id
    /// kept in the state directory).
    pub fn open(state_dir: &Path, config: &DaemonConfig) -> Result<Option<Self>> {
        if config.subscriptions.is_empty() {
            return Ok(None);
        }
        let dir = state_dir.join("eventbus");
        let mut bus = FileEventBus::open(&dir)?;
        let mut targets = Vec::new();
        for (i, sub) in config.subscriptions.iter().enumerate() {
            // A package that cannot receive refuses the start, not a
            // delivery later.
            let field = format!("daemon-config.subscriptions[{i}].package");
            let id = turnstile_policy::PackageId::parse(&sub.package)?;
            let manifest = turnstile_policy::Manifest::load(&sub.root, &id)
                .map_err(|e| SupervisorError::invalid(&field, e.to_string()))?;
            if manifest.receive.is_none() {
                return Err(SupervisorError::invalid(
                    &field,
                    format!(
                        "package `{}` declares no `entry.receive`: it cannot be subscribed",
                        sub.package
                    ),
                ));
            }
            bus.subscribe_pattern(sub.kind.clone());
            let session = session_for(state_dir, sub).map_err(|e| {
                SupervisorError::invalid(
                    &format!("daemon-config.subscriptions[{i}]"),
                    format!("cannot open its session: {e}"),
                )
            })?;
            targets.push(Target {
                sub: sub.clone(),
                session,
            });
        }
        let dead = dir.join("dead");
        crate::fsx::create_private_dir_all(&dead)?;
        Ok(Some(Self {
            bus: Mutex::new(bus),
            targets,
            max_hops: config.max_hops,
            dead,
            wake: (Mutex::new(false), Condvar::new()),
        }))
    }

    /// Publishes what a receive at `hop` emitted (durable on return) and
    /// wakes the router.
    pub fn publish(&self, emitted: &[EventEnvelope], hop: u32) -> Result<()> {
        {
            let mut bus = self.bus.lock().map_err(|_| poisoned())?;
            for e in emitted {
                bus.publish(e, hop)?;
            }
        }
        self.notify();
        Ok(())
    }

    /// Publishes the envelopes of a receive reply if its turn committed.
    pub fn publish_reply(&self, value: &serde_json::Value, hop: u32) -> Result<()> {
        match serde_json::from_value::<crate::turn::receive::Received>(value.clone()) {
            Ok(r) if r.status == crate::store::status::TurnStatus::Committed => {
                self.publish(&r.emitted, hop)
            }
            _ => Ok(()),
        }
    }

    fn notify(&self) {
        if let Ok(mut w) = self.wake.0.lock() {
            *w = true;
            self.wake.1.notify_all();
        }
    }

    /// The router thread: deliver what is pending (a previous daemon's
    /// first), then wait for more, until the daemon stops.
    pub fn run(&self, d: &Daemon) {
        tracing::info!(
            subscriptions = self.targets.len(),
            max_hops = self.max_hops,
            "router: serving"
        );
        while !d.stopping.load(Ordering::SeqCst) {
            let pending = self.bus.lock().map(|b| b.pending()).unwrap_or_default();
            for delivery in pending {
                if d.stopping.load(Ordering::SeqCst) {
                    return;
                }
                if self.deliver(d, &delivery) {
                    if let Ok(mut bus) = self.bus.lock() {
                        if let Err(e) = bus.ack(&delivery.id) {
                            tracing::error!(error = %e, delivery = %delivery.id, "router: cannot ack");
                        }
                    }
                }
            }
            let Ok(mut w) = self.wake.0.lock() else {
                return;
            };
            if !*w {
                w = match self.wake.1.wait_timeout(w, Duration::from_millis(500)) {
                    Ok((w, _)) => w,
                    Err(_) => return,
                };
            }
            *w = false;
        }
    }

    /// Runs one delivery; `true` when it is done with (delivered, or a
    /// dead letter), `false` to try again later.
    fn deliver(&self, d: &Daemon, delivery: &Delivery) -> bool {
        let Some(t) = self.targets.get(delivery.subscription) else {
            return self.dead_letter(
                delivery,
                "",
                record(
                    codes::RECEIVE_FAILED,
                    format!(
                        "subscription {} is not in the daemon config any more",
                        delivery.subscription
                    ),
                ),
            );
        };
        let hop = delivery.hop + 1;
        if hop > self.max_hops {
            return self.dead_letter(
                delivery,
                &t.sub.package,
                record(
                    codes::BUS_HOP_LIMIT,
                    format!(
                        "`{}` from `{}` would be routed hop {hop} of a chain, beyond max_hops {} (a subscription loop?): cut, `{}` was not run",
                        delivery.envelope.kind,
                        delivery.envelope.source.agent,
                        self.max_hops,
                        t.sub.package
                    ),
                ),
            );
        }
        match self.run_receive(d, t, delivery, hop) {
            Ok(None) => true,
            Ok(Some(err)) => self.dead_letter(delivery, &t.sub.package, err),
            Err(_) if d.stopping.load(Ordering::SeqCst) => false,
            Err(e) => {
                let o = crate::turn::outcome::error_object(&e);
                self.dead_letter(
                    delivery,
                    &t.sub.package,
                    ErrorRecord {
                        code: o.code,
                        name: o.name,
                        message: o.message,
                    },
                )
            }
        }
    }

    /// The receive turn of a delivery; `Some(error)` when it did not
    /// commit.
    fn run_receive(
        &self,
        d: &Daemon,
        t: &Target,
        delivery: &Delivery,
        hop: u32,
    ) -> Result<Option<ErrorRecord>> {
        // A turn cut by a crash (`aborted`) or a stop (`interrupted`)
        // committed nothing: the next attempt runs it anew, under its own
        // key.
        let mut attempt = 0;
        loop {
            let reply = self.attempt(d, t, delivery, hop, attempt)?;
            let aborted =
                serde_json::from_value::<crate::store::record::TurnReport>(reply.value.clone())
                    .is_ok_and(|r| {
                        matches!(
                            r.status,
                            crate::store::status::TurnStatus::Aborted
                                | crate::store::status::TurnStatus::Interrupted
                        )
                    });
            if aborted && d.stopping.load(Ordering::SeqCst) {
                // Stopped mid-turn: the next start delivers it again.
                return Err(SupervisorError::WorkerFailed {
                    detail: "the daemon is stopping".into(),
                });
            }
            if aborted && attempt < MAX_ATTEMPTS {
                attempt += 1;
                continue;
            }
            return self.settle(d, t, hop, reply);
        }
    }

    fn attempt(
        &self,
        d: &Daemon,
        t: &Target,
        delivery: &Delivery,
        hop: u32,
        attempt: u32,
    ) -> Result<super::wire::Reply> {
        let request = crate::turn::receive::request(
            &t.sub.root,
            &t.sub.package,
            &delivery.envelope,
            attempt,
            Vec::new(),
            None,
            None,
        )?;
        let r = super::wire::RunRequest {
            root: t.sub.root.clone(),
            package: t.sub.package.clone(),
            session: Some(t.session.clone()),
            state_dir: Some(d.state_dir.clone()),
            backend: None,
            tenant: None,
            config: None,
            rootfs: None,
            json: true,
            events: None,
            deterministic: None,
            request: super::client::request_doc(&request),
            receive: Some(super::wire::ReceiveWire {
                envelope: serde_json::to_value(&delivery.envelope).unwrap_or_default(),
                hop,
                attempt,
            }),
        };
        let null = |what: &'static str| -> Result<OwnedFd> {
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .map(OwnedFd::from)
                .map_err(crate::fsx::state_io(what, Path::new("/dev/null")))
        };
        let n = d.next_conn.fetch_add(1, Ordering::SeqCst);
        let reply = super::run_worker(
            d,
            n,
            &r,
            null("open /dev/null")?,
            null("open /dev/null")?,
            None,
            &[],
        )?
        .settle(d);
        d.metrics.events_received.inc();
        Ok(reply)
    }

    /// What a receive reply means for its delivery: its envelopes
    /// published (`None`), or why it did not commit.
    fn settle(
        &self,
        d: &Daemon,
        t: &Target,
        hop: u32,
        reply: super::wire::Reply,
    ) -> Result<Option<ErrorRecord>> {
        match serde_json::from_value::<crate::turn::receive::Received>(reply.value.clone()) {
            Ok(rec) if rec.status == crate::store::status::TurnStatus::Committed => {
                // Durable before this delivery is acked.
                self.publish(&rec.emitted, hop)?;
                d.metrics.events_emitted.inc();
                tracing::info!(
                    package = %t.sub.package,
                    session_id = %rec.session_id,
                    turn = rec.turn_number,
                    hop,
                    emitted = rec.emitted.len(),
                    replayed = rec.replayed,
                    "router: delivered"
                );
                Ok(None)
            }
            Ok(rec) => Ok(Some(rec.error.unwrap_or_else(|| {
                record(
                    codes::RECEIVE_FAILED,
                    format!("the receive turn ended `{}`", rec.status.as_str()),
                )
            }))),
            Err(_) => {
                let why =
                    serde_json::from_value::<crate::store::record::TurnReport>(reply.value.clone())
                        .map(|r| format!("the receive turn ended `{}`", r.status.as_str()))
                        .or_else(|_| {
                            serde_json::from_value::<crate::turn::outcome::ErrorReply>(reply.value)
                                .map(|e| format!("[{}] {}", e.error.code, e.error.message))
                        })
                        .unwrap_or_else(|_| format!("exit status {}", reply.exit_status));
                Ok(Some(record(codes::RECEIVE_FAILED, why)))
            }
        }
    }

    /// Records a delivery that will not run; `true` (done with).
    fn dead_letter(&self, delivery: &Delivery, package: &str, error: ErrorRecord) -> bool {
        tracing::warn!(
            delivery = %delivery.id,
            package,
            code = %error.code,
            reason = %error.message,
            "router: dead letter"
        );
        let letter = DeadLetter {
            delivery: delivery.clone(),
            package: package.to_owned(),
            error,
        };
        let path = self.dead.join(format!("{}.json", delivery.id));
        let text = serde_json::to_vec(&letter).unwrap_or_default();
        match crate::fsx::write_atomic(&path, &text) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, "router: cannot record a dead letter; retried later");
                false
            }
        }
    }
}

fn poisoned() -> SupervisorError {
    SupervisorError::WorkerFailed {
        detail: "the event bus lock is poisoned".into(),
    }
}

/// The session of a subscription: created once, its id kept in the state
/// directory (`subscription-sessions/`).
fn session_for(state_dir: &Path, sub: &Subscription) -> Result<String> {
    use sha2::{Digest, Sha256};
    let key = hex::encode(Sha256::digest(
        format!(
            "{}\0{}\0{}",
            sub.root.display(),
            sub.package,
            sub.kind.as_str()
        )
        .as_bytes(),
    ));
    let dir = state_dir.join("subscription-sessions");
    let file = dir.join(&key[..32]);
    let ws = crate::store::layout::Workspace::open(&sub.root)?;
    if let Ok(s) = std::fs::read_to_string(&file) {
        let s = s.trim().to_owned();
        let id = turnstile_policy::SessionId::parse(&s)?;
        let state = crate::store::layout::StateDir::open(state_dir, &ws, false)?;
        if crate::store::session::Session::open(&ws, &state, &id, None).is_ok() {
            return Ok(s);
        }
    }
    let state = crate::store::layout::StateDir::open(state_dir, &ws, true)?;
    let session = crate::store::session::Session::create_default(&ws, &state)?;
    crate::fsx::create_private_dir_all(&dir)?;
    crate::fsx::write_atomic(&file, format!("{}\n", session.id.as_str()).as_bytes())?;
    Ok(session.id.as_str().to_owned())
}
