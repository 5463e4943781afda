//! A serde adapter that makes every struct demand a JSON **object**.
//!
//! serde's derive lets a struct be written as a sequence of its fields in
//! declaration order, and serde_json honours that: `"capabilities":
//! [["**"], [], ["/bin/sh"]]` would deserialize as `read`, `write`, `execute`
//! and grant them. A manifest or request that says something only by the
//! position of an array element is not what anyone reviewed, so turnstile
//! refuses it.
//!
//! The fix is structural rather than per field: [`Strict`] wraps a
//! deserializer and every deserializer, visitor, seed and access it hands out,
//! all the way down, and wherever a struct is requested
//! (`deserialize_struct`, struct enum variants) it substitutes a visitor that
//! accepts only a map. Any struct added to a document later is covered
//! without touching this module. Everything else is forwarded unchanged, so
//! error paths (`serde_path_to_error`), `deny_unknown_fields` and duplicate
//! field detection behave as before.

use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};

/// What the error says a struct position needs.
const EXPECTED_OBJECT: &str =
    "a JSON object `{...}` (arrays and other values are refused where an object is required)";

/// A deserializer whose structs accept only JSON objects.
#[derive(Debug)]
pub struct Strict<D>(pub D);

/// Forwards a visitor, seed or access, keeping whatever it hands out strict.
#[derive(Debug)]
struct Wrap<X>(X);

/// A struct's visitor that accepts a map and nothing else: serde's default
/// `visit_seq` (and every other `visit_*`) reports an invalid type against
/// [`EXPECTED_OBJECT`].
#[derive(Debug)]
struct ObjectOnly<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for ObjectOnly<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTED_OBJECT)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(Wrap(map))
    }
}

