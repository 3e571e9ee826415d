//! AMQP 0-9-1 basic properties and field tables to the typed-JSON text of the Python
//! reference (`cqforensics.codecs.amqp091.properties_json`), byte for byte. Anything the reference
//! would render in a way not mirrored here (floats, non-UTF-8 names, repeated names) or reject
//! returns `Err(Fallback)`, and the caller hands the message to the reference.

use base64::Engine;

#[derive(Debug)]
pub struct Fallback;

pub type R<T> = Result<T, Fallback>;

/// `std::str::from_utf8`, with short ASCII text (most names and values a store holds) checked
/// inline: the library call costs more than the check for a few bytes.
#[inline]
pub fn utf8(b: &[u8]) -> Option<&str> {
    if b.len() <= 32 && b.iter().all(|&c| c < 0x80) {
        // SAFETY: ASCII bytes (checked just above) are UTF-8
        return Some(unsafe { std::str::from_utf8_unchecked(b) });
    }
    std::str::from_utf8(b).ok()
}

/// What Python's `json.encoder.encode_basestring` (ensure_ascii=False) writes for `s`.
pub fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc: Option<&str> = match b {
            b'"' => Some("\\\""),
            b'\\' => Some("\\\\"),
            b'\n' => Some("\\n"),
            b'\r' => Some("\\r"),
            b'\t' => Some("\\t"),
            0x08 => Some("\\b"),
            0x0c => Some("\\f"),
            0..=0x1f => None,
            _ => continue,
        };
        out.push_str(&s[start..i]);
        match esc {
            Some(e) => out.push_str(e),
            None => out.push_str(&format!("\\u{:04x}", b)),
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// The decimal digits of `v`, as Python's `str(int)` writes them, without a heap string.
pub fn push_int(out: &mut String, v: i128) {
    let Ok(mut m) = u64::try_from(v.unsigned_abs()) else {
        out.push_str(&v.to_string()); // beyond 64 bits: no value of a store comes here
        return;
    };
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (m % 10) as u8;
        m /= 10;
        if m == 0 {
            break;
        }
    }
    if v < 0 {
        out.push('-');
    }
    out.push_str(utf8(&digits[at..]).unwrap_or_default()); // decimal digits: ASCII, checked inline
}

/// `"value":"text"` for UTF-8 bytes, else `"base64":"..."` (amqp091._text_json).
fn push_text(out: &mut String, raw: &[u8]) {
    match utf8(raw) {
        Some(s) => {
            out.push_str("\"value\":");
            push_json_str(out, s);
        }
        None => {
            out.push_str("\"base64\":\"");
            out.push_str(&base64::engine::general_purpose::STANDARD.encode(raw));
            out.push('"');
        }
    }
}

#[inline]
fn get<const N: usize>(buf: &[u8], o: usize) -> R<[u8; N]> {
    buf.get(o..o + N).ok_or(Fallback).map(|s| s.try_into().unwrap())
}

#[inline]
fn u32_at(buf: &[u8], o: usize) -> R<usize> {
    Ok(u32::from_be_bytes(get::<4>(buf, o)?) as usize)
}

fn type_name(kind: u8) -> Option<&'static str> {
    Some(match kind {
        b'S' => "longstr",
        b'T' => "timestamp",
        b'b' => "byte",
        b'B' => "unsignedbyte",
        b's' => "short",
        b'u' => "unsignedshort",
        b'I' => "signedint",
        b'i' => "unsignedint",
        b'l' | b'L' => "long",
        b't' => "bool",
        b'D' => "decimal",
        b'F' => "table",
        b'A' => "array",
        b'x' => "binary",
        b'V' => "void",
        b'f' => "float",
        b'd' => "double",
        _ => return None,
    })
}

