//! OpenTelemetry traces of `cordon serve`, exported over OTLP/HTTP
//! (`--otlp ENDPOINT`, or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
//!
//! A call's spans are made from its audit record, as its metrics are
//! ([`crate::metrics`]): [`Traces`] is a [`RecordObserver`] of the broker's
//! auditor, so what a trace shows is what the log recorded, measured once.
//! The gateway gives every `tools/call` a [`TraceContext`]: the agent's
//! own when its request carries a W3C `traceparent` in `_meta` (SEP-414),
//! else a new trace when traces are exported. Its record then becomes a
//! server span `tools/call NAME`, a child of the agent's span, with one
//! child per phase the record measured (`admission`, `sandbox start`,
//! `run`, `gate`) and `audit write`, the time the record took to write.
//!
//! Attributes are the tool's name, profile, runtime and tenant and the
//! call's status: never its input, output, arguments, refusal text, the
//! session's id or a credential. Spans wait in the SDK's batch processor
//! (a bounded queue: a collector that is slow or gone drops spans, it
//! never holds a call) and leave on its own thread.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use cordon_audit::{AuditRecord, RecordObserver, Status as A, TraceContext};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanLinks,
    SpanProcessor,
};

/// The environment variables that turn traces on without `--otlp`.
pub const ENDPOINT_ENV: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Exports the spans of every traced call.
pub struct Traces {
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
    /// Where the spans go, for the log.
    endpoint: String,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

/// Whether the environment names an OTLP endpoint.
pub fn endpoint_in_env() -> Option<String> {
    ENDPOINT_ENV
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
}

impl Traces {
    /// Export to `base` (an OTLP/HTTP base URL, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is: `/v1/traces` is appended), or, when
    /// `None`, where the standard environment variables say. Must not be
    /// called from within an async runtime (the exporter's HTTP client is
    /// a blocking one, on the processor's own thread).
    pub fn export(base: Option<&str>) -> Result<Traces, String> {
        // An https collector is reached with cordon's own TLS provider.
        crate::install_crypto_provider();
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
        let endpoint = match base {
            Some(b) => {
                let url = format!("{}/v1/traces", b.trim_end_matches('/'));
                builder = builder.with_endpoint(url.clone());
                url
            }
            None => endpoint_in_env().unwrap_or_default(),
        };
        let exporter = builder
            .build()
            .map_err(|e| format!("the OTLP trace exporter for {endpoint}: {e}"))?;
        let mut processor = BatchSpanProcessor::builder(exporter).build();
        processor.set_resource(
            &Resource::builder_empty()
                .with_service_name("cordon")
                .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                .build(),
        );
        Ok(Traces {
            processor,
            scope: InstrumentationScope::builder("cordon")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            endpoint,
        })
    }

    /// Where the spans go.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Send the spans still waiting and stop (at most `within`).
    pub fn shutdown(&self, within: Duration) {
        if let Err(e) = self.processor.shutdown_with_timeout(within) {
            eprintln!("cordon: the last spans were not exported: {e}");
        }
    }

