//! Canonical JSON: the one byte form every hash in turnstile is computed over.
//!
//! - object keys sorted by their UTF-8 bytes, each key once;
//! - no insignificant whitespace;
//! - numbers are integers (`i64`/`u64`) in their shortest decimal form —
//!   floating point is refused, so there is one form per number;
//! - strings as `serde_json` writes them: `"` `\` and control characters
//!   escaped (`\n`, `\t`, … or `\u00XX`), everything else literal UTF-8.
//!
//! Parsing is strict: duplicate keys, floats, trailing bytes and any byte
//! sequence that is not the canonical form of its value are errors, never
//! silently repaired.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Why a value or a byte string is not canonical JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    #[error("floating-point number `{0}` (only integers are allowed)")]
    Float(String),
    #[error("{0}")]
    Syntax(String),
    #[error("not in canonical form (key order, whitespace, escapes or number form differ)")]
    NotCanonical,
}

/// Serializes `value` canonically.
pub fn to_vec(value: &Value) -> Result<Vec<u8>, CanonicalError> {
    let mut out = Vec::with_capacity(256);
    write_value(value, &mut out)?;
    Ok(out)
}

/// Serializes `value` canonically into a `String`.
pub fn to_string(value: &Value) -> Result<String, CanonicalError> {
    let bytes = to_vec(value)?;
    // to_vec writes only valid UTF-8 (serde_json output and ASCII punctuation).
    String::from_utf8(bytes).map_err(|e| CanonicalError::Syntax(e.to_string()))
}

fn write_value(value: &Value, out: &mut Vec<u8>) -> Result<(), CanonicalError> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.extend_from_slice(i.to_string().as_bytes());
            } else if let Some(u) = n.as_u64() {
                out.extend_from_slice(u.to_string().as_bytes());
            } else {
                return Err(CanonicalError::Float(n.to_string()));
            }
        }
        Value::String(s) => write_string(s, out)?,
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out)?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // Sort explicitly: the Map's own order depends on serde_json's
            // `preserve_order` feature, which another crate could enable.
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out)?;
                out.push(b':');
                write_value(v, out)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

fn write_string(s: &str, out: &mut Vec<u8>) -> Result<(), CanonicalError> {
    serde_json::to_writer(&mut *out, s).map_err(|e| CanonicalError::Syntax(e.to_string()))
}

/// Parses JSON strictly: duplicate keys and floats are errors, as is anything
/// after the value.
pub fn parse_strict(bytes: &[u8]) -> Result<Value, CanonicalError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = StrictValue::deserialize(&mut de)
        .map_err(|e| CanonicalError::Syntax(e.to_string()))?
        .0;
    de.end()
        .map_err(|e| CanonicalError::Syntax(e.to_string()))?;
    Ok(value)
}

