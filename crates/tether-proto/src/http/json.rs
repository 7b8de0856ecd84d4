//! JSON request bodies read strictly: a key repeated in one object is an error, as in the
//! WebSocket protocol's messages (docs/protocol.md), instead of serde_json's last-one-wins.
//! Which of two values counts would otherwise depend on the parser, and a proxy or audit log
//! in front of tether may read the other one.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

/// Parses `body` as one JSON document into a [`Value`], refusing a key repeated in any
/// object at any depth.
///
/// # Errors
/// The `serde_json` error: a syntax error, or a data error `duplicate field \`k\`` for the first
/// repeated key `k`.
pub fn parse_unique(body: &[u8]) -> Result<Value, serde_json::Error> {
    serde_json::from_slice::<Unique>(body).map(|u| u.0)
}

struct Unique(Value);

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Unique(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(de::Error::custom(format_args!("duplicate field `{k}`")));
            }
            let Unique(v) = map.next_value()?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_unique;

    #[test]
    fn a_repeated_key_at_any_depth_is_refused() {
        for body in [
            r#"{"url":"ws://a/","url":"ws://b/"}"#,
            r#"{"a":1,"b":{"x":1,"x":2}}"#,
            r#"{"a":[{"k":1},{"k":1,"k":2}]}"#,
            r#"{"id":"a","id":"a"}"#,
        ] {
            let e = parse_unique(body.as_bytes()).unwrap_err();
            assert!(e.to_string().starts_with("duplicate field `"), "{body}: {e}");
        }
    }

    #[test]
    fn documents_without_repeats_parse_as_serde_json_does() {
        for body in [r#"{"a":1,"b":[1,2.5,-3,true,null,"s"],"c":{"a":1}}"#, "[]", "7", r#""s""#, "{}"] {
            let want: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(parse_unique(body.as_bytes()).unwrap(), want, "{body}");
        }
        assert!(parse_unique(b"{\"a\":1").is_err());
        assert!(parse_unique(b"{\"a\":1} x").is_err());
    }
}