    /// The spans of one call's record, ended `now` (the record was just
    /// written, in `write`).
    fn spans(&self, rec: &AuditRecord, t: &TraceContext, now: SystemTime, write: Duration) {
        let (Some(trace_id), Some(span_id)) = (trace_id(&t.trace_id), span_id(&t.span_id)) else {
            return;
        };
        let parent = t.parent_span_id.as_deref().and_then(span_id_of);
        let timings = rec.timings.unwrap_or_default();
        let phases: u64 = timings.phases().map(|(_, us)| us).sum();
        let total = Duration::from_micros(phases.max(rec.duration_ms.saturating_mul(1000)));
        // The phases end where the record was written.
        let ended = now.checked_sub(write).unwrap_or(now);
        let began = ended.checked_sub(total).unwrap_or(ended);
        let ctx = SpanContext::new(
            trace_id,
            span_id,
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let failed = !matches!(rec.status, A::Ok);
        let status = rec.status.as_str();
        let mut attributes = vec![
            KeyValue::new("mcp.method.name", "tools/call"),
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.name", rec.tool.clone()),
            KeyValue::new("cordon.profile", rec.profile.clone()),
            KeyValue::new("cordon.runtime", rec.runtime.clone()),
            KeyValue::new("cordon.status", status),
        ];
        if let Some(tenant) = &rec.tenant {
            attributes.push(KeyValue::new("cordon.tenant", tenant.clone()));
        }
        if failed {
            attributes.push(KeyValue::new("error.type", status));
        }
        let ids = RandomIdGenerator::default();
        let mut at = began;
        let mut children: Vec<(&'static str, SystemTime, SystemTime)> = timings
            .phases()
            .map(|(phase, us)| {
                let start = at;
                at += Duration::from_micros(us);
                (phase_span_name(phase), start, at)
            })
            .collect();
        children.push(("audit write", ended, now));
        for (name, start, end) in children {
            self.processor.on_end(SpanData {
                span_context: SpanContext::new(
                    trace_id,
                    ids.new_span_id(),
                    TraceFlags::SAMPLED,
                    false,
                    TraceState::default(),
                ),
                parent_span_id: span_id,
                parent_span_is_remote: false,
                span_kind: SpanKind::Internal,
                name: Cow::Borrowed(name),
                start_time: start,
                end_time: end,
                attributes: Vec::new(),
                dropped_attributes_count: 0,
                events: SpanEvents::default(),
                links: SpanLinks::default(),
                status: Status::Unset,
                instrumentation_scope: self.scope.clone(),
            });
        }
        self.processor.on_end(SpanData {
            span_context: ctx,
            parent_span_id: parent.unwrap_or(SpanId::INVALID),
            parent_span_is_remote: parent.is_some(),
            span_kind: SpanKind::Server,
            name: Cow::Owned(format!("tools/call {}", rec.tool)),
            start_time: began,
            end_time: now,
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: if failed {
                Status::error(status)
            } else {
                Status::Ok
            },
            instrumentation_scope: self.scope.clone(),
        });
    }
}

impl RecordObserver for Traces {
    fn recorded(&self, rec: &AuditRecord) {
        self.recorded_in(rec, Duration::ZERO)
    }

    fn recorded_in(&self, rec: &AuditRecord, write: Duration) {
        if let Some(t) = &rec.trace
            && t.sampled
        {
            self.spans(rec, t, SystemTime::now(), write);
        }
    }
}

/// The trace a `tools/call` belongs to: the agent's when its `_meta`
/// carries a valid `traceparent` (a malformed one is ignored, as W3C
/// trace context says), else a new one when traces are exported (`on`).
/// The call's own span id is new either way.
pub(crate) fn context_of(meta: &rmcp::model::MetaObject, on: bool) -> Option<TraceContext> {
    let agents = meta.get_traceparent().and_then(parse_traceparent);
    if agents.is_none() && !on {
        // Nothing to record: no id is made.
        return None;
    }
    let ids = RandomIdGenerator::default();
    let span_id = ids.new_span_id().to_string();
    Some(match agents {
        Some((trace, parent, sampled)) => TraceContext {
            trace_id: trace.to_string(),
            span_id,
            parent_span_id: Some(parent.to_string()),
            sampled,
        },
        None => TraceContext {
            trace_id: ids.new_trace_id().to_string(),
            span_id,
            parent_span_id: None,
            sampled: true,
        },
    })
}

/// A W3C `traceparent` (`VERSION-TRACEID-PARENTID-FLAGS`, lowercase hex):
/// the trace, the parent span and whether it is sampled. Version `ff`,
/// all-zero ids, and other lengths than version 00's are invalid; a
/// later version may append fields after the flags.
fn parse_traceparent(v: &str) -> Option<(TraceId, SpanId, bool)> {
    let mut parts = v.trim().split('-');
    let version = parts.next()?;
    let trace = parts.next()?;
    let parent = parts.next()?;
    let flags = parts.next()?;
    let rest = parts.next();
    if !lower_hex(version, 2) || version == "ff" || !lower_hex(flags, 2) {
        return None;
    }
    if version == "00" && rest.is_some() {
        return None;
    }
    let trace = trace_id(trace).filter(|t| *t != TraceId::INVALID)?;
    let parent = span_id_of(parent)?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some((trace, parent, flags & 1 == 1))
}

/// `n` lowercase hex digits, as trace context writes its fields.
fn lower_hex(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn trace_id(s: &str) -> Option<TraceId> {
    if !lower_hex(s, 32) {
        return None;
    }
    TraceId::from_hex(s).ok()
}

fn span_id(s: &str) -> Option<SpanId> {
    if !lower_hex(s, 16) {
        return None;
    }
    SpanId::from_hex(s).ok()
}

/// A span id that is valid (not all zero).
fn span_id_of(s: &str) -> Option<SpanId> {
    span_id(s).filter(|id| *id != SpanId::INVALID)
}

fn phase_span_name(phase: &'static str) -> &'static str {
    match phase {
        "start" => "sandbox start",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_parsed_as_w3c_trace_context_says() {
        let (t, p, sampled) =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(t.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.to_string(), "00f067aa0ba902b7");
        assert!(sampled);
        let (_, _, sampled) =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!sampled);
        // A later version may add fields.
        assert!(
            parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x")
                .is_some()
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_call_joins_the_agents_trace_or_begins_one_only_when_exporting() {
        let mut meta = rmcp::model::MetaObject::default();
        assert_eq!(context_of(&meta, false), None);
        let own = context_of(&meta, true).unwrap();
        assert_eq!(own.trace_id.len(), 32);
        assert_eq!(own.span_id.len(), 16);
        assert_eq!(own.parent_span_id, None);
        assert!(own.sampled);
        meta.insert(
            "traceparent".into(),
            serde_json::json!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        for on in [false, true] {
            let t = context_of(&meta, on).unwrap();
            assert_eq!(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
            assert_eq!(t.parent_span_id.as_deref(), Some("00f067aa0ba902b7"));
            assert_ne!(t.span_id, "00f067aa0ba902b7");
        }
        meta.insert("traceparent".into(), serde_json::json!("garbage"));
        assert_eq!(context_of(&meta, false), None);
        assert_eq!(context_of(&meta, true).unwrap().parent_span_id, None);
    }
}
