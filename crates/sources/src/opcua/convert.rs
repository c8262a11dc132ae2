//! The pure parts of the OPC UA source: a value's status to `q`, its timestamp to unix
//! milliseconds, a variant to JSON and back (for writes), and node names to channel names.
//! Nothing here does I/O.

use opcua::types::{
    Array, ByteString, DataValue, DateTime, Identifier, LocalizedText, NodeId, StatusCode, UAString, Variant,
    VariantScalarTypeId,
};
use serde::ser::{Serialize, SerializeSeq, Serializer};
use serde_json::Value;

/// Longest channel name the node accepts (the protocol crate's `MAX_CHANNEL_LEN`).
pub const MAX_CHANNEL_LEN: usize = 255;

/// The point's `q` for an OPC UA status code: the code's severity bits (Good, Uncertain, Bad).
/// A value without a status is good (Part 4, 7.7.1).
pub fn quality(status: Option<StatusCode>) -> &'static str {
    match status {
        None => "good",
        Some(s) if s.is_good() => "good",
        Some(s) if s.is_uncertain() => "uncertain",
        Some(_) => "bad",
    }
}

/// 100-nanosecond ticks between 1601-01-01 (OPC UA's epoch) and 1970-01-01.
const TICKS_TO_UNIX_EPOCH: i64 = 116_444_736_000_000_000;

/// A DateTime as unix milliseconds; `None` for the null DateTime (no timestamp given).
pub fn unix_ms(t: &DateTime) -> Option<i64> {
    if t.is_null() {
        return None;
    }
    Some(t.checked_ticks().checked_sub(TICKS_TO_UNIX_EPOCH)? / 10_000)
}

/// Latest unix millisecond a DateTime holds (9999-12-31T23:59:59Z, its end of times).
const MAX_UNIX_MS: i64 = 253_402_300_799_000;

/// Unix milliseconds as a DateTime (the inverse of [`unix_ms`]), clamped to 1970 ..= 9999.
pub fn date_time(unix_ms: i64) -> DateTime {
    DateTime::from(unix_ms.clamp(0, MAX_UNIX_MS) * 10_000 + TICKS_TO_UNIX_EPOCH)
}

/// The time a value is stamped with: its source timestamp, else the server's, else `now_ms`.
pub fn point_time(dv: &DataValue, now_ms: i64) -> i64 {
    dv.source_timestamp
        .as_ref()
        .and_then(unix_ms)
        .or_else(|| dv.server_timestamp.as_ref().and_then(unix_ms))
        .unwrap_or(now_ms)
}

/// Whether [`JsonVariant`] can render this variant. Structures (ExtensionObject), nested
/// DataValues and DiagnosticInfos cannot: they are counted as decode errors.
pub fn supported(v: &Variant) -> bool {
    match v {
        Variant::ExtensionObject(_) | Variant::DataValue(_) | Variant::DiagnosticInfo(_) => false,
        Variant::Variant(inner) => supported(inner),
        Variant::Array(a) => a.values.iter().all(supported),
        _ => true,
    }
}

/// A variant serialized as JSON: numbers as numbers (a Float keeps its shortest decimal form,
/// NaN and infinities become `null`), text kinds as strings, DateTime as RFC 3339, ByteString as
/// base64, arrays as arrays (multi-dimensional ones flattened). Check [`supported`] first.
pub struct JsonVariant<'a>(pub &'a Variant);

