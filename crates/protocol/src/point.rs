//! Point data (SPEC §1): `{"v": <number|bool|string|array>, "t": <unix ms>, "q": "good"|...}`
//! or a bare number, read in one place for every reader of it: the trends (`v` and `t`,
//! [`Point::timed_value`]) and the deadband of sampled subscriptions (`v` and `q`).
//!
//! [`parse`] reads the data once and records what each reader needs to decide: the fields'
//! values and the flaws a reader may refuse (a repeated `t`, a `q` that is not text). A point
//! with `v` given twice is no point for anyone. Fields other than `v`, `t` and `q` are skipped
//! without being looked at. A JSON array of at most two items is read as `[v, q]` (the
//! sequence form of the fields the deadband reads); trends take objects and numbers only.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// How the data held the point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Form {
    /// Not a point: other JSON, a number beyond `f64`, or an object or array that does not
    /// parse as one (`v` given twice, an array of more than two items).
    #[default]
    Other,
    /// A bare finite number: the value itself, without `t` or `q`.
    Number,
    /// An object with (some of) the fields `v`, `t`, `q`.
    Object,
    /// An array `[v, q]` of at most two items.
    Array,
}

/// A publication's data read as a point.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Point<'a> {
    pub form: Form,
    /// `v` when it is a finite number (a bare number is its own `v`).
    pub v: Option<f64>,
    /// `v` is given (not `null`) and is not a finite number: text, a bool, an array, an object
    /// or a number beyond `f64`.
    pub v_other: bool,
    /// `t` when it is a whole number of milliseconds (not negative, not a fraction).
    pub t: Option<u64>,
    /// The object gives `t` more than once.
    pub t_repeated: bool,
    /// `q` when it is text.
    pub q: Option<Cow<'a, str>>,
    /// `q` is given and is neither text nor `null`, or given more than once.
    pub q_malformed: bool,
}

impl Point<'_> {
    /// The numeric value and, for an object, its own time `t`: what a trend records. `None`
    /// for anything but a bare number or an object with a numeric `v` and at most one `t`.
    pub fn timed_value(&self) -> Option<(f64, Option<u64>)> {
        match self.form {
            Form::Number => self.v.map(|v| (v, None)),
            Form::Object if !self.t_repeated => self.v.map(|v| (v, self.t)),
            _ => None,
        }
    }
}

/// Reads `data` (JSON text) as a point. Never fails: data that is no point is [`Form::Other`]
/// with every field absent.
pub fn parse(data: &str) -> Point<'_> {
    parse_field(data, "v")
}

/// Reads `data` as a point whose value is the field `field` instead of `v` (an alarm may
/// watch any numeric field of a channel's objects); the rest as [`parse`].
pub fn parse_field<'a>(data: &'a str, field: &str) -> Point<'a> {
    let mut de = serde_json::Deserializer::from_str(data);
    let fields = FieldsSeed { value: field }.deserialize(&mut de).and_then(|f| de.end().map(|()| f));
    match fields {
        Ok(f) => f.into_point(),
        Err(_) => match data.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => Point { form: Form::Number, v: Some(v), ..Point::default() },
            _ => Point::default(),
        },
    }
}

/// The fields as they appear in the data, not yet interpreted.
#[derive(Default)]
struct Fields<'a> {
    form: Form,
    v: Option<&'a RawValue>,
    t: Option<&'a RawValue>,
    t_repeated: bool,
    q: Option<&'a RawValue>,
    q_repeated: bool,
}

impl<'a> Fields<'a> {
    fn into_point(self) -> Point<'a> {
        let v = self.v.and_then(|raw| raw.get().parse::<f64>().ok()).filter(|v| v.is_finite());
        let q = match self.q {
            None => Ok(None),
            Some(raw) => text(raw).map(Some),
        };
        Point {
            form: self.form,
            v_other: self.v.is_some() && v.is_none(),
            v,
            t: self.t.and_then(|raw| raw.get().parse::<u64>().ok()),
            t_repeated: self.t_repeated,
            q_malformed: q.is_err() || self.q_repeated,
            q: q.ok().flatten(),
        }
    }
}

/// The text of a JSON string, borrowed when it has no escapes; `Err` for any other value.
fn text(raw: &RawValue) -> Result<Cow<'_, str>, ()> {
    let json = raw.get();
    if !json.starts_with('"') {
        return Err(());
    }
    match serde_json::from_str::<&str>(json) {
        Ok(s) => Ok(Cow::Borrowed(s)),
        Err(_) => serde_json::from_str::<String>(json).map(Cow::Owned).map_err(drop),
    }
}

/// A key of the point object.
enum Key {
    V,
    T,
    Q,
    Other,
}

