//! Sparkplug B metric values both ways: which protobuf field and which width each datatype
//! uses, for values read from births and data ([`read`]) and for values written in commands
//! ([`write`]).
//!
//! Fields (Sparkplug B 3.0 and its reference implementation): Int8, Int16, Int32, UInt8 and
//! UInt16 in `int_value` (uint32); Int64, UInt32, UInt64 and DateTime in `long_value` (uint64).
//! The specification's datatype table names uint32 for UInt32, but the reference
//! implementation (Eclipse Tahu), the 3.0 compatibility kit and the hosts built on them carry it
//! in `long_value`; a reader that follows the table reads whichever field is set, so
//! `long_value` is what every one of them understands. Commands write it there; reading
//! accepts either field for every integer datatype.
//!
//! Widths: a negative Int8, Int16, Int32 or Int64 is written as its two's complement in the
//! width of its datatype (Int8 -5 is 251, Int16 -5 is 65531). Reading takes that form and also
//! its sign extension to the field's width (Int8 -5 as 4294967291 in `int_value`), which some
//! edge nodes send; a value that is neither — outside the datatype's range — is not a value of
//! it and is skipped.

use serde_json::Value;

use super::datatype;
use super::proto;

/// The width in bits of an integer datatype and whether it is signed; `None` for the others.
fn integer(dt: u32) -> Option<(u32, bool)> {
    Some(match dt {
        datatype::INT8 => (8, true),
        datatype::INT16 => (16, true),
        datatype::INT32 => (32, true),
        datatype::INT64 => (64, true),
        datatype::UINT8 => (8, false),
        datatype::UINT16 => (16, false),
        datatype::UINT32 => (32, false),
        datatype::UINT64 | datatype::DATETIME => (64, false),
        _ => return None,
    })
}

/// An integer of `width` bits (signed or not) carried as `raw` in a field of `field` bits
/// (32 for `int_value`, 64 for `long_value`): the two's complement in the datatype's width, or
/// its sign extension to the field's; `None` when out of the datatype's range.
fn read_integer(raw: u64, field: u32, width: u32, signed: bool) -> Option<Value> {
    if !signed {
        return (width >= 64 || raw < 1u64 << width).then(|| raw.into());
    }
    // A field narrower than the datatype (Int64 in int_value) holds the field's width.
    let width = width.min(field);
    let sign = 1i128 << (width - 1);
    let raw = i128::from(raw);
    let v = if raw < sign << 1 {
        // The datatype's width: the top bit is the sign.
        if raw >= sign {
            raw - (sign << 1)
        } else {
            raw
        }
    } else if raw >= (1i128 << field) - sign {
        // Sign-extended to the field's width.
        raw - (1i128 << field)
    } else {
        return None;
    };
    i64::try_from(v).ok().map(Value::from)
}

/// A Float as JSON in its shortest decimal form (`21.7`, not `21.700000762939453`); `None`
/// for NaN and infinities.
pub fn float_json(f: f32) -> Option<Value> {
    // f32's Display is the shortest text that reads back as the same f32; as an f64 it keeps
    // those digits when serialized.
    let shortest: f64 = f.to_string().parse().ok()?;
    serde_json::Number::from_f64(shortest).map(Value::from)
}

/// A metric value as JSON, read per `dt` (see the module doc); `None` for forms a point cannot
/// carry (bytes, NaN and infinite floats) and integers outside their datatype's range. An
/// integer of a datatype that is not an integer one (or not given) is read as unsigned.
pub fn read(v: &proto::Value, dt: u32) -> Option<Value> {
    use proto::Value::*;
    let int = |raw: u64, field: u32| match integer(dt) {
        Some((width, signed)) => read_integer(raw, field, width, signed),
        None => Some(raw.into()),
    };
    match *v {
        IntValue(i) => int(i.into(), 32),
        LongValue(l) => int(l, 64),
        FloatValue(f) => float_json(f),
        DoubleValue(d) => serde_json::Number::from_f64(d).map(Value::from),
        BooleanValue(b) => Some(b.into()),
        StringValue(ref s) => Some(s.clone().into()),
        BytesValue(_) => None,
    }
}

/// An unsigned integer read from either integer field (the `bdSeq` metric); `None` for
/// another value form.
pub fn read_unsigned(v: &proto::Value) -> Option<u64> {
    match *v {
        proto::Value::IntValue(i) => Some(i.into()),
        proto::Value::LongValue(l) => Some(l),
        _ => None,
    }
}