impl Serialize for JsonVariant<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        fn text<S: Serializer>(s: S, t: &UAString) -> Result<S::Ok, S::Error> {
            match t.value() {
                Some(t) => s.serialize_str(t),
                None => s.serialize_none(),
            }
        }
        match self.0 {
            Variant::Empty => s.serialize_none(),
            Variant::Boolean(b) => s.serialize_bool(*b),
            Variant::SByte(n) => s.serialize_i8(*n),
            Variant::Byte(n) => s.serialize_u8(*n),
            Variant::Int16(n) => s.serialize_i16(*n),
            Variant::UInt16(n) => s.serialize_u16(*n),
            Variant::Int32(n) => s.serialize_i32(*n),
            Variant::UInt32(n) => s.serialize_u32(*n),
            Variant::Int64(n) => s.serialize_i64(*n),
            Variant::UInt64(n) => s.serialize_u64(*n),
            Variant::Float(f) => s.serialize_f32(*f),
            Variant::Double(f) => s.serialize_f64(*f),
            Variant::String(t) => text(s, t),
            Variant::LocalizedText(t) => text(s, &t.text),
            Variant::XmlElement(x) => s.collect_str(x),
            Variant::DateTime(t) => s.serialize_str(&t.to_rfc3339()),
            Variant::Guid(g) => s.collect_str(g),
            Variant::StatusCode(c) => s.collect_str(c),
            Variant::ByteString(b) if b.is_null() => s.serialize_none(),
            Variant::ByteString(b) => s.serialize_str(&b.as_base64()),
            Variant::QualifiedName(q) => s.collect_str(q),
            Variant::NodeId(n) => s.collect_str(n),
            Variant::ExpandedNodeId(n) => s.collect_str(n),
            Variant::Variant(inner) => JsonVariant(inner).serialize(s),
            Variant::Array(a) => {
                let mut seq = s.serialize_seq(Some(a.values.len()))?;
                for v in &a.values {
                    seq.serialize_element(&JsonVariant(v))?;
                }
                seq.end()
            }
            Variant::ExtensionObject(_) | Variant::DataValue(_) | Variant::DiagnosticInfo(_) => s.serialize_none(),
        }
    }
}

/// The JSON point of one value: `{"v":..,"t":..,"q":..}`.
#[derive(serde::Serialize)]
pub struct Point<V> {
    pub v: V,
    pub t: i64,
    pub q: &'static str,
}

/// The node's data type as the write needs it: a built-in scalar type, and whether the value
/// is an array.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriteType {
    pub scalar: VariantScalarTypeId,
    pub array: bool,
}

/// Picks the type to write from the node's DataType attribute (a built-in type id) or, for
/// types that are not built in (abstract Number, enumerations, subtypes), from the variant its
/// current value has. `None` when neither tells.
pub fn write_type(data_type: Option<&NodeId>, value_rank: Option<i32>, current: Option<&Variant>) -> Option<WriteType> {
    let from_value = current.and_then(|v| match v {
        Variant::Empty => None,
        Variant::Array(a) => Some(WriteType { scalar: a.value_type, array: true }),
        v => v.scalar_type_id().map(|scalar| WriteType { scalar, array: false }),
    });
    let builtin = data_type.and_then(|id| VariantScalarTypeId::try_from(id).ok());
    match builtin {
        Some(scalar) => {
            let array = match value_rank {
                Some(rank) if rank >= 1 => true,
                Some(-1) => false,
                // Any, ScalarOrOneDimension, OneOrMoreDimensions: follow the current value.
                _ => from_value.is_some_and(|t| t.array),
            };
            Some(WriteType { scalar, array })
        }
        None => from_value,
    }
}

/// Converts a JSON value to a variant of the node's type, checking ranges: a whole number for
/// integer types (300 is not a Byte), a number for Float/Double, a boolean (or 0/1) for Boolean,
/// a string for the text kinds, RFC 3339 text or unix milliseconds for DateTime.
pub fn to_variant(value: &Value, ty: WriteType) -> Result<Variant, String> {
    if ty.array {
        let Value::Array(items) = value else {
            return Err(format!("the node holds an array of {}; the value is not an array", ty.scalar));
        };
        let values = items.iter().map(|v| to_scalar(v, ty.scalar)).collect::<Result<Vec<_>, _>>()?;
        return Array::new(ty.scalar, values).map(Variant::from).map_err(|e| format!("array of {}: {e}", ty.scalar));
    }
    to_scalar(value, ty.scalar)
}