/// The typed-JSON text of the field value at `o` (amqp091._value); returns the offset after it.
fn value(buf: &[u8], o: usize, depth: u32, out: &mut String) -> R<usize> {
    if depth > 100 {
        return Err(Fallback);
    }
    let kind = *buf.get(o).ok_or(Fallback)?;
    let name = type_name(kind).ok_or(Fallback)?;
    let o = o + 1;
    let fixed = |n: i128, size: usize, out: &mut String| -> usize {
        out.push_str("{\"type\":\"");
        out.push_str(name);
        out.push_str("\",\"value\":");
        push_int(out, n);
        out.push('}');
        o + size
    };
    Ok(match kind {
        b'b' => fixed(i8::from_be_bytes(get::<1>(buf, o)?) as i128, 1, out),
        b'B' => fixed(get::<1>(buf, o)?[0] as i128, 1, out),
        b's' => fixed(i16::from_be_bytes(get::<2>(buf, o)?) as i128, 2, out),
        b'u' => fixed(u16::from_be_bytes(get::<2>(buf, o)?) as i128, 2, out),
        b'I' => fixed(i32::from_be_bytes(get::<4>(buf, o)?) as i128, 4, out),
        b'i' => fixed(u32::from_be_bytes(get::<4>(buf, o)?) as i128, 4, out),
        b'l' | b'L' => fixed(i64::from_be_bytes(get::<8>(buf, o)?) as i128, 8, out),
        b'T' => fixed(u64::from_be_bytes(get::<8>(buf, o)?) as i128, 8, out),
        b'f' | b'd' => {
            let (v, size) = if kind == b'f' {
                (f32::from_be_bytes(get::<4>(buf, o)?) as f64, 4)
            } else {
                (f64::from_be_bytes(get::<8>(buf, o)?), 8)
            };
            out.push_str("{\"type\":\"");
            out.push_str(name);
            out.push_str("\",\"value\":");
            push_json_float(out, v);
            out.push('}');
            o + size
        }
        b't' => {
            let v = get::<1>(buf, o)?[0];
            out.push_str(if v != 0 {
                "{\"type\":\"bool\",\"value\":true}"
            } else {
                "{\"type\":\"bool\",\"value\":false}"
            });
            o + 1
        }
        b'D' => {
            let scale = get::<1>(buf, o)?[0];
            let v = u32::from_be_bytes(get::<4>(buf, o + 1)?);
            out.push_str(&format!("{{\"type\":\"decimal\",\"value\":{{\"scale\":{scale},\"value\":{v}}}}}"));
            o + 5
        }
        b'V' => {
            out.push_str("{\"type\":\"void\",\"value\":null}");
            o
        }
        _ => {
            let n = u32_at(buf, o)?;
            let (start, end) = (o + 4, o + 4 + n);
            if end > buf.len() {
                return Err(Fallback);
            }
            match kind {
                b'S' | b'x' => {
                    out.push_str("{\"type\":\"");
                    out.push_str(name);
                    out.push_str("\",");
                    push_text(out, &buf[start..end]);
                    out.push('}');
                }
                b'F' => {
                    out.push_str("{\"type\":\"table\",\"value\":");
                    table(buf, start, end, depth + 1, out)?;
                    out.push('}');
                }
                _ => {
                    // an array: its last item may overrun the declared length (as in the reference)
                    out.push_str("{\"type\":\"array\",\"value\":[");
                    let mut p = start;
                    let mut first = true;
                    while p < end {
                        if !first {
                            out.push(',');
                        }
                        first = false;
                        p = value(buf, p, depth + 1, out)?;
                    }
                    out.push_str("]}");
                }
            }
            end
        }
    })
}

/// A table entry: its name, and its value's typed-JSON text as a range of a texts buffer.
pub type Entry<'a> = (&'a str, std::ops::Range<usize>);

/// The entries of the table in `buf[o..end]` (amqp091._table), appended to `entries` in table
/// order, each value's typed-JSON text appended to `vals`.
pub fn table_entries<'a>(
    buf: &'a [u8],
    mut o: usize,
    end: usize,
    depth: u32,
    vals: &mut String,
    entries: &mut Vec<Entry<'a>>,
) -> R<()> {
    let first = entries.len();
    while o < end {
        let n = *buf.get(o).ok_or(Fallback)? as usize;
        let key = utf8(buf.get(o + 1..o + 1 + n).ok_or(Fallback)?).ok_or(Fallback)?;
        if entries.len() - first >= 256 || entries[first..].iter().any(|(k, _)| *k == key) {
            return Err(Fallback); // a repeated name (first place, last value) or a huge table
        }
        o += 1 + n;
        let at = vals.len();
        o = value(buf, o, depth, vals)?;
        entries.push((key, at..vals.len()));
    }
    if o != end {
        return Err(Fallback);
    }
    Ok(())
}

/// `{"name":value,...}` of table entries whose value texts are in `vals`.
pub fn push_entries(out: &mut String, entries: &[Entry], vals: &str) {
    out.push('{');
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_json_str(out, k);
        out.push(':');
        out.push_str(&vals[v.clone()]);
    }
    out.push('}');
}

/// The typed-JSON text of the table entries in `buf[o..end]`.
pub fn table(buf: &[u8], o: usize, end: usize, depth: u32, out: &mut String) -> R<()> {
    let mut vals = String::new();
    let mut entries = Vec::new();
    table_entries(buf, o, end, depth, &mut vals, &mut entries)?;
    push_entries(out, &entries, &vals);
    Ok(())
}

