//! The event bus interface (seed 001 "Bus Interface"; issue 28): publish
//! an EventEnvelope, subscribe by type pattern, ack a delivery.
//!
//! Two implementations: [`InMemoryBus`] — subscribers invoked
//! synchronously, in subscription order, for tests and embedding — and
//! [`FileEventBus`], the daemon's durable one (one file per pending
//! delivery under the state directory, written and synced before
//! `publish` returns), which `serve` drains to route a receive's envelopes
//! to the packages subscribed to their type.
//!
//! Delivery is at least once: a delivery stays pending until acked. A
//! delivery is named by its subscription and the envelope's idempotency
//! key, so publishing the same envelope again after its delivery was acked
//! delivers nothing: with idempotent receivers, effects happen once.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use turnstile_policy::envelope::EventEnvelope;

use crate::error::{Result, SupervisorError};

/// A subscription's index (its order: handlers run in it).
pub type SubscriptionId = usize;

/// A type pattern: dot-separated segments, `*` one segment, a final `**`
/// one or more (`**` alone: every type).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TypePattern(String);

impl TryFrom<String> for TypePattern {
    type Error = String;
    fn try_from(s: String) -> std::result::Result<Self, String> {
        Self::parse(&s)
    }
}

impl From<TypePattern> for String {
    fn from(p: TypePattern) -> String {
        p.0
    }
}

