//! OTLP export of the turn spans (issue 28 item 7; seed 002 §9.3), built
//! only with the `otlp` cargo feature (off by default): a
//! `tracing-opentelemetry` layer over the OpenTelemetry SDK's batch
//! processor and its OTLP/HTTP (protobuf) exporter.
//!
//! The spans are the ones every build emits: one per turn, named
//! `agent.execute` for OpenTelemetry (`otel.name`) with the attributes
//! seed 002 §9.3.1 names (`agent.id`, `agent.trust_level`,
//! `agent.runtime_class`, `session.id`), and a child per phase
//! (`turn.plan`, `sandbox.create`, `sandbox.run`, `turn.capture`,
//! `turn.commit`, `sandbox.delete`). Nothing is
//! exported unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) names a collector.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The service name spans are exported under.
pub const SERVICE_NAME: &str = "turnstile-supervise";

/// Shuts the exporter down (flushing what is batched) when dropped.
#[derive(Debug)]
pub struct Guard(SdkTracerProvider);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.shutdown();
    }
}

/// A provider exporting to `endpoint` (a full `/v1/traces` URL), or to
/// what the OTEL_EXPORTER_OTLP_* variables say with `None`.
pub fn provider(endpoint: Option<&str>) -> Result<SdkTracerProvider, String> {
    let mut b = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary);
    if let Some(e) = endpoint {
        b = b.with_endpoint(e);
    }
    let exporter = b.build().map_err(|e| e.to_string())?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(SERVICE_NAME)
                .build(),
        )
        .build())
}

/// The tracing layer exporting through `provider`.
pub fn layer<S>(
    provider: &SdkTracerProvider,
) -> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("turnstile"))
}

/// The exporter the environment asks for: `None` when no endpoint is set
/// (or it cannot be built: said on stderr, the run goes on unexported).
pub fn from_env() -> Option<SdkTracerProvider> {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    if !set("OTEL_EXPORTER_OTLP_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return None;
    }
    match provider(None) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("supervise: OTLP export disabled: {e}");
            None
        }
    }
}

/// Keeps the provider until the process ends.
pub fn guard(p: SdkTracerProvider) -> Guard {
    Guard(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use tracing_subscriber::layer::SubscriberExt;

    /// A collector stub on loopback (set up by the test) receives the turn
    /// span over OTLP/HTTP, named `agent.execute`, with its attributes.
    #[test]
    fn issue_28_otlp_exports_the_turn_span_to_a_collector() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let collector = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut r = BufReader::new(&conn);
            let mut first = String::new();
            r.read_line(&mut first).unwrap();
            let mut len = 0usize;
            let mut ctype = String::new();
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap();
                if h.trim().is_empty() {
                    break;
                }
                let lower = h.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                if let Some(v) = lower.strip_prefix("content-type:") {
                    ctype = v.trim().to_owned();
                }
            }
            let mut body = vec![0u8; len];
            r.read_exact(&mut body).unwrap();
            (&conn)
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
                .unwrap();
            (first, ctype, body)
        });
        let p = provider(Some(&format!("http://{addr}/v1/traces"))).unwrap();
        let subscriber = tracing_subscriber::registry().with(layer(&p));
        tracing::subscriber::with_default(subscriber, || {
            let s = tracing::info_span!(
                "turn",
                "otel.name" = "agent.execute",
                "agent.id" = "hello-agent",
                "session.id" = "SES-test",
            );
            let _g = s.enter();
            let _c = tracing::info_span!("phase", "otel.name" = "sandbox.create").entered();
        });
        p.shutdown().unwrap();
        let (first, ctype, body) = collector.join().unwrap();
        assert!(first.starts_with("POST /v1/traces "), "{first}");
        assert_eq!(ctype, "application/x-protobuf");
        let has = |s: &str| body.windows(s.len()).any(|w| w == s.as_bytes());
        for s in [
            "agent.execute",
            "sandbox.create",
            "hello-agent",
            "SES-test",
            SERVICE_NAME,
        ] {
            assert!(has(s), "{s} not in the exported spans");
        }
    }
}