fn to_scalar(value: &Value, ty: VariantScalarTypeId) -> Result<Variant, String> {
    use VariantScalarTypeId as T;
    let wrong = || format!("{value} is not a valid {ty}");
    use crate::whole_number as int;
    Ok(match ty {
        T::Boolean => match value {
            Value::Bool(b) => Variant::Boolean(*b),
            Value::Number(_) if value.as_f64() == Some(0.0) => Variant::Boolean(false),
            Value::Number(_) if value.as_f64() == Some(1.0) => Variant::Boolean(true),
            _ => return Err(wrong()),
        },
        T::SByte => Variant::SByte(int(value).ok_or_else(wrong)?),
        T::Byte => Variant::Byte(int(value).ok_or_else(wrong)?),
        T::Int16 => Variant::Int16(int(value).ok_or_else(wrong)?),
        T::UInt16 => Variant::UInt16(int(value).ok_or_else(wrong)?),
        T::Int32 => Variant::Int32(int(value).ok_or_else(wrong)?),
        T::UInt32 => Variant::UInt32(int(value).ok_or_else(wrong)?),
        T::Int64 => Variant::Int64(int(value).ok_or_else(wrong)?),
        T::UInt64 => Variant::UInt64(int(value).ok_or_else(wrong)?),
        T::Float => {
            let f = value.as_f64().ok_or_else(wrong)?;
            if f.abs() > f64::from(f32::MAX) {
                return Err(wrong());
            }
            Variant::Float(f as f32)
        }
        T::Double => Variant::Double(value.as_f64().ok_or_else(wrong)?),
        T::String => Variant::String(UAString::from(value.as_str().ok_or_else(wrong)?)),
        T::LocalizedText => Variant::from(LocalizedText::new("", value.as_str().ok_or_else(wrong)?)),
        T::ByteString => Variant::ByteString(
            value
                .as_str()
                .and_then(ByteString::from_base64)
                .ok_or_else(|| format!("{value} is not base64 text for a ByteString"))?,
        ),
        T::DateTime => match value {
            Value::String(s) => Variant::from(DateTime::parse_from_rfc3339(s).map_err(|_| wrong())?),
            Value::Number(_) => {
                let ms = value.as_i64().ok_or_else(wrong)?;
                let ticks =
                    ms.checked_mul(10_000).and_then(|t| t.checked_add(TICKS_TO_UNIX_EPOCH)).ok_or_else(wrong)?;
                Variant::from(DateTime::from(ticks))
            }
            _ => return Err(wrong()),
        },
        other => return Err(format!("writing {other} values is not supported")),
    })
}

/// A piece of a node name as channel text: bytes outside the channel alphabet
/// (`A-Z a-z 0-9 _ . : / @ = -`) become `_`, one per character.
pub fn channel_safe(name: &str) -> String {
    name.chars()
        .map(
            |c| {
                if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '/' | '@' | '=' | '-') {
                    c
                } else {
                    '_'
                }
            },
        )
        .collect()
}

/// `{name}` of a node listed in `nodes`: a string identifier as it is (`ns=2;s=Line1.Temp` →
/// `Line1.Temp`), other kinds in their text form (`i=1001`, `g=…`, `b=…`), made channel-safe.
pub fn node_name(id: &NodeId) -> String {
    match &id.identifier {
        Identifier::String(s) => channel_safe(s.as_ref()),
        other => channel_safe(&other.to_string()),
    }
}

/// `{name}` of a browsed variable: the browse names below the browse root joined by `.`.
pub fn path_name(segments: &[String]) -> String {
    segments.iter().map(|s| channel_safe(s)).collect::<Vec<_>>().join(".")
}

