//! The protobuf wire format, read with each field's raw bytes kept, so that a message can be written
//! back with a few fields changed and every other field (unknown ones included) copied byte for byte.

use thiserror::Error;

/// A message that is not well-formed protobuf, or a field that is not of the kind it must be.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("the ONNX model is not a valid protobuf: {what}: {detail}")]
pub struct WireError {
    /// The message being read.
    pub what: &'static str,
    /// What was wrong, and where.
    pub detail: String,
}

/// A field's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Bytes(&'a [u8]),
}

/// One field of a message: its number, its payload, and its raw bytes (key and payload) to copy it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Field<'a> {
    pub number: u64,
    pub value: Value<'a>,
    pub raw: &'a [u8],
}

impl<'a> Field<'a> {
    /// The payload of a length-delimited field (a string, bytes, a message, a packed array).
    pub fn bytes(&self, what: &'static str) -> Result<&'a [u8], WireError> {
        match self.value {
            Value::Bytes(b) => Ok(b),
            _ => Err(WireError { what, detail: format!("field {} is not length-delimited", self.number) }),
        }
    }

    /// The payload of a varint field.
    pub fn varint(&self, what: &'static str) -> Result<u64, WireError> {
        match self.value {
            Value::Varint(v) => Ok(v),
            _ => Err(WireError { what, detail: format!("field {} is not a varint", self.number) }),
        }
    }

    /// A UTF-8 string field.
    pub fn string(&self, what: &'static str) -> Result<&'a str, WireError> {
        std::str::from_utf8(self.bytes(what)?)
            .map_err(|_| WireError { what, detail: "a string that is not UTF-8".into() })
    }
}

/// Every field of one message, in order. `what` names the message in errors.
pub(crate) fn parse<'a>(buf: &'a [u8], what: &'static str) -> Result<Vec<Field<'a>>, WireError> {
    let mut pos = 0;
    let mut fields = Vec::new();
    let fail = |detail: &str, pos: usize| WireError { what, detail: format!("{detail} at byte {pos}") };
    while pos < buf.len() {
        let start = pos;
        let key = read_varint(buf, &mut pos).ok_or_else(|| fail("a truncated or overlong varint", start))?;
        let value = match key & 7 {
            0 => Value::Varint(read_varint(buf, &mut pos).ok_or_else(|| fail("a truncated varint", start))?),
            1 => Value::Fixed64(u64::from_le_bytes(
                take(buf, &mut pos, 8)
                    .ok_or_else(|| fail("a truncated fixed64", start))?
                    .try_into()
                    .unwrap_or([0; 8]),
            )),
            2 => {
                let len = read_varint(buf, &mut pos).ok_or_else(|| fail("a truncated length", start))?;
                let len = usize::try_from(len).map_err(|_| fail("a length that does not fit", start))?;
                Value::Bytes(
                    take(buf, &mut pos, len)
                        .ok_or_else(|| fail("a field that runs past its message", start))?,
                )
            }
            5 => Value::Fixed32(u32::from_le_bytes(
                take(buf, &mut pos, 4)
                    .ok_or_else(|| fail("a truncated fixed32", start))?
                    .try_into()
                    .unwrap_or([0; 4]),
            )),
            _ => return Err(fail("an unsupported wire type (groups are not used by ONNX)", start)),
        };
        fields.push(Field { number: key >> 3, value, raw: &buf[start..pos] });
    }
    Ok(fields)
}

/// The payloads of every length-delimited field `number` of one message (the messages, strings or
/// packed arrays of a repeated field), in order.
pub(crate) fn bytes_fields<'a>(
    buf: &'a [u8],
    number: u64,
    what: &'static str,
) -> Result<Vec<&'a [u8]>, WireError> {
    parse(buf, what)?.iter().filter(|f| f.number == number).map(|f| f.bytes(what)).collect()
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn take<'a>(buf: &'a [u8], pos: &mut usize, len: usize) -> Option<&'a [u8]> {
    let end = pos.checked_add(len)?;
    let bytes = buf.get(*pos..end)?;
    *pos = end;
    Some(bytes)
}

/// The varints of a packed repeated field (or of one unpacked element).
pub(crate) fn packed_varints(payload: &[u8], what: &'static str) -> Result<Vec<u64>, WireError> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < payload.len() {
        out.push(
            read_varint(payload, &mut pos)
                .ok_or_else(|| WireError { what, detail: "a truncated packed varint".into() })?,
        );
    }
    Ok(out)
}

/// Appends a varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a varint field.
pub(crate) fn put_varint_field(out: &mut Vec<u8>, number: u64, v: u64) {
    put_varint(out, number << 3);
    put_varint(out, v);
}

/// Appends a length-delimited field.
pub(crate) fn put_bytes_field(out: &mut Vec<u8>, number: u64, payload: &[u8]) {
    put_varint(out, number << 3 | 2);
    put_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_byte_for_byte() {
        let mut m = Vec::new();
        put_varint_field(&mut m, 1, 300);
        put_bytes_field(&mut m, 2, b"abc");
        m.extend_from_slice(&[0x19, 1, 2, 3, 4, 5, 6, 7, 8]); // field 3, fixed64
        m.extend_from_slice(&[0x25, 1, 2, 3, 4]); // field 4, fixed32
        put_varint_field(&mut m, 1000, u64::MAX);
        let fields = parse(&m, "test").unwrap();
        assert_eq!(fields.len(), 5);
        assert_eq!(fields[0].value, Value::Varint(300));
        assert_eq!(fields[1].value, Value::Bytes(b"abc"));
        assert_eq!(fields[2].value, Value::Fixed64(0x0807060504030201));
        assert_eq!(fields[3].value, Value::Fixed32(0x04030201));
        assert_eq!(fields[4].number, 1000);
        assert_eq!(fields.iter().flat_map(|f| f.raw.iter().copied()).collect::<Vec<_>>(), m);
    }

    #[test]
    fn malformed_input_is_an_error() {
        for bad in [&[0x12, 5, 1][..], &[0x0b], &[0x80; 11], &[0x08], &[0x09, 1]] {
            assert!(parse(bad, "test").is_err(), "{bad:?}");
        }
        assert_eq!(
            parse(&[0x12, 5, 1], "GraphProto").unwrap_err().to_string(),
            "the ONNX model is not a valid protobuf: GraphProto: a field that runs past its message at byte 0"
        );
    }
}