macro_rules! forward_deserialize {
    ($($method:ident),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            self.0.$method(Wrap(visitor))
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Strict<D> {
    type Error = D::Error;

    forward_deserialize!(
        deserialize_any,
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_option,
        deserialize_unit,
        deserialize_seq,
        deserialize_map,
        deserialize_identifier,
        deserialize_ignored_any,
    );

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_unit_struct(name, Wrap(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_newtype_struct(name, Wrap(visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_tuple(len, Wrap(visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_tuple_struct(name, len, Wrap(visitor))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_struct(name, fields, ObjectOnly(visitor))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_enum(name, variants, Wrap(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
            self.0.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    forward_visit!(
        visit_bool(bool),
        visit_i8(i8),
        visit_i16(i16),
        visit_i32(i32),
        visit_i64(i64),
        visit_i128(i128),
        visit_u8(u8),
        visit_u16(u16),
        visit_u32(u32),
        visit_u64(u64),
        visit_u128(u128),
        visit_f32(f32),
        visit_f64(f64),
        visit_char(char),
        visit_str(&str),
        visit_borrowed_str(&'de str),
        visit_string(String),
        visit_bytes(&[u8]),
        visit_borrowed_bytes(&'de [u8]),
        visit_byte_buf(Vec<u8>),
    );

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.visit_some(Strict(d))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.visit_newtype_struct(Strict(d))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.0.visit_seq(Wrap(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.visit_map(Wrap(map))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.0.visit_enum(Wrap(data))
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Wrap<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Strict(d))
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Wrap<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Wrap(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Wrap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(Wrap(seed))
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.0.next_value_seed(Wrap(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for Wrap<A> {
    type Error = A::Error;
    type Variant = Wrap<A::Variant>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Self::Variant), A::Error> {
        let (value, variant) = self.0.variant_seed(Wrap(seed))?;
        Ok((value, Wrap(variant)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Wrap<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.0.newtype_variant_seed(Wrap(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, Wrap(visitor))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(fields, ObjectOnly(visitor))
    }
}

/// Deserializes `bytes` as one JSON document into `T`, with every struct
/// requiring an object. The error carries the JSON path of the offending
/// value; trailing characters after the document are an error too.
pub fn from_json_slice<'de, T: de::Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, JsonError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(Strict(&mut de)).map_err(JsonError::At)?;
    de.end().map_err(JsonError::Trailing)?;
    Ok(value)
}

/// Why a document did not deserialize.
#[derive(Debug)]
pub enum JsonError {
    /// At a JSON path.
    At(serde_path_to_error::Error<serde_json::Error>),
    /// Characters after the document.
    Trailing(serde_json::Error),
}

impl JsonError {
    /// The field (dotted JSON path) and the reason.
    pub fn field_and_reason(self) -> (String, String) {
        match self {
            Self::At(e) => {
                let field = crate::path::json_error_field(&e);
                (field, e.into_inner().to_string())
            }
            Self::Trailing(e) => ("(document)".to_owned(), e.to_string()),
        }
    }
}

/// Test support for the documents' own tests.
#[cfg(test)]
pub(crate) mod test_support {
    use serde_json::{Map, Value, json};

    /// Rewrites one JSON object.
    pub(crate) type Replace = dyn Fn(&Map<String, Value>) -> Value;

    /// What an attacker puts where an object belongs: the array of the
    /// object's values (serde's derive would read them as the fields in
    /// order), an empty array, and every other JSON type.
    pub(crate) fn non_objects() -> Vec<Box<Replace>> {
        vec![
            Box::new(|m| Value::Array(m.values().cloned().collect())),
            Box::new(|_| json!([])),
            Box::new(|_| json!("x")),
            Box::new(|_| json!(1)),
            Box::new(|_| json!(true)),
            Box::new(|_| Value::Null),
        ]
    }

    /// Test support: every object position of a JSON document, as the dotted
    /// path `serde_path_to_error` reports, each with the document rewritten so
    /// that object is replaced by `replacement(object)`.
    pub(crate) fn each_object_replaced(
        doc: &serde_json::Value,
        replacement: &Replace,
    ) -> Vec<(String, serde_json::Value)> {
        // Collect JSON pointers first, then rewrite a copy per pointer.
        fn pointers(v: &Value, pointer: String, path: String, out: &mut Vec<(String, String)>) {
            match v {
                Value::Object(m) => {
                    out.push((pointer.clone(), path.clone()));
                    for (k, child) in m {
                        let p = if path.is_empty() {
                            k.clone()
                        } else {
                            format!("{path}.{k}")
                        };
                        pointers(child, format!("{pointer}/{k}"), p, out);
                    }
                }
                Value::Array(items) => {
                    for (i, child) in items.iter().enumerate() {
                        pointers(child, format!("{pointer}/{i}"), format!("{path}[{i}]"), out);
                    }
                }
                _ => {}
            }
        }
        let mut found = Vec::new();
        pointers(doc, String::new(), String::new(), &mut found);
        found
            .into_iter()
            .map(|(pointer, path)| {
                let mut copy = doc.clone();
                if let Some(slot) = copy.pointer_mut(&pointer) {
                    if let Value::Object(m) = slot.clone() {
                        *slot = replacement(&m);
                    }
                }
                let path = if path.is_empty() {
                    "(document)".to_owned()
                } else {
                    path
                };
                (path, copy)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: Vec<String>,
        #[serde(default)]
        b: Option<u32>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        inner: Inner,
        list: Vec<Inner>,
        opt: Option<Inner>,
        kind: Kind,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "lowercase")]
    enum Kind {
        Plain,
        Shaped { x: u32 },
    }

    fn field(json: &str) -> (String, String) {
        from_json_slice::<Outer>(json.as_bytes())
            .unwrap_err()
            .field_and_reason()
    }

    #[test]
    fn plain_serde_json_accepts_a_struct_as_an_array() {
        // The hole this module closes: without `Strict` this parses.
        let v: Inner = serde_json::from_str(r#"[["x"], 3]"#).unwrap();
        assert_eq!(v.a, ["x"]);
        assert!(from_json_slice::<Inner>(br#"[["x"], 3]"#).is_err());
    }

    #[test]
    fn objects_are_accepted_unchanged() {
        let v: Outer = from_json_slice(
            br#"{"inner":{"a":["x"]},"list":[{"a":[],"b":2}],"opt":null,"kind":{"shaped":{"x":1}}}"#,
        )
        .unwrap();
        assert_eq!(v.list[0].b, Some(2));
        assert_eq!(v.kind, Kind::Shaped { x: 1 });
        let v: Outer =
            from_json_slice(br#"{"inner":{"a":[]},"list":[],"opt":{"a":[]},"kind":"plain"}"#)
                .unwrap();
        assert_eq!(v.opt, Some(Inner { a: vec![], b: None }));
    }

    #[test]
    fn arrays_where_objects_are_required_name_their_path() {
        let ok_rest = r#""list":[],"opt":null,"kind":"plain""#;
        let cases = [
            (r#"[{"a":[]},[],null,"plain"]"#.to_owned(), "(document)"),
            (format!(r#"{{"inner":[["x"]],{ok_rest}}}"#), "inner"),
            (
                r#"{"inner":{"a":[]},"list":[{"a":[]},[["x"]]],"opt":null,"kind":"plain"}"#
                    .to_owned(),
                "list[1]",
            ),
            (
                r#"{"inner":{"a":[]},"list":[],"opt":[["x"]],"kind":"plain"}"#.to_owned(),
                "opt",
            ),
            (
                r#"{"inner":{"a":[]},"list":[],"opt":null,"kind":{"shaped":[1]}}"#.to_owned(),
                "kind.shaped",
            ),
            (format!(r#"{{"inner":"x",{ok_rest}}}"#), "inner"),
            (format!(r#"{{"inner":7,{ok_rest}}}"#), "inner"),
            (format!(r#"{{"inner":null,{ok_rest}}}"#), "inner"),
        ];
        for (json, want) in cases {
            let (f, reason) = field(&json);
            assert_eq!(f, want, "{json}: {reason}");
            assert!(reason.contains("JSON object"), "{json}: {reason}");
        }
    }

    #[test]
    fn unknown_and_duplicate_fields_are_still_refused() {
        let (f, r) = field(r#"{"inner":{"a":[],"zz":1},"list":[],"opt":null,"kind":"plain"}"#);
        assert_eq!(f, "inner.zz", "{r}");
        let (f, r) = field(r#"{"inner":{"a":[],"a":[]},"list":[],"opt":null,"kind":"plain"}"#);
        assert_eq!(f, "inner.a", "{r}");
        let (f, _) = field(r#"{"inner":{"a":[]},"list":[],"opt":null,"kind":"plain"} x"#);
        assert_eq!(f, "(document)");
    }
}