impl TypePattern {
    pub fn parse(raw: &str) -> std::result::Result<Self, String> {
        let segs: Vec<&str> = raw.split('.').collect();
        let ok = !raw.is_empty()
            && raw.len() <= 128
            && segs.iter().enumerate().all(|(i, s)| {
                (*s == "**" && i == segs.len() - 1)
                    || *s == "*"
                    || (!s.is_empty()
                        && s.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
            });
        if ok {
            Ok(Self(raw.to_owned()))
        } else {
            Err(format!(
                "`{raw}` is not a type pattern (dotted segments; `*` one segment, a final `**` the rest)"
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn matches(&self, kind: &str) -> bool {
        let p: Vec<&str> = self.0.split('.').collect();
        let k: Vec<&str> = kind.split('.').collect();
        for (i, seg) in p.iter().enumerate() {
            match *seg {
                "**" => return k.len() > i,
                "*" if i < k.len() => {}
                s if i < k.len() && s == k[i] => {}
                _ => return false,
            }
        }
        p.len() == k.len()
    }
}

/// One envelope for one subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// `<subscription>:<sha256(idempotency_key)>`.
    pub id: String,
    pub subscription: SubscriptionId,
    pub envelope: EventEnvelope,
    /// Routed hops before this one (carried for chains; 0 from a client).
    #[serde(default)]
    pub hop: u32,
}

fn delivery_id(sub: SubscriptionId, e: &EventEnvelope) -> String {
    format!(
        "{sub}-{}",
        &hex::encode(Sha256::digest(e.idempotency_key.as_bytes()))[..32]
    )
}

/// A subscriber: `true` acks the delivery, `false` leaves it pending.
pub type Handler = Box<dyn FnMut(&Delivery) -> bool + Send>;

/// The bus interface.
pub trait EventBus {
    /// Validates `envelope` and delivers it to every subscription whose
    /// pattern matches its type; the ids of the deliveries made.
    fn publish(&mut self, envelope: &EventEnvelope, hop: u32) -> Result<Vec<String>>;
    /// Adds a subscription; handlers run in subscription order.
    fn subscribe(&mut self, pattern: &str, handler: Handler) -> Result<SubscriptionId>;
    /// Marks a delivery done: it is never delivered again.
    fn ack(&mut self, delivery: &str) -> Result<()>;
    /// Deliveries not acked yet, oldest first.
    fn pending(&self) -> Vec<Delivery>;
}

fn pattern(raw: &str) -> Result<TypePattern> {
    TypePattern::parse(raw).map_err(|r| SupervisorError::invalid("subscriptions.type", r))
}

/// Subscribers invoked synchronously, in subscription order.
#[derive(Default)]
pub struct InMemoryBus {
    subs: Vec<(TypePattern, Handler)>,
    pending: Vec<Delivery>,
    acked: HashSet<String>,
}

impl std::fmt::Debug for InMemoryBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryBus")
            .field("subscriptions", &self.subs.len())
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl InMemoryBus {
    pub fn new() -> Self {
        Self::default()
    }

    /// Offers every pending delivery to its subscriber again.
    pub fn redeliver(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for d in pending {
            if (self.subs[d.subscription].1)(&d) {
                self.acked.insert(d.id);
            } else {
                self.pending.push(d);
            }
        }
    }
}

impl EventBus for InMemoryBus {
    fn publish(&mut self, envelope: &EventEnvelope, hop: u32) -> Result<Vec<String>> {
        envelope.validate()?;
        let mut ids = Vec::new();
        for i in 0..self.subs.len() {
            if !self.subs[i].0.matches(&envelope.kind) {
                continue;
            }
            let id = delivery_id(i, envelope);
            if self.acked.contains(&id) || self.pending.iter().any(|d| d.id == id) {
                continue;
            }
            let d = Delivery {
                id: id.clone(),
                subscription: i,
                envelope: envelope.clone(),
                hop,
            };
            if (self.subs[i].1)(&d) {
                self.acked.insert(id.clone());
            } else {
                self.pending.push(d);
            }
            ids.push(id);
        }
        Ok(ids)
    }

    fn subscribe(&mut self, raw: &str, handler: Handler) -> Result<SubscriptionId> {
        self.subs.push((pattern(raw)?, handler));
        Ok(self.subs.len() - 1)
    }

    fn ack(&mut self, delivery: &str) -> Result<()> {
        self.pending.retain(|d| d.id != delivery);
        self.acked.insert(delivery.to_owned());
        Ok(())
    }

    fn pending(&self) -> Vec<Delivery> {
        self.pending.clone()
    }
}

/// The durable bus: `DIR/pending/<seq>-<id>.json` per delivery (written to
/// a temporary name, synced, renamed, the directory synced) and
/// `DIR/acked/<id>` once done. Subscriptions are registered per process
/// (the daemon's config); handlers run when [`FileEventBus::drain`] is
/// called, not inside `publish`, so a chain is a loop, never a recursion.
pub struct FileEventBus {
    dir: PathBuf,
    subs: Vec<(TypePattern, Option<Handler>)>,
}

impl std::fmt::Debug for FileEventBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileEventBus")
            .field("dir", &self.dir)
            .field("subscriptions", &self.subs.len())
            .finish()
    }
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SupervisorError {
    crate::fsx::state_io(op, path)
}

impl FileEventBus {
    pub fn open(dir: &Path) -> Result<Self> {
        for sub in ["pending", "acked"] {
            crate::fsx::create_private_dir_all(&dir.join(sub))?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            subs: Vec::new(),
        })
    }

    /// A subscription whose deliveries are taken by the caller (through
    /// [`EventBus::pending`] and [`EventBus::ack`]) rather than a handler.
    pub fn subscribe_pattern(&mut self, pattern: TypePattern) -> SubscriptionId {
        self.subs.push((pattern, None));
        self.subs.len() - 1
    }

    fn acked(&self, id: &str) -> bool {
        self.dir.join("acked").join(id).exists()
    }

    fn pending_files(&self) -> Vec<(String, PathBuf)> {
        let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(self.dir.join("pending"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .filter(|(n, _)| !n.starts_with('.') && n.ends_with(".json"))
            .collect();
        v.sort();
        v
    }

    /// Offers every pending delivery with a handler to it, oldest first,
    /// until none is left or none is taken.
    pub fn drain(&mut self) -> Result<usize> {
        let mut n = 0;
        loop {
            let mut progressed = false;
            for d in self.pending() {
                if let Some(Some(h)) = self.subs.get_mut(d.subscription).map(|s| s.1.as_mut()) {
                    if h(&d) {
                        self.ack(&d.id)?;
                        n += 1;
                        progressed = true;
                    }
                }
            }
            if !progressed {
                return Ok(n);
            }
        }
    }
}

impl EventBus for FileEventBus {
    fn publish(&mut self, envelope: &EventEnvelope, hop: u32) -> Result<Vec<String>> {
        envelope.validate()?;
        let pending = self.pending_files();
        // Oldest first: numbered after the newest pending (no clock).
        let mut next = pending
            .iter()
            .filter_map(|(n, _)| n.split('-').next()?.parse::<u64>().ok())
            .max()
            .map_or(0, |m| m + 1);
        let mut ids = Vec::new();
        for i in 0..self.subs.len() {
            if !self.subs[i].0.matches(&envelope.kind) {
                continue;
            }
            let id = delivery_id(i, envelope);
            if self.acked(&id)
                || pending
                    .iter()
                    .any(|(n, _)| n.ends_with(&format!("-{id}.json")))
            {
                ids.push(id);
                continue;
            }
            let d = Delivery {
                id: id.clone(),
                subscription: i,
                envelope: envelope.clone(),
                hop,
            };
            let seq = next;
            next += 1;
            let name = format!("{seq:020}-{id}.json");
            let path = self.dir.join("pending").join(name);
            let text = serde_json::to_vec(&d)
                .map_err(|e| SupervisorError::invalid("envelope", e.to_string()))?;
            crate::fsx::write_atomic(&path, &text)?;
            ids.push(id);
        }
        Ok(ids)
    }

    fn subscribe(&mut self, raw: &str, handler: Handler) -> Result<SubscriptionId> {
        self.subs.push((pattern(raw)?, Some(handler)));
        Ok(self.subs.len() - 1)
    }

    fn ack(&mut self, delivery: &str) -> Result<()> {
        let marker = self.dir.join("acked").join(delivery);
        crate::fsx::write_atomic(&marker, b"")?;
        for (n, p) in self.pending_files() {
            if n.ends_with(&format!("-{delivery}.json")) {
                std::fs::remove_file(&p).map_err(io("remove acked delivery", &p))?;
            }
        }
        Ok(())
    }

    fn pending(&self) -> Vec<Delivery> {
        self.pending_files()
            .into_iter()
            .filter_map(|(_, p)| {
                let b = crate::fsx::read_small(&p, 4 << 20).ok()?;
                serde_json::from_slice::<Delivery>(&b).ok()
            })
            .filter(|d| !self.acked(&d.id))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn env(kind: &str, key: &str) -> EventEnvelope {
        EventEnvelope {
            id: format!("EVT-{key}"),
            ts: "2026-01-01T00:00:00Z".into(),
            kind: kind.into(),
            schema_version: "1".into(),
            idempotency_key: key.into(),
            source: turnstile_policy::envelope::Source {
                agent: "a".into(),
                adapter: "t".into(),
            },
            payload: serde_json::json!({}),
        }
    }

    #[test]
    fn issue_28_type_patterns() {
        let p = |s: &str| TypePattern::parse(s).unwrap();
        assert!(p("invoice.paid").matches("invoice.paid"));
        assert!(!p("invoice.paid").matches("invoice.paid.late"));
        assert!(p("invoice.*").matches("invoice.paid"));
        assert!(!p("invoice.*").matches("invoice.paid.late"));
        assert!(p("invoice.**").matches("invoice.paid.late"));
        assert!(!p("invoice.**").matches("invoice"));
        assert!(p("**").matches("a.b"));
        assert!(p("*.paid").matches("order.paid"));
        for bad in ["", "a..b", "a.**.b", "a b", "a/b"] {
            assert!(TypePattern::parse(bad).is_err(), "{bad}");
        }
    }

    /// Seed 001 "InMemoryBus Operation": every matching subscriber is
    /// invoked synchronously, in subscription order, before publish
    /// returns; others are not.
    #[test]
    fn issue_28_seed_001_inmemorybus_operation_subscribers_invoked_synchronously_in_order() {
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        let mut bus = InMemoryBus::new();
        for (name, pat) in [
            ("first", "invoice.*"),
            ("other", "order.*"),
            ("second", "**"),
        ] {
            let l = Arc::clone(&log);
            bus.subscribe(
                pat,
                Box::new(move |d: &Delivery| {
                    l.lock()
                        .unwrap()
                        .push(format!("{name}:{}", d.envelope.kind));
                    true
                }),
            )
            .unwrap();
        }
        let ids = bus.publish(&env("invoice.paid", "k1"), 0).unwrap();
        assert_eq!(ids.len(), 2);
        assert_eq!(
            *log.lock().unwrap(),
            vec!["first:invoice.paid", "second:invoice.paid"]
        );
        // Acked: the same envelope again delivers nothing.
        bus.publish(&env("invoice.paid", "k1"), 0).unwrap();
        assert_eq!(log.lock().unwrap().len(), 2);
        assert!(bus.pending().is_empty());
        // An invalid envelope is refused before anyone sees it.
        assert!(bus.publish(&env("nodots", "k2"), 0).is_err());
        assert!(bus.subscribe("a..b", Box::new(|_| true)).is_err());
    }

    #[test]
    fn issue_28_in_memory_bus_keeps_unacked_deliveries_until_acked() {
        let mut bus = InMemoryBus::new();
        let fail = Arc::new(Mutex::new(true));
        let f = Arc::clone(&fail);
        bus.subscribe("x.*", Box::new(move |_| !*f.lock().unwrap()))
            .unwrap();
        bus.publish(&env("x.y", "k"), 0).unwrap();
        assert_eq!(bus.pending().len(), 1);
        *fail.lock().unwrap() = false;
        bus.redeliver();
        assert!(bus.pending().is_empty());
        bus.publish(&env("x.y", "k2"), 0).unwrap();
        assert!(bus.pending().is_empty());
        // Explicit ack.
        let mut bus = InMemoryBus::new();
        bus.subscribe("x.*", Box::new(|_| false)).unwrap();
        let ids = bus.publish(&env("x.y", "k"), 0).unwrap();
        bus.ack(&ids[0]).unwrap();
        assert!(bus.pending().is_empty());
    }

    #[test]
    fn issue_28_file_event_bus_is_durable_and_delivers_once_acked() {
        let dir = tempfile::tempdir().unwrap();
        let mut bus = FileEventBus::open(dir.path()).unwrap();
        let s = bus.subscribe_pattern(TypePattern::parse("x.*").unwrap());
        bus.publish(&env("x.y", "k"), 3).unwrap();
        bus.publish(&env("other.y", "k"), 0).unwrap();
        // Reopened (a restarted daemon): the delivery is still there.
        let mut again = FileEventBus::open(dir.path()).unwrap();
        again.subscribe_pattern(TypePattern::parse("x.*").unwrap());
        let p = again.pending();
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].subscription, p[0].hop), (s, 3));
        again.ack(&p[0].id).unwrap();
        assert!(again.pending().is_empty());
        // Published again after the ack: nothing new.
        again.publish(&env("x.y", "k"), 3).unwrap();
        assert!(again.pending().is_empty());
        // drain() hands deliveries to handlers, oldest first.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sn = Arc::clone(&seen);
        let mut h = FileEventBus::open(&dir.path().join("h")).unwrap();
        h.subscribe(
            "x.*",
            Box::new(move |d| {
                sn.lock().unwrap().push(d.envelope.idempotency_key.clone());
                true
            }),
        )
        .unwrap();
        h.publish(&env("x.a", "1"), 0).unwrap();
        h.publish(&env("x.b", "2"), 0).unwrap();
        assert_eq!(h.drain().unwrap(), 2);
        assert_eq!(*seen.lock().unwrap(), vec!["1", "2"]);
    }
}