/// Converts a JSON value to a metric value of datatype `dt`, in the field and width the
/// datatype uses (see the module doc): a whole number in range for the integer types (300 is
/// not a UInt8), unix milliseconds for DateTime, a number for Float (in range) and Double,
/// `true`/`false` (or 0/1) for Boolean, a string for String, Text and UUID. The error names the
/// datatype.
pub fn write(value: &Value, dt: u32) -> Result<proto::Value, String> {
    use crate::whole_number as int;
    use proto::Value::*;
    let wrong = || format!("{value} is not a valid {}", datatype::name(dt));
    Ok(match dt {
        // Two's complement in the datatype's width.
        datatype::INT8 => IntValue(int::<i8>(value).ok_or_else(wrong)? as u8 as u32),
        datatype::INT16 => IntValue(int::<i16>(value).ok_or_else(wrong)? as u16 as u32),
        datatype::INT32 => IntValue(int::<i32>(value).ok_or_else(wrong)? as u32),
        datatype::INT64 => LongValue(int::<i64>(value).ok_or_else(wrong)? as u64),
        datatype::UINT8 => IntValue(int::<u8>(value).ok_or_else(wrong)?.into()),
        datatype::UINT16 => IntValue(int::<u16>(value).ok_or_else(wrong)?.into()),
        datatype::UINT32 => LongValue(int::<u32>(value).ok_or_else(wrong)?.into()),
        datatype::UINT64 | datatype::DATETIME => LongValue(int::<u64>(value).ok_or_else(wrong)?),
        datatype::FLOAT => {
            let f = value.as_f64().ok_or_else(wrong)?;
            if f.abs() > f64::from(f32::MAX) {
                return Err(wrong());
            }
            FloatValue(f as f32)
        }
        datatype::DOUBLE => DoubleValue(value.as_f64().ok_or_else(wrong)?),
        datatype::BOOLEAN => match value {
            Value::Bool(b) => BooleanValue(*b),
            Value::Number(_) if value.as_f64() == Some(0.0) => BooleanValue(false),
            Value::Number(_) if value.as_f64() == Some(1.0) => BooleanValue(true),
            _ => return Err(wrong()),
        },
        datatype::STRING | datatype::TEXT | datatype::UUID => StringValue(value.as_str().ok_or_else(wrong)?.into()),
        other => return Err(format!("writing Sparkplug {} metrics is not supported", datatype::name(other))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write_value;
    use proto::Value::*;
    use serde_json::json;

    #[test]
    fn sparkplug_value_writes_use_the_datatypes_field_and_width() {
        let ok = |v: Value, dt: u32| write(&v, dt).unwrap();
        assert_eq!(ok(json!(-1), datatype::INT8), IntValue(0xff), "two's complement in 8 bits");
        assert_eq!(ok(json!(-128), datatype::INT8), IntValue(0x80));
        assert_eq!(ok(json!(-5), datatype::INT16), IntValue(0xfffb), "two's complement in 16 bits");
        assert_eq!(ok(json!(300.0), datatype::INT16), IntValue(300));
        assert_eq!(ok(json!(-5), datatype::INT32), IntValue(0xffff_fffb));
        assert_eq!(ok(json!(255), datatype::UINT8), IntValue(255));
        assert_eq!(ok(json!(4294967295u64), datatype::UINT32), LongValue(u64::from(u32::MAX)), "UInt32 in long_value");
        assert_eq!(ok(json!(-2), datatype::INT64), LongValue(u64::MAX - 1));
        assert_eq!(ok(json!(u64::MAX), datatype::UINT64), LongValue(u64::MAX));
        assert_eq!(ok(json!(1700000000000u64), datatype::DATETIME), LongValue(1700000000000));
        assert_eq!(ok(json!(1.5), datatype::FLOAT), FloatValue(1.5));
        assert_eq!(ok(json!(3), datatype::DOUBLE), DoubleValue(3.0));
        assert_eq!(ok(json!(true), datatype::BOOLEAN), BooleanValue(true));
        assert_eq!(ok(json!(0), datatype::BOOLEAN), BooleanValue(false));
        assert_eq!(ok(json!("on"), datatype::TEXT), StringValue("on".into()));
        let err = |v: Value, dt: u32| write(&v, dt).unwrap_err();
        assert_eq!(err(json!("abc"), datatype::INT32), r#""abc" is not a valid Int32"#);
        assert_eq!(err(json!(-129), datatype::INT8), "-129 is not a valid Int8");
        assert_eq!(err(json!(256), datatype::UINT8), "256 is not a valid UInt8");
        assert_eq!(err(json!(4294967296u64), datatype::UINT32), "4294967296 is not a valid UInt32");
        assert_eq!(err(json!(-1), datatype::UINT64), "-1 is not a valid UInt64");
        assert_eq!(err(json!(12.5), datatype::INT32), "12.5 is not a valid Int32");
        assert_eq!(err(json!(1e39), datatype::FLOAT), "1e+39 is not a valid Float");
        assert_eq!(err(json!("true"), datatype::BOOLEAN), r#""true" is not a valid Boolean"#);
        assert_eq!(err(json!(5), datatype::STRING), "5 is not a valid String");
        assert_eq!(err(json!("AA=="), datatype::BYTES), "writing Sparkplug Bytes metrics is not supported");
        assert_eq!(write_value(r#"{"v":42,"t":1}"#), Ok(json!(42)));
        assert_eq!(write_value("\"x\""), Ok(json!("x")));
        assert!(write_value("{").is_err());
    }

    #[test]
    fn sparkplug_value_reads_take_the_datatypes_width_or_its_sign_extension() {
        let r = |v: proto::Value, dt: u32| read(&v, dt);
        // Int8 -5: in 8 bits, sign-extended to 32 (int_value) or 64 (long_value).
        for raw in [IntValue(0xfb), IntValue(0xffff_fffb), LongValue(0xfb), LongValue(u64::MAX - 4)] {
            assert_eq!(r(raw.clone(), datatype::INT8), Some(json!(-5)), "{raw:?}");
        }
        assert_eq!(r(IntValue(0x7f), datatype::INT8), Some(json!(127)));
        assert_eq!(r(IntValue(0x1fb), datatype::INT8), None, "neither form: out of range");
        assert_eq!(r(IntValue(0xffff_7fff), datatype::INT8), None);
        assert_eq!(r(IntValue(0xfffb), datatype::INT16), Some(json!(-5)));
        assert_eq!(r(IntValue(0xffff_8000), datatype::INT16), Some(json!(-32768)));
        assert_eq!(r(IntValue(0x8000_0000), datatype::INT32), Some(json!(i32::MIN)));
        assert_eq!(r(LongValue(u64::MAX - 4), datatype::INT32), Some(json!(-5)));
        assert_eq!(r(LongValue(u64::MAX), datatype::INT64), Some(json!(-1)));
        assert_eq!(r(LongValue(1 << 63), datatype::INT64), Some(json!(i64::MIN)));
        // Unsigned: in range from either field; UInt32 above 2^31 stays positive.
        assert_eq!(r(LongValue(3_000_000_000), datatype::UINT32), Some(json!(3_000_000_000u64)));
        assert_eq!(r(IntValue(3_000_000_000), datatype::UINT32), Some(json!(3_000_000_000u64)));
        assert_eq!(r(LongValue(1 << 32), datatype::UINT32), None);
        assert_eq!(r(IntValue(256), datatype::UINT8), None);
        assert_eq!(r(IntValue(65535), datatype::UINT16), Some(json!(65535)));
        assert_eq!(r(LongValue(u64::MAX), datatype::UINT64), Some(json!(u64::MAX)));
        assert_eq!(r(LongValue(1_700_000_000_000), datatype::DATETIME), Some(json!(1_700_000_000_000u64)));
        assert_eq!(r(IntValue(7), 0), Some(json!(7)), "no datatype: as sent");
        // Float in its shortest form; NaN, infinities and bytes carry no value.
        assert_eq!(serde_json::to_string(&r(FloatValue(21.7), datatype::FLOAT)).unwrap(), "21.7");
        assert_eq!(serde_json::to_string(&r(FloatValue(0.1), datatype::FLOAT)).unwrap(), "0.1");
        assert_eq!(serde_json::to_string(&r(FloatValue(1e30), datatype::FLOAT)).unwrap(), "1e+30");
        assert_eq!(serde_json::to_string(&r(FloatValue(-2.5e-7), datatype::FLOAT)).unwrap(), "-2.5e-7");
        assert_eq!(r(FloatValue(f32::NAN), datatype::FLOAT), None);
        assert_eq!(r(FloatValue(f32::INFINITY), datatype::FLOAT), None);
        assert_eq!(r(DoubleValue(21.700000762939453), datatype::DOUBLE), Some(json!(21.700000762939453)));
        assert_eq!(r(BytesValue(vec![1]), datatype::BYTES), None);
        assert_eq!(read_unsigned(&IntValue(3)), Some(3));
        assert_eq!(read_unsigned(&LongValue(255)), Some(255));
        assert_eq!(read_unsigned(&StringValue("3".into())), None);
    }
}
