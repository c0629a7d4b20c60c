//! Domain newtypes: conversation and user ids, message sequence numbers.
//!
//! Ids are [`SmolStr`]s: an id of up to 23 bytes (numeric and most
//! snowflake ids) is held inline, so decoding a record allocates nothing for
//! it and a map lookup compares it without following a pointer; a longer
//! one is one shared allocation. Either clones in O(1).

use std::fmt;
use std::str::FromStr;

use smol_str::SmolStr;

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("id is empty")]
    Empty,
    #[error("id is {len} bytes, longer than the limit of {max}")]
    TooLong { len: usize, max: usize },
}

/// Longest id accepted by `FromStr`; the processor's limit is configurable.
pub const DEFAULT_MAX_ID_BYTES: usize = 256;

macro_rules! id_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(SmolStr);

        impl $name {
            /// Checks emptiness and length (in UTF-8 bytes).
            pub fn parse(s: &str, max_bytes: usize) -> Result<Self, IdError> {
                if s.is_empty() {
                    return Err(IdError::Empty);
                }
                if s.len() > max_bytes {
                    return Err(IdError::TooLong { len: s.len(), max: max_bytes });
                }
                Ok(Self(SmolStr::new(s)))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        /// A clone: lets maps insert a key looked up by reference.
        impl From<&$name> for $name {
            fn from(id: &$name) -> Self {
                id.clone()
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s, DEFAULT_MAX_ID_BYTES)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", &*self.0)
            }
        }
    };
}

id_newtype!(
    /// Identifies a conversation (1:1 chat or group); the input topics' key.
    ConversationId
);
id_newtype!(
    /// Identifies a user.
    UserId
);

/// A message sequence number within a conversation. Messages are numbered
/// 1, 2, 3, ...; 0 is the cursor of someone who has read nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Debug)]
pub struct Seq(pub u64);

impl Seq {
    pub const ZERO: Seq = Seq(0);

    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Seq {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Seq)
    }
}

/// The identity of one cursor: a member of a conversation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct CursorKey {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_reject_empty_and_long() {
        assert_eq!("".parse::<UserId>(), Err(IdError::Empty));
        let long = "x".repeat(DEFAULT_MAX_ID_BYTES + 1);
        assert!(matches!(long.parse::<UserId>(), Err(IdError::TooLong { .. })));
        assert_eq!("alice".parse::<UserId>().unwrap().as_str(), "alice");
    }

    #[test]
    fn id_length_counts_utf8_bytes() {
        // 3 bytes per char.
        assert!(ConversationId::parse("群群", 6).is_ok());
        assert!(ConversationId::parse("群群群", 6).is_err());
    }

    #[test]
    fn seq_parses() {
        assert_eq!("42".parse::<Seq>().unwrap(), Seq(42));
        assert!("-1".parse::<Seq>().is_err());
    }
}
