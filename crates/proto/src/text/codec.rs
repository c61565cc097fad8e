//! The text format of Login and Text PDU data segments (RFC 7143 section 6):
//! `key=value` pairs, each followed by one NUL byte, possibly spread over
//! several PDUs with the C (continue) bit set on all but the last.
//!
//! Parsing is bounded before anything is allocated: a key is at most
//! [`MAX_KEY_LEN`] bytes, a value at most [`MAX_VALUE_LEN`] (or
//! [`MAX_LARGE_VALUE_LEN`] for the keys that carry large binary values), and
//! an assembled multi-PDU text at most the assembler's limit.

use thiserror::Error;

/// The longest key name RFC 7143 section 6 allows (63 bytes).
pub const MAX_KEY_LEN: usize = 63;
/// The longest ordinary value (255 bytes, section 6).
pub const MAX_VALUE_LEN: usize = 255;
/// The longest encoding of a large binary value (CHAP challenges and
/// responses): 8192 bytes as `0x` plus hexadecimal digits.
pub const MAX_LARGE_VALUE_LEN: usize = 2 + 2 * 8192;
/// The default bound on one assembled text (all PDUs of one C-bit sequence).
pub const DEFAULT_MAX_TEXT_LEN: usize = 64 * 1024;

/// One `key=value` pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextPair {
    /// The key name, e.g. `MaxBurstLength`.
    pub key: String,
    /// The value exactly as sent (a list keeps its commas).
    pub value: String,
}

impl TextPair {
    /// A pair from anything string-like.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        TextPair {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// Why a text could not be parsed or assembled. Every one is the peer's
/// fault; during login it ends the login with status 0x0200 (initiator
/// error) or is answered with a Reject (protocol error) in full feature
/// phase.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum TextError {
    /// A pair without `=`.
    #[error("text pair without '=': {0:?}")]
    MissingEquals(String),
    /// An empty key, or one with characters section 6 does not allow.
    #[error("invalid key name {0:?}")]
    InvalidKey(String),
    /// A key longer than 63 bytes.
    #[error("key of {0} bytes exceeds 63")]
    KeyTooLong(usize),
    /// A value longer than the key allows.
    #[error("value of key {key:?} is {len} bytes, more than {max}")]
    ValueTooLong {
        /// The key whose value is too long.
        key: String,
        /// Its length.
        len: usize,
        /// The limit for this key.
        max: usize,
    },
    /// A value that is not UTF-8.
    #[error("value of key {0:?} is not UTF-8")]
    InvalidValue(String),
    /// The pairs of one text exceed the assembler's limit.
    #[error("text of {len} bytes exceeds the limit of {max}")]
    TextTooLong {
        /// The length reached.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// Whether `key` may carry a large binary value (CHAP challenge/response).
fn allows_large_value(key: &str) -> bool {
    matches!(key, "CHAP_C" | "CHAP_R")
}

/// The characters section 6 allows in a key name: letters, digits, `.`, `-`,
/// `+`, `@`, `_`; `X#` keys also start with `#` after the `X`.
fn valid_key(key: &str) -> bool {
    let body = key.strip_prefix("X#").unwrap_or(key);
    !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+' | b'@' | b'_'))
}

/// Parses a complete text (one data segment, or several assembled) into
/// pairs. Empty strings between NULs (padding some peers leave) are skipped;
/// a last pair without its NUL is accepted.
pub fn parse(text: &[u8]) -> Result<Vec<TextPair>, TextError> {
    let mut pairs = Vec::new();
    for item in text.split(|&b| b == 0) {
        if item.is_empty() {
            continue;
        }
        let equals = item
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| TextError::MissingEquals(lossy_prefix(item)))?;
        let (key, value) = (&item[..equals], &item[equals + 1..]);
        if key.len() > MAX_KEY_LEN {
            return Err(TextError::KeyTooLong(key.len()));
        }
        let key = std::str::from_utf8(key)
            .ok()
            .filter(|k| valid_key(k))
            .ok_or_else(|| TextError::InvalidKey(lossy_prefix(key)))?;
        let max = if allows_large_value(key) {
            MAX_LARGE_VALUE_LEN
        } else {
            MAX_VALUE_LEN
        };
        if value.len() > max {
            return Err(TextError::ValueTooLong {
                key: key.to_owned(),
                len: value.len(),
                max,
            });
        }
        let value =
            std::str::from_utf8(value).map_err(|_| TextError::InvalidValue(key.to_owned()))?;
        pairs.push(TextPair::new(key, value));
    }
    Ok(pairs)
}

/// At most 64 bytes of `bytes`, for error messages.
fn lossy_prefix(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned()
}

/// Appends `pairs` to `out`, each as `key=value` and a NUL.
pub fn encode(pairs: &[TextPair], out: &mut Vec<u8>) {
    for pair in pairs {
        out.extend_from_slice(pair.key.as_bytes());
        out.push(b'=');
        out.extend_from_slice(pair.value.as_bytes());
        out.push(0);
    }
}

/// Splits an encoded text into data segments of at most `max_segment` bytes
/// (the peer's MaxRecvDataSegmentLength), each with its C bit: `true` on
/// every segment but the last (RFC 7143 sections 11.10.2, 11.12.2). An empty
/// text gives one empty, final segment.
pub fn fragment(text: &[u8], max_segment: usize) -> Vec<(&[u8], bool)> {
    let max_segment = max_segment.max(1);
    if text.is_empty() {
        return vec![(text, false)];
    }
    let count = text.len().div_ceil(max_segment);
    text.chunks(max_segment)
        .enumerate()
        .map(|(i, chunk)| (chunk, i + 1 < count))
        .collect()
}

/// Collects the data segments of one C-bit sequence into one text, bounded.
#[derive(Debug)]
pub struct TextAssembler {
    buffer: Vec<u8>,
    max_len: usize,
}

impl Default for TextAssembler {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_TEXT_LEN)
    }
}

