//! What the fuzz targets share: an allocation guard, the generic Avro
//! reader the decoders are held to, and the input layouts that the targets
//! and the corpus generator agree on.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::Schema;
use readfold_wire::codec::{
    self, ConversationEventRecord, CursorKeyRecord, CursorUpdateRecord, EventRecord, MemberStateRecord,
    ReadAction, ReadReportRecord, UserCursorKeyRecord,
};

// ---------------------------------------------------------------------------
// The allocation guard.

/// Largest single allocation a decoder may make, whatever the input: a
/// decoder that trusts a length field before checking it against the bytes
/// it has (a 10-byte record claiming a 16 MiB string) goes over this.
pub const FIXED_ALLOWANCE: usize = 64 * 1024;
/// What each input byte adds to the allowance (a string copied out of the
/// input, an error message quoting it).
pub const PER_INPUT_BYTE: usize = 16;

static ARMED: AtomicBool = AtomicBool::new(false);
static INPUT_LEN: AtomicUsize = AtomicUsize::new(0);

/// A global allocator that aborts on any single allocation larger than
/// `FIXED_ALLOWANCE + PER_INPUT_BYTE * input length` while a target runs its
/// input (see [`guarded`]); afl-fuzz records the abort as a crash.
pub struct AllocGuard;

impl AllocGuard {
    #[inline]
    fn check(size: usize) {
        if ARMED.load(Ordering::Relaxed) {
            let len = INPUT_LEN.load(Ordering::Relaxed);
            let limit = FIXED_ALLOWANCE.saturating_add(PER_INPUT_BYTE.saturating_mul(len));
            if size > limit {
                ARMED.store(false, Ordering::Relaxed);
                // Formatting to stderr does not allocate.
                eprintln!("allocation guard: {size} bytes requested for a {len}-byte input (limit {limit})");
                std::process::abort();
            }
        }
    }
}

unsafe impl GlobalAlloc for AllocGuard {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::check(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::check(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::check(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Runs one input with the allocation guard armed. The schemas and readers
/// are built before arming: they are the process's, not the input's.
pub fn guarded(data: &[u8], run: impl FnOnce(&[u8])) {
    warm_up();
    INPUT_LEN.store(data.len(), Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    run(data);
    ARMED.store(false, Ordering::Relaxed);
}

/// Runs the oracle with the guard off: it is the generic reader without
/// readfold-wire's length check, not the code under test.
fn unguarded<T>(run: impl FnOnce() -> T) -> T {
    let armed = ARMED.swap(false, Ordering::Relaxed);
    let result = run();
    ARMED.store(armed, Ordering::Relaxed);
    result
}

/// Builds the schemas and readers, the crate's and the oracle's. Call it
/// before `afl::fuzz!` so that the fork server's children start warm (and
/// the first input runs the same code as the others).
pub fn warm_up() {
    static WARM: OnceLock<()> = OnceLock::new();
    WARM.get_or_init(|| {
        // A failed check reports with the guard off (a backtrace allocates).
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            ARMED.store(false, Ordering::Relaxed);
            report(info)
        }));
        // Parses the schemas (and sets the Avro allocation limit) and
        // resolves every reader, the crate's and the oracle's.
        let _ = codec::decode_read_report(
            &codec::encode_read_report(&sample_report()),
            codec::WireFormat::Plain,
        );
        let _ = codec::decode_read_report(
            &codec::encode_historic_read_report(&sample_report()),
            codec::WireFormat::Plain,
        );
        let _ = codec::decode_conversation_event(b"", codec::WireFormat::Plain);
        let _ = codec::decode_cursor_key(b"");
        let _ = codec::decode_user_cursor_key(b"");
        let _ = codec::decode_cursor_update(b"");
        let _ = codec::decode_member_state(b"");
        let _ = readers();
    });
}

fn sample_report() -> ReadReportRecord {
    ReadReportRecord {
        conversation_id: "G".into(),
        user_id: "u".into(),
        seq: 1,
        device_id: None,
        reported_at: 0,
        private: false,
        action: ReadAction::Read,
    }
}

// ---------------------------------------------------------------------------
// The oracle: apache-avro's generic reader over the compiled-in schemas,
// mapped to the records independently of readfold-wire's own mapping. The
// hand-written decoders (`codec::fast`) promise to accept exactly what this
// reader accepts for the current schema and to decode it the same; where
// they give up, the crate falls back to this reader, the current schema
// first, then the earlier versions. So every public decoder must agree
// with it, byte for byte of the record.

struct Readers {
    read_report: Vec<GenericDatumReader<'static>>,
    conversation_event: Vec<GenericDatumReader<'static>>,
    cursor_key: Vec<GenericDatumReader<'static>>,
    user_cursor_key: Vec<GenericDatumReader<'static>>,
    cursor_update: Vec<GenericDatumReader<'static>>,
    member_state: Vec<GenericDatumReader<'static>>,
}

fn readers() -> &'static Readers {
    static READERS: OnceLock<Readers> = OnceLock::new();
    READERS.get_or_init(|| {
        let s = codec::schemas();
        let chain = |current: &'static Schema, history: &'static [Schema]| {
            let mut readers = vec![GenericDatumReader::builder(current).build().expect("schema")];
            readers.extend(history.iter().map(|old| {
                GenericDatumReader::builder(old)
                    .reader_schema(current)
                    .build()
                    .expect("history schema")
            }));
            readers
        };
        Readers {
            read_report: chain(&s.read_report, &s.read_report_history),
            conversation_event: chain(&s.conversation_event, &[]),
            cursor_key: chain(&s.cursor_key, &[]),
            user_cursor_key: chain(&s.user_cursor_key, &[]),
            cursor_update: chain(&s.cursor_update, &s.cursor_update_history),
            member_state: chain(&s.member_state, &[]),
        }
    })
}

/// Bytes that end: reading past them is an error, not the `UnexpectedEof`
/// that apache-avro reads as a null (in a union index, a boolean or a
/// string), so that the oracle holds to the Avro encoding: a record cut
/// short is no record.
struct Strict<'a>(&'a [u8]);