/// Reads a key of the point object, `value` being the name of its value field.
struct KeySeed<'f> {
    value: &'f str,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Key;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        struct KeyVisitor<'f>(&'f str);
        impl Visitor<'_> for KeyVisitor<'_> {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, key: &str) -> Result<Key, E> {
                Ok(match key {
                    k if k == self.0 => Key::V,
                    "t" => Key::T,
                    "q" => Key::Q,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(KeyVisitor(self.value))
    }
}

/// Reads the point's fields, `value` being the name of its value field.
struct FieldsSeed<'f> {
    value: &'f str,
}

impl<'de> DeserializeSeed<'de> for FieldsSeed<'_> {
    type Value = Fields<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Fields<'de>, D::Error> {
        struct FieldsVisitor<'f>(&'f str);
        impl<'de> Visitor<'de> for FieldsVisitor<'_> {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a point")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
                let mut f = Fields { form: Form::Object, ..Fields::default() };
                let (mut seen_v, mut seen_t, mut seen_q) = (false, false, false);
                while let Some(key) = map.next_key_seed(KeySeed { value: self.0 })? {
                    match key {
                        Key::V if seen_v => return Err(A::Error::duplicate_field("v")),
                        Key::V => {
                            seen_v = true;
                            f.v = map.next_value()?;
                        }
                        Key::T => {
                            f.t_repeated |= seen_t;
                            seen_t = true;
                            f.t = map.next_value()?;
                        }
                        Key::Q => {
                            f.q_repeated |= seen_q;
                            seen_q = true;
                            f.q = map.next_value()?;
                        }
                        Key::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(f)
            }
            /// `[v, q]`: the items beyond the second make the parse fail (the array is then
            /// no point), as missing ones leave their field absent.
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Fields<'de>, A::Error> {
                let v = seq.next_element::<Option<&'de RawValue>>()?.flatten();
                let q = seq.next_element::<Option<&'de RawValue>>()?.flatten();
                Ok(Fields { form: Form::Array, v, q, ..Fields::default() })
            }
        }
        d.deserialize_any(FieldsVisitor(self.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_value_from_another_field() {
        let p = parse_field(r#"{"v": 1, "temp": 82.5, "q": "bad"}"#, "temp");
        assert_eq!((p.v, p.q.as_deref()), (Some(82.5), Some("bad")));
        assert_eq!(parse_field(r#"{"temp": "hot"}"#, "temp").v_other, true);
        assert_eq!(parse_field(r#"{"v": 3}"#, "temp").v, None);
        assert_eq!(parse_field("7", "temp").v, Some(7.0), "a bare number is its own value");
        assert_eq!(parse_field(r#"{"temp": 1} x"#, "temp").form, Form::Other);
    }

    #[test]
    fn point_numbers_and_objects() {
        assert_eq!(parse(" 7 "), Point { form: Form::Number, v: Some(7.0), ..Point::default() });
        assert_eq!(parse("1e999").form, Form::Other);
        let p = parse(r#"{"v": 1.5, "t": 1700000000123, "q": "good", "x": [1, {"y": 2}]}"#);
        assert_eq!(
            (p.form, p.v, p.t, p.q.as_deref()),
            (Form::Object, Some(1.5), Some(1_700_000_000_123), Some("good"))
        );
        assert!(!p.v_other && !p.t_repeated && !p.q_malformed);
        assert!(parse(r#"{"v": "open"}"#).v_other);
        assert!(!parse(r#"{"v": null}"#).v_other);
        assert!(!parse(r#"{"text": 1}"#).v_other);
        assert_eq!(parse(r#"{"v": 1, "q": "b\u0061d"}"#).q.as_deref(), Some("bad"));
        assert_eq!(parse(r#"{"\u0076": 2}"#).v, Some(2.0), "escaped keys are the same keys");
    }

    #[test]
    fn point_times_are_whole_milliseconds() {
        for (data, t) in
            [(r#"{"v": 1, "t": -5}"#, None), (r#"{"v": 1, "t": 1.5}"#, None), (r#"{"v": 1, "t": "9"}"#, None)]
        {
            assert_eq!(parse(data).timed_value(), Some((1.0, t)), "{data}");
        }
        assert_eq!(parse(r#"{"v": 1, "t": 9}"#).timed_value(), Some((1.0, Some(9))));
        assert_eq!(parse("2").timed_value(), Some((2.0, None)));
    }

    #[test]
    fn point_flaws_are_recorded_for_the_readers_to_judge() {
        let p = parse(r#"{"v": 1, "q": 3}"#);
        assert!(p.q_malformed && p.q.is_none());
        assert_eq!(p.timed_value(), Some((1.0, None)), "trends read no q");
        assert!(parse(r#"{"v": 1, "q": "a", "q": "b"}"#).q_malformed);
        let p = parse(r#"{"v": 1, "t": 5, "t": 6}"#);
        assert!(p.t_repeated && p.timed_value().is_none());
        assert_eq!(parse(r#"{"v": 1, "v": 2}"#), Point::default(), "v twice: no point");
        assert_eq!(parse(r#"{"v": 1,"#), Point::default());
    }

    #[test]
    fn point_arrays_are_v_then_q_and_never_a_trend_value() {
        let p = parse(r#"[1.5, "good"]"#);
        assert_eq!((p.form, p.v, p.q.as_deref()), (Form::Array, Some(1.5), Some("good")));
        assert_eq!(p.timed_value(), None);
        assert!(parse("[1, 2]").q_malformed);
        assert_eq!(parse("[1, 2, 3]"), Point::default());
        assert_eq!(parse("[]").form, Form::Array);
    }
}