/// Python's `float.__repr__` (shortest round-trip digits; exponent form below 1e-4 and from
/// 1e16), non-finite values as the strings "nan", "inf", "-inf" (amqp091._json_float).
pub fn push_json_float(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("\"nan\"");
        return;
    }
    if v.is_infinite() {
        out.push_str(if v > 0.0 { "\"inf\"" } else { "\"-inf\"" });
        return;
    }
    let sci = format!("{:e}", v.abs()); // shortest round-trip digits: d[.ddd]e[-]x
    let (mantissa, exp) = sci.split_once('e').unwrap();
    let exp: i32 = exp.parse().unwrap();
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if v.is_sign_negative() {
        out.push('-');
    }
    let n = digits.len() as i32;
    let decpt = exp + 1;
    if (-4..16).contains(&exp) {
        if decpt <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-decpt) as usize));
            out.push_str(&digits);
        } else if decpt >= n {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', (decpt - n) as usize));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..decpt as usize]);
            out.push('.');
            out.push_str(&digits[decpt as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push_str(&format!("e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs()));
    }
}

/// The 13 scalar basic properties (strings as byte slices, checked UTF-8); whether there are
/// headers (their entries are the caller's).
#[derive(Default)]
pub struct Props<'a> {
    pub strings: [Option<&'a str>; 10],
    pub delivery_mode: Option<i32>,
    pub priority: Option<i32>,
    pub timestamp: Option<u64>,
    pub headers: bool,
}

/// Index of each string property in `Props::strings`, in the column order of the schema.
pub const STRING_PROPS: [&str; 10] = [
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
];

/// The basic properties encoded in `raw`; the headers' entries are appended to `entries`, their
/// value texts to `vals`.
pub fn properties<'a>(raw: &'a [u8], vals: &mut String, entries: &mut Vec<Entry<'a>>) -> R<Props<'a>> {
    let flags = u16::from_be_bytes(get::<2>(raw, 0)?);
    if flags & 1 != 0 {
        return Err(Fallback);
    }
    let mut p = Props::default();
    let mut o = 2usize;
    // wire order, flag bit 15 down to 2; string slots index STRING_PROPS
    const WIRE: [i8; 14] = [0, 1, -1, -2, -3, 2, 3, 4, 5, -4, 6, 7, 8, 9];
    for (k, &slot) in WIRE.iter().enumerate() {
        if flags & (1 << (15 - k)) == 0 {
            continue;
        }
        match slot {
            -1 => {
                let n = u32_at(raw, o)?;
                if o + 4 + n > raw.len() {
                    return Err(Fallback);
                }
                table_entries(raw, o + 4, o + 4 + n, 0, vals, entries)?;
                p.headers = true;
                o += 4 + n;
            }
            -2 => {
                p.delivery_mode = Some(get::<1>(raw, o)?[0] as i32);
                o += 1;
            }
            -3 => {
                p.priority = Some(get::<1>(raw, o)?[0] as i32);
                o += 1;
            }
            -4 => {
                p.timestamp = Some(u64::from_be_bytes(get::<8>(raw, o)?));
                o += 8;
            }
            s => {
                let n = get::<1>(raw, o)?[0] as usize;
                let v = raw.get(o + 1..o + 1 + n).ok_or(Fallback)?;
                p.strings[s as usize] = Some(utf8(v).ok_or(Fallback)?);
                o += 1 + n;
            }
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_python() {
        let mut s = String::new();
        push_json_str(&mut s, "a\"b\\c\n\u{1}é\u{7f}");
        assert_eq!(s, "\"a\\\"b\\\\c\\n\\u0001é\u{7f}\"");
    }

    #[test]
    fn table_longstr_and_int() {
        let mut raw = vec![1u8, b'k', b'S', 0, 0, 0, 2, b'h', b'i'];
        raw.extend([1u8, b'n', b'I', 0, 0, 0, 7]);
        let mut out = String::new();
        table(&raw, 0, raw.len(), 0, &mut out).unwrap();
        assert_eq!(out, r#"{"k":{"type":"longstr","value":"hi"},"n":{"type":"signedint","value":7}}"#);
    }

    #[test]
    fn ints_like_python_str() {
        for v in [0i128, 7, -7, 10, -128, i64::MAX as i128, i64::MIN as i128, u64::MAX as i128] {
            let mut s = String::new();
            push_int(&mut s, v);
            assert_eq!(s, v.to_string());
        }
    }

    #[test]
    fn floats_like_python_repr() {
        let cases = [
            (1.5, "1.5"),
            (1e16, "1e+16"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (-0.0, "-0.0"),
            (123.0, "123.0"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (1e100, "1e+100"),
            (0.1, "0.1"),
            (f64::NAN, "\"nan\""),
        ];
        for (v, want) in cases {
            let mut s = String::new();
            push_json_float(&mut s, v);
            assert_eq!(s, want);
        }
    }
}