impl TextAssembler {
    /// An assembler that refuses texts longer than `max_len` bytes.
    pub fn new(max_len: usize) -> Self {
        TextAssembler {
            buffer: Vec::new(),
            max_len,
        }
    }

    /// Adds one PDU's data segment. With `continues` (the C bit) set, more
    /// follows and `None` is returned; otherwise the whole text is returned
    /// and the assembler is empty again.
    pub fn push(&mut self, segment: &[u8], continues: bool) -> Result<Option<Vec<u8>>, TextError> {
        let len = self.buffer.len().saturating_add(segment.len());
        if len > self.max_len {
            self.buffer.clear();
            return Err(TextError::TextTooLong {
                len,
                max: self.max_len,
            });
        }
        self.buffer.extend_from_slice(segment);
        if continues {
            Ok(None)
        } else {
            Ok(Some(std::mem::take(&mut self.buffer)))
        }
    }

    /// Whether part of a text is waiting for its continuation.
    pub fn is_partial(&self) -> bool {
        !self.buffer.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs_with_and_without_the_last_nul() {
        let pairs = parse(b"HeaderDigest=CRC32C,None\0MaxBurstLength=262144\0").unwrap();
        assert_eq!(
            pairs,
            vec![
                TextPair::new("HeaderDigest", "CRC32C,None"),
                TextPair::new("MaxBurstLength", "262144")
            ]
        );
        assert_eq!(parse(b"A=1").unwrap(), vec![TextPair::new("A", "1")]);
        assert_eq!(parse(b"A=\0\0\0").unwrap(), vec![TextPair::new("A", "")]);
    }

    #[test]
    fn values_may_contain_equals_signs() {
        assert_eq!(parse(b"CHAP_C=0b+/==\0").unwrap()[0].value, "0b+/==");
    }

    #[test]
    fn rejects_malformed_pairs() {
        assert!(matches!(
            parse(b"NoEquals\0"),
            Err(TextError::MissingEquals(_))
        ));
        assert!(matches!(parse(b"=value\0"), Err(TextError::InvalidKey(_))));
        assert!(matches!(
            parse(b"bad key=1\0"),
            Err(TextError::InvalidKey(_))
        ));
        assert!(matches!(
            parse(b"K=\xff\0"),
            Err(TextError::InvalidValue(_))
        ));
        let long_key = format!("{}=1", "K".repeat(64));
        assert_eq!(parse(long_key.as_bytes()), Err(TextError::KeyTooLong(64)));
        let long_value = format!("K={}", "v".repeat(256));
        assert!(matches!(
            parse(long_value.as_bytes()),
            Err(TextError::ValueTooLong { len: 256, .. })
        ));
        let challenge = format!("CHAP_C=0x{}", "ab".repeat(1024));
        assert!(parse(challenge.as_bytes()).is_ok());
    }

    #[test]
    fn extension_keys_are_valid() {
        assert!(parse(b"X-com.example.Key=1\0X#NodeArchitecture=rs\0").is_ok());
    }

    #[test]
    fn encode_then_parse_round_trips() {
        let pairs = vec![TextPair::new("A", "1"), TextPair::new("B", "x,y")];
        let mut out = Vec::new();
        encode(&pairs, &mut out);
        assert_eq!(out, b"A=1\0B=x,y\0");
        assert_eq!(parse(&out).unwrap(), pairs);
    }

    #[test]
    fn fragments_carry_the_continue_bit_on_all_but_the_last() {
        let text = b"0123456789";
        let pieces = fragment(text, 4);
        assert_eq!(
            pieces,
            vec![
                (&b"0123"[..], true),
                (&b"4567"[..], true),
                (&b"89"[..], false)
            ]
        );
        assert_eq!(fragment(b"", 8192), vec![(&b""[..], false)]);
        assert_eq!(fragment(b"1234", 4), vec![(&b"1234"[..], false)]);
    }

    #[test]
    fn assembler_joins_continued_segments_and_bounds_them() {
        let mut assembler = TextAssembler::new(8);
        assert_eq!(assembler.push(b"A=1\0B", true), Ok(None));
        assert!(assembler.is_partial());
        assert_eq!(
            assembler.push(b"=2\0", false),
            Ok(Some(b"A=1\0B=2\0".to_vec()))
        );
        assert!(!assembler.is_partial());
        assert_eq!(assembler.push(b"12345", true), Ok(None));
        assert!(matches!(
            assembler.push(b"6789", false),
            Err(TextError::TextTooLong { len: 9, max: 8 })
        ));
        assert!(!assembler.is_partial(), "a refused text is dropped");
    }
}
