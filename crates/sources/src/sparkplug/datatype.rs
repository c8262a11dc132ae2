//! Sparkplug B datatype codes (the specification's `DataType` enum, scalar part).

pub const INT8: u32 = 1;
pub const INT16: u32 = 2;
pub const INT32: u32 = 3;
pub const INT64: u32 = 4;
pub const UINT8: u32 = 5;
pub const UINT16: u32 = 6;
pub const UINT32: u32 = 7;
pub const UINT64: u32 = 8;
pub const FLOAT: u32 = 9;
pub const DOUBLE: u32 = 10;
pub const BOOLEAN: u32 = 11;
pub const STRING: u32 = 12;
pub const DATETIME: u32 = 13;
pub const TEXT: u32 = 14;
pub const UUID: u32 = 15;
pub const BYTES: u32 = 17;

/// The specification's name of a datatype code, for messages.
pub fn name(code: u32) -> &'static str {
    const NAMES: [&str; 20] = [
        "Unknown", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Float", "Double",
        "Boolean", "String", "DateTime", "Text", "UUID", "DataSet", "Bytes", "File", "Template",
    ];
    NAMES.get(code as usize).copied().unwrap_or("Unknown")
}
