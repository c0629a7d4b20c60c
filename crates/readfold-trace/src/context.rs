//! W3C trace context (<https://www.w3.org/TR/trace-context/>): the ids a
//! span is known by, carried between processes as a `traceparent` header.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of a version-00 `traceparent`: `00-<32 hex>-<16 hex>-<2 hex>`.
pub const TRACEPARENT_LEN: usize = 55;

/// The trace a span belongs to: 16 bytes, never all zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// A span within its trace: 8 bytes, never all zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

/// What a child span needs of its parent, and what a header carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpanContext {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// Whether the trace is recorded: decided once, where it starts, and
    /// followed by every hop after.
    pub sampled: bool,
}

impl TraceId {
    pub fn random() -> TraceId {
        let mut id = [0; 16];
        id[..8].copy_from_slice(&nonzero_random().to_be_bytes());
        id[8..].copy_from_slice(&random_u64().to_be_bytes());
        TraceId(id)
    }
}

impl SpanId {
    pub fn random() -> SpanId {
        SpanId(nonzero_random().to_be_bytes())
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl SpanContext {
    /// A new trace's first span.
    pub fn root(sampled: bool) -> SpanContext {
        SpanContext {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            sampled,
        }
    }

    /// A new span of the same trace, with the same sampling decision.
    pub fn child(&self) -> SpanContext {
        SpanContext {
            span_id: SpanId::random(),
            ..*self
        }
    }

    /// The `traceparent` header value (version 00).
    pub fn traceparent(&self) -> String {
        self.to_string()
    }

    /// Reads a `traceparent` header value. Versions above 00 are read as
    /// 00 (their first four fields keep their meaning, as the spec asks);
    /// anything malformed, or with an all-zero id, is `None`: the record is
    /// then simply not traced.
    pub fn parse(header: &[u8]) -> Option<SpanContext> {
        let text = std::str::from_utf8(header).ok()?.trim();
        let mut fields = text.split('-');
        let version = fields.next()?;
        let trace_id = fields.next()?;
        let span_id = fields.next()?;
        let flags = fields.next()?;
        let version = u8::from_str_radix(version, 16)
            .ok()
            .filter(|_| version.len() == 2)?;
        // Version ff is invalid; 00 has exactly four fields.
        if version == 0xff || (version == 0 && fields.next().is_some()) {
            return None;
        }
        let trace_id = TraceId(hex_array(trace_id)?);
        let span_id = SpanId(hex_array(span_id)?);
        let [flags] = hex_array::<1>(flags)?;
        if trace_id.0 == [0; 16] || span_id.0 == [0; 8] {
            return None;
        }
        Some(SpanContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }
}

impl fmt::Display for SpanContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flags = if self.sampled { "01" } else { "00" };
        write!(f, "00-{}-{}-{flags}", self.trace_id, self.span_id)
    }
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
}

/// `N` bytes from exactly `2N` hex digits (lowercase, as the spec writes
/// them; uppercase is taken too).
fn hex_array<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A random number: SipHash, keyed at random per thread, over a counter.
/// Ids need to be unique, not secret.
pub(crate) fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.finish()
}

fn nonzero_random() -> u64 {
    loop {
        let n = random_u64();
        if n != 0 {
            return n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_reads_back_as_written() {
        let context = SpanContext::root(true);
        let header = context.traceparent();
        assert_eq!(header.len(), TRACEPARENT_LEN);
        assert_eq!(SpanContext::parse(header.as_bytes()), Some(context));
        let unsampled = SpanContext::root(false);
        assert!(unsampled.traceparent().ends_with("-00"));
        assert_eq!(
            SpanContext::parse(unsampled.traceparent().as_bytes()),
            Some(unsampled)
        );
    }

    #[test]
    fn the_specs_example_is_read() {
        let context = SpanContext::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(context.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.span_id.to_string(), "00f067aa0ba902b7");
        assert!(context.sampled);
        // A later version keeps its first four fields' meaning.
        let later =
            SpanContext::parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-extra").unwrap();
        assert_eq!(later, context);
    }

    #[test]
    fn malformed_headers_are_not_traced() {
        for header in [
            &b""[..],
            b"garbage",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
            b"\xff\xfe",
        ] {
            assert_eq!(
                SpanContext::parse(header),
                None,
                "{:?}",
                String::from_utf8_lossy(header)
            );
        }
    }

    #[test]
    fn ids_differ_and_are_never_zero() {
        let ids: std::collections::HashSet<_> = (0..10_000).map(|_| SpanId::random()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(!ids.contains(&SpanId([0; 8])));
        let child = SpanContext::root(true).child();
        assert!(child.sampled);
    }
}