/// Parses bytes that must be the canonical form of their value.
pub fn parse_canonical(bytes: &[u8]) -> Result<Value, CanonicalError> {
    let value = parse_strict(bytes)?;
    if to_vec(&value)? != bytes {
        return Err(CanonicalError::NotCanonical);
    }
    Ok(value)
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The canonical form of the object `map`, and — when `map` has `key` —
/// the byte range of it that, cut out, leaves the canonical form of `map`
/// without `key`: the member and one comma beside it. One serialization
/// serves both a check that bytes are canonical and the hash of the object
/// less one member (a ledger entry less its `entry_hash`).
pub fn object_to_vec_cutting(
    map: &Map<String, Value>,
    key: &str,
) -> Result<(Vec<u8>, Option<std::ops::Range<usize>>), CanonicalError> {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut out = Vec::with_capacity(256);
    let mut cut = None;
    let last = entries.len().saturating_sub(1);
    out.push(b'{');
    for (i, (k, v)) in entries.into_iter().enumerate() {
        let start = out.len();
        if i > 0 {
            out.push(b',');
        }
        write_string(k, &mut out)?;
        out.push(b':');
        write_value(v, &mut out)?;
        if k == key {
            // The first member takes the comma after it (if any), every
            // other one the comma before it.
            cut = Some(if i == 0 && last > 0 {
                start..out.len() + 1
            } else {
                start..out.len()
            });
        }
    }
    out.push(b'}');
    Ok((out, cut))
}

/// Lowercase hex sha256 of `bytes` less the range `cut`.
pub fn sha256_hex_cutting(bytes: &[u8], cut: std::ops::Range<usize>) -> String {
    let mut h = Sha256::new();
    h.update(&bytes[..cut.start]);
    h.update(&bytes[cut.end..]);
    hex::encode(h.finalize())
}

/// Lowercase hex sha256 of the canonical form of `value`.
pub fn hash_value(value: &Value) -> Result<String, CanonicalError> {
    Ok(sha256_hex(&to_vec(value)?))
}

struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value without duplicate keys or floats")
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Err(E::custom(format!(
            "floating-point number `{v}` (only integers are allowed)"
        )))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictValue(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate key `{key}`")));
            }
            let StrictValue(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Cutting the member out of the one serialization gives the bytes of
    /// the object without it, wherever the key sorts (first, inside, last,
    /// alone, absent), and a nested member of that name is not it.
    #[test]
    fn cutting_a_member_is_serializing_without_it() {
        let cases = [
            json!({"entry_hash": "h", "z": 1}),
            json!({"a": 1, "entry_hash": "h", "z": {"entry_hash": "inner"}}),
            json!({"a": [1, 2], "b": "entry_hash", "entry_hash": "h"}),
            json!({"entry_hash": "h"}),
            json!({"a": {"entry_hash": "x"}}),
            json!({}),
        ];
        for v in cases {
            let Value::Object(map) = &v else {
                unreachable!()
            };
            let (bytes, cut) = object_to_vec_cutting(map, "entry_hash").unwrap();
            assert_eq!(bytes, to_vec(&v).unwrap(), "{v}");
            let mut less = map.clone();
            let had = less.remove("entry_hash").is_some();
            assert_eq!(cut.is_some(), had, "{v}");
            if let Some(cut) = cut {
                let mut spliced = bytes.clone();
                spliced.drain(cut.clone());
                assert_eq!(
                    spliced,
                    to_vec(&Value::Object(less.clone())).unwrap(),
                    "{v}"
                );
                assert_eq!(
                    sha256_hex_cutting(&bytes, cut),
                    hash_value(&Value::Object(less)).unwrap()
                );
            }
        }
    }

    #[test]
    fn sorts_keys_and_drops_whitespace() {
        let v = json!({"b": 1, "a": {"d": [1, "x"], "c": null}, "é": true, "Z": -3});
        assert_eq!(
            to_string(&v).unwrap(),
            r#"{"Z":-3,"a":{"c":null,"d":[1,"x"]},"b":1,"é":true}"#
        );
    }

    #[test]
    fn one_string_form() {
        let v = json!("tab\tquote\"nl\nuni\u{1}é");
        assert_eq!(to_string(&v).unwrap(), r#""tab\tquote\"nl\nuni\u0001é""#);
        // The same content spelled with a different escape is not canonical.
        assert_eq!(
            parse_canonical(br#""\u0041""#),
            Err(CanonicalError::NotCanonical)
        );
        assert!(parse_canonical(br#""A""#).is_ok());
    }

    #[test]
    fn refuses_floats_and_other_number_forms() {
        assert!(matches!(to_vec(&json!(1.5)), Err(CanonicalError::Float(_))));
        assert!(parse_strict(b"1.0").is_err());
        assert!(parse_strict(b"1e3").is_err());
        assert!(parse_canonical(b"-0").is_err());
        assert!(parse_canonical(b"18446744073709551615").is_ok());
    }

    #[test]
    fn rejects_duplicates_trailing_bytes_and_whitespace() {
        let dup = parse_strict(br#"{"a":1,"a":2}"#).unwrap_err();
        assert!(dup.to_string().contains("duplicate key `a`"), "{dup}");
        let nested = parse_strict(br#"{"x":{"k":1,"k":1}}"#).unwrap_err();
        assert!(nested.to_string().contains("duplicate key `k`"));
        assert!(parse_strict(br#"{"a":1} x"#).is_err());
        assert_eq!(
            parse_canonical(br#"{"a": 1}"#),
            Err(CanonicalError::NotCanonical)
        );
        assert_eq!(
            parse_canonical(br#"{"b":1,"a":2}"#),
            Err(CanonicalError::NotCanonical)
        );
    }

    #[test]
    fn hash_is_stable_across_key_order() {
        let a = json!({"x": 1, "y": [1, 2]});
        let b: Value = serde_json::from_str(r#"{ "y": [1,2], "x": 1 }"#).unwrap();
        assert_eq!(hash_value(&a).unwrap(), hash_value(&b).unwrap());
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