/// The channel of a node: the template with `{name}` replaced; `None` when it would be longer
/// than a channel may be.
pub fn channel_for(template: &str, name: &str) -> Option<String> {
    let channel = template.replace("{name}", name);
    (!name.is_empty() && channel.len() <= MAX_CHANNEL_LEN).then_some(channel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write_value;
    use std::str::FromStr;

    fn json(v: &Variant) -> String {
        serde_json::to_string(&JsonVariant(v)).expect("serializes")
    }

    #[test]
    fn opcua_status_maps_to_quality_by_severity() {
        assert_eq!(quality(None), "good");
        assert_eq!(quality(Some(StatusCode::Good)), "good");
        assert_eq!(quality(Some(StatusCode::UncertainLastUsableValue)), "uncertain");
        assert_eq!(quality(Some(StatusCode::UncertainSensorNotAccurate)), "uncertain");
        assert_eq!(quality(Some(StatusCode::BadNotConnected)), "bad");
        assert_eq!(quality(Some(StatusCode::BadCommunicationError)), "bad");
    }

    #[test]
    fn opcua_timestamps_are_unix_milliseconds_source_first() {
        let t = DateTime::parse_from_rfc3339("2024-05-01T12:00:00.250Z").expect("parses");
        assert_eq!(unix_ms(&t), Some(1_714_564_800_250));
        assert_eq!(unix_ms(&DateTime::null()), None);
        let server = DateTime::parse_from_rfc3339("2024-05-01T12:00:01Z").expect("parses");
        let mut dv = DataValue::value_only(1.0f64);
        assert_eq!(point_time(&dv, 7), 7);
        dv.server_timestamp = Some(server);
        assert_eq!(point_time(&dv, 7), 1_714_564_801_000);
        dv.source_timestamp = Some(t);
        assert_eq!(point_time(&dv, 7), 1_714_564_800_250);
    }

    #[test]
    fn opcua_unix_ms_and_date_time_are_inverses() {
        for ms in [0, 1_714_564_800_250, MAX_UNIX_MS] {
            assert_eq!(unix_ms(&date_time(ms)), Some(ms));
        }
        let t = DateTime::parse_from_rfc3339("2024-05-01T12:00:00.250Z").expect("parses");
        assert_eq!(date_time(1_714_564_800_250), t);
        assert_eq!(unix_ms(&date_time(-5)), Some(0), "clamped");
    }

    #[test]
    fn opcua_variants_render_as_json() {
        assert_eq!(json(&Variant::Empty), "null");
        assert_eq!(json(&Variant::Boolean(true)), "true");
        assert_eq!(json(&Variant::Int32(-5)), "-5");
        assert_eq!(json(&Variant::UInt64(u64::MAX)), "18446744073709551615");
        assert_eq!(json(&Variant::Float(0.1)), "0.1");
        assert_eq!(json(&Variant::Double(21.5)), "21.5");
        assert_eq!(json(&Variant::Double(f64::NAN)), "null");
        assert_eq!(json(&Variant::from("a \"b\"")), r#""a \"b\"""#);
        assert_eq!(json(&Variant::from(LocalizedText::new("en", "Running"))), r#""Running""#);
        assert_eq!(json(&Variant::from(ByteString::from(vec![1u8, 2, 3]))), r#""AQID""#);
        let arr = Variant::from(vec![1.5f64, 2.5]);
        assert_eq!(json(&arr), "[1.5,2.5]");
        let dt = DateTime::parse_from_rfc3339("2024-05-01T12:00:00Z").expect("parses");
        assert!(json(&Variant::from(dt)).starts_with("\"2024-05-01T12:00:00"));
        let point = Point { v: JsonVariant(&Variant::Double(1.0)), t: 5, q: "good" };
        assert_eq!(serde_json::to_string(&point).expect("serializes"), r#"{"v":1.0,"t":5,"q":"good"}"#);
        assert!(supported(&arr));
        assert!(!supported(&Variant::from(DataValue::value_only(1.0f64))));
    }

    #[test]
    fn opcua_write_takes_v_of_a_point_or_a_bare_value() {
        assert_eq!(write_value(r#"{"v":42,"t":1}"#), Ok(Value::from(42)));
        assert_eq!(write_value("true"), Ok(Value::Bool(true)));
        assert_eq!(write_value(r#"{"x":1}"#), Ok(serde_json::json!({"x": 1})));
        assert!(write_value("{").is_err());
    }

    #[test]
    fn opcua_write_type_prefers_the_builtin_data_type() {
        let double = NodeId::new(0, 11u32);
        let number = NodeId::new(0, 26u32); // abstract Number: follow the value
        let t = write_type(Some(&double), Some(-1), Some(&Variant::Float(1.0)));
        assert_eq!(t, Some(WriteType { scalar: VariantScalarTypeId::Double, array: false }));
        let t = write_type(Some(&number), Some(-2), Some(&Variant::Int16(3)));
        assert_eq!(t, Some(WriteType { scalar: VariantScalarTypeId::Int16, array: false }));
        let t = write_type(Some(&double), Some(1), None);
        assert_eq!(t, Some(WriteType { scalar: VariantScalarTypeId::Double, array: true }));
        assert_eq!(write_type(Some(&number), None, Some(&Variant::Empty)), None);
    }

    #[test]
    fn opcua_json_converts_to_the_node_type_with_range_checks() {
        let scalar = |scalar| WriteType { scalar, array: false };
        use VariantScalarTypeId as T;
        assert_eq!(to_variant(&Value::from(55.5), scalar(T::Float)), Ok(Variant::Float(55.5)));
        assert_eq!(to_variant(&Value::from(55), scalar(T::Double)), Ok(Variant::Double(55.0)));
        assert_eq!(to_variant(&Value::from(12), scalar(T::Int32)), Ok(Variant::Int32(12)));
        assert_eq!(to_variant(&Value::from(12.0), scalar(T::UInt16)), Ok(Variant::UInt16(12)));
        assert!(to_variant(&Value::from(12.5), scalar(T::Int32)).is_err());
        assert!(to_variant(&Value::from(300), scalar(T::Byte)).is_err());
        assert!(to_variant(&Value::from(-1), scalar(T::UInt32)).is_err());
        assert!(to_variant(&Value::from(1e300), scalar(T::Float)).is_err());
        assert_eq!(to_variant(&Value::from(true), scalar(T::Boolean)), Ok(Variant::Boolean(true)));
        assert_eq!(to_variant(&Value::from(0), scalar(T::Boolean)), Ok(Variant::Boolean(false)));
        assert!(to_variant(&Value::from("on"), scalar(T::Boolean)).is_err());
        assert_eq!(to_variant(&Value::from("auto"), scalar(T::String)), Ok(Variant::from("auto")));
        assert!(to_variant(&Value::from(1), scalar(T::String)).is_err());
        let ms = to_variant(&Value::from(1_714_564_800_250i64), scalar(T::DateTime)).expect("converts");
        let Variant::DateTime(dt) = ms else { panic!("not a DateTime: {ms:?}") };
        assert_eq!(unix_ms(&dt), Some(1_714_564_800_250));
        let arr = to_variant(&serde_json::json!([1, 2]), WriteType { scalar: T::Int16, array: true });
        assert_eq!(arr, Ok(Variant::from(vec![1i16, 2])));
        assert!(to_variant(&Value::from(1), WriteType { scalar: T::Int16, array: true }).is_err());
        assert!(to_variant(&Value::from(1), scalar(T::Guid)).is_err());
    }

    #[test]
    fn opcua_channel_names_keep_the_channel_alphabet() {
        assert_eq!(channel_safe("Line1.Temp"), "Line1.Temp");
        assert_eq!(channel_safe("Tank 3 (°C)"), "Tank_3___C_");
        let id = NodeId::from_str("ns=2;s=Line 1/Temp").expect("parses");
        assert_eq!(node_name(&id), "Line_1/Temp");
        assert_eq!(node_name(&NodeId::new(3, 1001u32)), "i=1001");
        assert_eq!(path_name(&["Line1".into(), "Temp °C".into()]), "Line1.Temp__C");
        assert_eq!(channel_for("pt:{name}", "Line1.Temp").as_deref(), Some("pt:Line1.Temp"));
        assert_eq!(channel_for("pt:plant.{name}.v", "a").as_deref(), Some("pt:plant.a.v"));
        assert_eq!(channel_for("pt:{name}", &"x".repeat(253)), None);
        assert_eq!(channel_for("pt:{name}", ""), None);
    }
}
