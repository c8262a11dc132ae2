//! The Sparkplug B protobuf schema (the parts a point needs), written after the public
//! specification's `sparkplug_b.proto` (proto2). Fields not declared here are skipped by the
//! decoder.

/// One Sparkplug message body.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Payload {
    /// Unix milliseconds when the message was made.
    #[prost(uint64, optional, tag = "1")]
    pub timestamp: Option<u64>,
    #[prost(message, repeated, tag = "2")]
    pub metrics: Vec<Metric>,
    #[prost(uint64, optional, tag = "3")]
    pub seq: Option<u64>,
    #[prost(string, optional, tag = "4")]
    pub uuid: Option<String>,
    #[prost(bytes = "vec", optional, tag = "5")]
    pub body: Option<Vec<u8>>,
}

/// One metric: named in births, by name or alias in data messages.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(uint64, optional, tag = "2")]
    pub alias: Option<u64>,
    #[prost(uint64, optional, tag = "3")]
    pub timestamp: Option<u64>,
    /// One of the [`super::datatype`] codes.
    #[prost(uint32, optional, tag = "4")]
    pub datatype: Option<u32>,
    #[prost(bool, optional, tag = "5")]
    pub is_historical: Option<bool>,
    #[prost(bool, optional, tag = "6")]
    pub is_transient: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    pub is_null: Option<bool>,
    #[prost(oneof = "Value", tags = "10, 11, 12, 13, 14, 15, 16")]
    pub value: Option<Value>,
}

/// The value forms of a metric (datasets, templates and extensions, tags 17–19, are not
/// declared: such metrics decode with no value).
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    /// Int8, Int16, Int32 (two's complement in their width), UInt8 and UInt16
    /// ([`super::value`]).
    #[prost(uint32, tag = "10")]
    IntValue(u32),
    /// Int64 (two's complement), UInt32, UInt64 and DateTime (unix ms).
    #[prost(uint64, tag = "11")]
    LongValue(u64),
    #[prost(float, tag = "12")]
    FloatValue(f32),
    #[prost(double, tag = "13")]
    DoubleValue(f64),
    #[prost(bool, tag = "14")]
    BooleanValue(bool),
    /// String, Text and UUID.
    #[prost(string, tag = "15")]
    StringValue(String),
    #[prost(bytes = "vec", tag = "16")]
    BytesValue(Vec<u8>),
}