impl std::io::Read for Strict<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.0.is_empty() && !buf.is_empty() {
            return Err(std::io::Error::other("end of the record"));
        }
        self.0.read(buf)
    }
}

/// The first reader of the chain that reads all of `bytes` into a record
/// that maps.
fn oracle<T>(chain: &[GenericDatumReader<'static>], bytes: &[u8], map: fn(Value) -> Option<T>) -> Option<T> {
    unguarded(|| {
        chain.iter().find_map(|reader| {
            let mut rest = Strict(bytes);
            let value = reader.read_value(&mut rest).ok()?;
            if !rest.0.is_empty() {
                return None;
            }
            map(value)
        })
    })
}

/// A record's fields, in schema order.
struct Fields(std::vec::IntoIter<(String, Value)>);

impl Fields {
    fn of(value: Value) -> Option<Self> {
        match value {
            Value::Record(fields) => Some(Fields(fields.into_iter())),
            _ => None,
        }
    }
    fn next(&mut self) -> Option<Value> {
        self.0.next().map(|(_, v)| v)
    }
    fn string(&mut self) -> Option<String> {
        match self.next()? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    fn long(&mut self) -> Option<i64> {
        match self.next()? {
            Value::Long(n) | Value::TimestampMillis(n) => Some(n),
            _ => None,
        }
    }
    fn boolean(&mut self) -> Option<bool> {
        match self.next()? {
            Value::Boolean(b) => Some(b),
            _ => None,
        }
    }
    /// A `["null", T]` union.
    fn optional(&mut self) -> Option<Option<Value>> {
        match self.next()? {
            Value::Union(0, inner) if *inner == Value::Null => Some(None),
            Value::Union(1, inner) => Some(Some(*inner)),
            _ => None,
        }
    }
    fn optional_long(&mut self) -> Option<Option<i64>> {
        match self.optional()? {
            None => Some(None),
            Some(Value::Long(n)) => Some(Some(n)),
            Some(_) => None,
        }
    }
    fn end<T>(mut self, value: T) -> Option<T> {
        self.0.next().is_none().then_some(value)
    }
}

fn map_read_report(value: Value) -> Option<ReadReportRecord> {
    let mut f = Fields::of(value)?;
    let record = ReadReportRecord {
        conversation_id: f.string()?,
        user_id: f.string()?,
        seq: f.long()?,
        device_id: match f.optional()? {
            None => None,
            Some(Value::String(s)) => Some(s),
            Some(_) => return None,
        },
        reported_at: f.long()?,
        private: f.boolean()?,
        action: match f.next()? {
            Value::Enum(0, s) if s == "READ" => ReadAction::Read,
            Value::Enum(1, s) if s == "MARK_UNREAD" => ReadAction::MarkUnread,
            Value::Enum(2, s) if s == "CLEAR_UNREAD_MARK" => ReadAction::ClearUnreadMark,
            _ => return None,
        },
    };
    f.end(record)
}

fn map_conversation_event(value: Value) -> Option<ConversationEventRecord> {
    let mut f = Fields::of(value)?;
    let conversation_id = f.string()?;
    let seq = f.long()?;
    let at = f.long()?;
    let event = match f.next()? {
        Value::Union(branch, inner) => {
            let mut g = Fields::of(*inner)?;
            let id = g.string()?;
            let event = match branch {
                0 => EventRecord::MessageSent { sender_id: id },
                1 => EventRecord::MemberJoined { user_id: id },
                2 => EventRecord::MemberLeft { user_id: id },
                _ => return None,
            };
            g.end(event)?
        }
        _ => return None,
    };
    f.end(ConversationEventRecord {
        conversation_id,
        seq,
        at,
        event,
    })
}

fn map_cursor_key(value: Value) -> Option<CursorKeyRecord> {
    let mut f = Fields::of(value)?;
    let record = CursorKeyRecord {
        conversation_id: f.string()?,
        user_id: f.string()?,
    };
    f.end(record)
}

fn map_user_cursor_key(value: Value) -> Option<UserCursorKeyRecord> {
    let mut f = Fields::of(value)?;
    let record = UserCursorKeyRecord {
        user_id: f.string()?,
        conversation_id: f.string()?,
    };
    f.end(record)
}

fn map_cursor_update(value: Value) -> Option<CursorUpdateRecord> {
    let mut f = Fields::of(value)?;
    let record = CursorUpdateRecord {
        conversation_id: f.string()?,
        user_id: f.string()?,
        cursor: f.long()?,
        join_seq: f.long()?,
        latest_seq: f.long()?,
        updated_at: f.long()?,
        private_cursor: f.optional_long()?,
        unread_mark: match f.optional()? {
            None => None,
            Some(Value::Boolean(b)) => Some(b),
            Some(_) => return None,
        },
    };
    f.end(record)
}

fn map_member_state(value: Value) -> Option<MemberStateRecord> {
    let mut f = Fields::of(value)?;
    let record = MemberStateRecord {
        conversation_id: f.string()?,
        user_id: f.string()?,
        private_cursor: f.long()?,
        mark_at: f.optional_long()?,
        mark_seq: f.optional_long()?,
        left: f.boolean()?,
        membership_seq: f.optional_long()?,
        membership_at: f.optional_long()?,
        epoch: f.long()?,
        updated_at: f.long()?,
    };
    f.end(record)
}

pub fn generic_read_report(bytes: &[u8]) -> Option<ReadReportRecord> {
    oracle(&readers().read_report, bytes, map_read_report)
}

pub fn generic_conversation_event(bytes: &[u8]) -> Option<ConversationEventRecord> {
    oracle(&readers().conversation_event, bytes, map_conversation_event)
}

pub fn generic_cursor_key(bytes: &[u8]) -> Option<CursorKeyRecord> {
    oracle(&readers().cursor_key, bytes, map_cursor_key)
}

pub fn generic_user_cursor_key(bytes: &[u8]) -> Option<UserCursorKeyRecord> {
    oracle(&readers().user_cursor_key, bytes, map_user_cursor_key)
}

pub fn generic_cursor_update(bytes: &[u8]) -> Option<CursorUpdateRecord> {
    oracle(&readers().cursor_update, bytes, map_cursor_update)
}

pub fn generic_member_state(bytes: &[u8]) -> Option<MemberStateRecord> {
    oracle(&readers().member_state, bytes, map_member_state)
}

// ---------------------------------------------------------------------------
// Framing: what `WireFormat` promises, as the targets check it.

use codec::{DecodeError, WireFormat};

/// Checks `decode` under the three formats against its plain reading, and
/// returns the plain result. `Confluent` reads the bytes after a 5-byte
/// header that starts with 0; `Auto` reads bytes that start with 0 as a
/// frame first and as plain Avro after, and other bytes as plain Avro.
pub fn check_framing<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    decode: impl Fn(&[u8], WireFormat) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    let plain = decode(data, WireFormat::Plain);
    let confluent = decode(data, WireFormat::Confluent);
    let auto = decode(data, WireFormat::Auto);
    match data {
        [] => {
            assert_eq!(plain, Err(DecodeError::Empty));
            assert_eq!(confluent, Err(DecodeError::Empty));
            assert_eq!(auto, Err(DecodeError::Empty));
        }
        [first, ..] if *first != 0 => {
            assert_eq!(confluent, Err(DecodeError::BadMagic(*first)));
            assert_eq!(auto, plain);
        }
        _ if data.len() < 5 => {
            assert_eq!(confluent, Err(DecodeError::ShortFrame));
            assert_eq!(auto.as_ref().ok(), plain.as_ref().ok());
        }
        _ => {
            let inner = decode(&data[5..], WireFormat::Plain).ok();
            assert_eq!(confluent.as_ref().ok(), inner.as_ref());
            assert_eq!(auto.as_ref().ok(), inner.as_ref().or(plain.as_ref().ok()));
        }
    }
    plain
}

// ---------------------------------------------------------------------------
// Input layouts of the targets that take more than one byte string.

/// Splits `data` into a key of at most `data[0]` bytes and the rest.
pub fn split_key(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let (&len, rest) = data.split_first()?;
    Some(rest.split_at(usize::from(len).min(rest.len())))
}

/// Prefixes a key with its length (at most 255 bytes), as `split_key` reads it.
pub fn join_key(key: &[u8], rest: &[u8]) -> Vec<u8> {
    let len = u8::try_from(key.len()).expect("key of at most 255 bytes");
    let mut out = vec![len];
    out.extend_from_slice(key);
    out.extend_from_slice(rest);
    out
}

// ---------------------------------------------------------------------------
// Validation, as the targets expect it.

use readfold_wire::{Limits, RejectReason};

/// The `[input]` defaults of `config/default.toml`.
pub fn default_limits() -> Limits {
    Limits {
        format: WireFormat::Auto,
        max_id_bytes: 256,
        max_seq: 1_000_000_000_000,
        check_partitioning: true,
    }
}

/// What validation must say of ids and a seq, checked in this order: each
/// id non-empty and at most `max_id_bytes`, then `min <= seq <= max_seq`.
pub fn expected_rejection(ids: &[&str], seq: i64, min_seq: u64, limits: &Limits) -> Option<RejectReason> {
    for id in ids {
        if id.is_empty() {
            return Some(RejectReason::EmptyId);
        }
        if id.len() > limits.max_id_bytes {
            return Some(RejectReason::IdTooLong);
        }
    }
    match u64::try_from(seq) {
        Ok(n) if n >= min_seq && n <= limits.max_seq => None,
        _ => Some(RejectReason::SeqOutOfRange),
    }
}

// ---------------------------------------------------------------------------
// Checkpoint files.

/// `input` (a header's length as a u32, the header, then the body) sealed
/// as a checkpoint file of the current format, with right checksums; too
/// short for a length, the whole input is the header.
pub fn checkpoint_file(input: &[u8]) -> Vec<u8> {
    let (header, body) = match input.split_first_chunk::<4>() {
        Some((len, rest)) => rest.split_at((u32::from_le_bytes(*len) as usize).min(rest.len())),
        None => (input, &[][..]),
    };
    readfold_wire::checkpoint::seal(header, body)
}
