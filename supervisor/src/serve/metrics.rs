//! The daemon's metrics, in Prometheus text through `prometheus-client`:
//! seed 001's event metrics, seed 002 §9.1.1's runtime metrics where they
//! apply to a turn supervisor, and turn/violation counters. Served on
//! `--metrics ADDR:PORT` (GET /metrics; any other path is 404).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::Value;

use crate::store::record::TurnReport;
use crate::store::status::TurnStatus;

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Every metric the daemon exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    turns: Family<Labels, Counter>,
    violations: Family<Labels, Counter>,
    spawns: Family<Labels, Counter>,
    spawn_duration: Family<Labels, Histogram>,
    terminations: Family<Labels, Counter>,
    pub warm_pool_size: Gauge,
    health_checks: Family<Labels, Counter>,
    pub events_received: Counter,
    pub events_emitted: Counter,
    event_duration: Histogram,
    checkpoints: Family<Labels, Counter>,
    checkpoint_duration: Histogram,
    active_agents: Family<Labels, Gauge>,
}

fn seconds_histogram() -> Histogram {
    // 1 ms … ~16 s
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let turns = Family::<Labels, Counter>::default();
        let violations = Family::<Labels, Counter>::default();
        let spawns = Family::<Labels, Counter>::default();
        let spawn_duration = Family::<Labels, Histogram>::new_with_constructor(
            seconds_histogram as fn() -> Histogram,
        );
        let terminations = Family::<Labels, Counter>::default();
        let warm_pool_size = Gauge::default();
        let health_checks = Family::<Labels, Counter>::default();
        let events_received = Counter::default();
        let events_emitted = Counter::default();
        // 0.5 ms … ~16 s
        let event_duration = Histogram::new(exponential_buckets(0.5, 2.0, 16));
        let checkpoints = Family::<Labels, Counter>::default();
        let checkpoint_duration = seconds_histogram();
        let active_agents = Family::<Labels, Gauge>::default();
        registry.register(
            "agent_runtime_active_agents",
            "Agents the daemon holds, by trust level and state: running (a turn in flight), suspended (frozen), idle (a warm sandbox waiting)",
            active_agents.clone(),
        );
        registry.register(
            "agent_runtime_checkpoints",
            "Signed ledger checkpoints the daemon took (type auto), by status",
            checkpoints.clone(),
        );
        registry.register(
            "agent_runtime_checkpoint_duration_seconds",
            "Time to verify the ledgers and sign a checkpoint",
            checkpoint_duration.clone(),
        );
        // Counters get their `_total` suffix from the encoder.
        registry.register(
            "turns",
            "Turns finished, by status and backend",
            turns.clone(),
        );
        registry.register(
            "violations",
            "Violations recorded, by enforcement layer",
            violations.clone(),
        );
        registry.register(
            "agent_runtime_spawns",
            "Sandboxes spawned for turns (success: the sandbox was built)",
            spawns.clone(),
        );
        registry.register(
            "agent_runtime_spawn_duration_seconds",
            "Time to build and start a turn's sandbox (cold: built for the turn; warm: from the pool)",
            spawn_duration.clone(),
        );
        registry.register(
            "agent_runtime_terminations",
            "Turns ended, by reason",
            terminations.clone(),
        );
        registry.register(
            "agent_runtime_warm_pool_size",
            "Sandboxes waiting in the warm pool",
            warm_pool_size.clone(),
        );
        registry.register(
            "agent_runtime_health_checks",
            "Health checks answered by the daemon",
            health_checks.clone(),
        );
        registry.register(
            "events_received",
            "Requests received (socket and bus)",
            events_received.clone(),
        );
        registry.register(
            "events_emitted",
            "Replies and bus evidence files emitted",
            events_emitted.clone(),
        );
        registry.register(
            "event_processing_duration_ms",
            "Time from a request's arrival to its reply or evidence, in milliseconds",
            event_duration.clone(),
        );
        Self {
            registry,
            turns,
            violations,
            spawns,
            spawn_duration,
            terminations,
            warm_pool_size,
            health_checks,
            events_received,
            events_emitted,
            event_duration,
            checkpoints,
            checkpoint_duration,
            active_agents,
        }
    }

    /// Sets `agent_runtime_active_agents` from counts by (trust level,
    /// state); every known trust level and state is exported, 0 when none.
    pub fn set_active_agents(
        &self,
        counts: &std::collections::BTreeMap<(String, &'static str), i64>,
    ) {
        use turnstile_policy::manifest::TrustLevel;
        let mut trust: std::collections::BTreeSet<String> = [
            TrustLevel::Trusted,
            TrustLevel::Standard,
            TrustLevel::Untrusted,
            TrustLevel::Confidential,
        ]
        .iter()
        .map(|t| t.as_str().to_owned())
        .collect();
        trust.extend(counts.keys().map(|(t, _)| t.clone()));
        for t in &trust {
            for state in ["running", "suspended", "idle"] {
                let n = counts.get(&(t.clone(), state)).copied().unwrap_or(0);
                self.active_agents
                    .get_or_create(&labels(&[("trust_level", t), ("state", state)]))
                    .set(n);
            }
        }
    }

    /// Records one checkpoint the daemon took (seed 002 §9.1.1).
    pub fn record_checkpoint(&self, ok: bool, seconds: f64) {
        self.checkpoints
            .get_or_create(&labels(&[
                ("type", "auto"),
                ("status", if ok { "success" } else { "failure" }),
            ]))
            .inc();
        self.checkpoint_duration.observe(seconds);
    }

    /// Records one finished request: its turn value (or error object), the
    /// package's trust level when known, and how long it took.
    pub fn turn_finished(&self, value: &Value, trust_level: Option<&str>, took_ms: f64) {
        self.event_duration.observe(took_ms);
        let Ok(report) = serde_json::from_value::<TurnReport>(value.clone()) else {
            // Refused before a turn existed (bad request, unknown session…).
            self.turns
                .get_or_create(&labels(&[("status", "rejected"), ("backend", "none")]))
                .inc();
            return;
        };
        let status = report.status;
        let backend = report
            .enforcement
            .as_ref()
            .map_or("none", |e| e.backend.as_str());
        self.turns
            .get_or_create(&labels(&[
                ("status", status.as_str()),
                ("backend", backend),
            ]))
            .inc();
        for v in &report.violations {
            self.violations
                .get_or_create(&labels(&[("layer", v.layer.as_str())]))
                .inc();
        }
        // A turn refused by the pre-execution check or replayed never
        // spawned a sandbox.
        if status != TurnStatus::Violation && !report.replayed {
            let built = !matches!(status, TurnStatus::SandboxError | TurnStatus::PostureFailed);
            self.spawns
                .get_or_create(&labels(&[
                    ("status", if built { "success" } else { "failure" }),
                    ("trust_level", trust_level.unwrap_or("unknown")),
                    ("runtime_class", backend),
                ]))
                .inc();
            // Cold: the sandbox's build (spawn) for the turn; warm: the
            // wait for the pooled one (warm_take) — then, as for a cold one,
            // until the command is restricted and parked (init_until_ready).
            let durations = report.durations.unwrap_or_default();
            let phase = |n: &str| durations.phases_ms.get(n).copied();
            let (source, build) = match durations.sandbox.as_str() {
                "warm" => ("warm", phase("warm_take").unwrap_or(0.0)),
                _ => ("cold", phase("spawn").unwrap_or(0.0)),
            };
            if let Some(ready) = phase("init_until_ready") {
                self.spawn_duration
                    .get_or_create(&labels(&[("source", source)]))
                    .observe((build + ready) / 1000.0);
            }
        }
        let reason = match status {
            TurnStatus::Committed => "completed",
            TurnStatus::Timeout => "timeout",
            TurnStatus::Interrupted | TurnStatus::Aborted => "user",
            TurnStatus::MemoryLimit | TurnStatus::PidsLimit | TurnStatus::DiskLimit => "resource",
            _ => "error",
        };
        self.terminations
            .get_or_create(&labels(&[("reason", reason)]))
            .inc();
    }

    pub fn health_check(&self, ok: bool) {
        self.health_checks
            .get_or_create(&labels(&[
                ("type", "readiness"),
                ("status", if ok { "success" } else { "failure" }),
            ]))
            .inc();
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Serves GET /metrics on `addr` from a thread; returns the bound address.
pub fn serve_http(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let mut reader = BufReader::new(&conn);
                let mut first = String::new();
                if reader.read_line(&mut first).is_err() {
                    continue;
                }
                // Drain the headers.
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let path = first.split_whitespace().nth(1).unwrap_or("");
                let (status, ctype, body) = if first.starts_with("GET ") && (path == "/metrics" || path == "/") {
                    (
                        "200 OK",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        metrics.render(),
                    )
                } else {
                    ("404 Not Found", "text/plain", "GET /metrics\n".to_owned())
                };
                let _ = write!(
                    &conn,
                    "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        })?;
    Ok(bound)
}
