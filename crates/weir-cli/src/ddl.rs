//! Schemas written as Spark writes them in DDL: `id BIGINT NOT NULL, amount
//! DECIMAL(18,2), ts TIMESTAMP, merchant STRING`.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

/// Parses a DDL column list. Types: BOOLEAN, INT (INTEGER), BIGINT (LONG),
/// FLOAT, DOUBLE, STRING, BINARY, DATE, TIMESTAMP (UTC, microseconds),
/// TIMESTAMP_NTZ, DECIMAL(p,s); each column may end in NOT NULL.
pub fn parse(text: &str) -> Result<SchemaRef, String> {
    let mut fields = Vec::new();
    for column in split_top_level(text) {
        let column = column.trim();
        if column.is_empty() {
            continue;
        }
        let (name, rest) = split_name(column)?;
        let mut rest = rest.trim().to_string();
        let upper = rest.to_ascii_uppercase();
        let nullable = !upper.ends_with("NOT NULL");
        if !nullable {
            rest.truncate(rest.len() - "NOT NULL".len());
        }
        let data_type = data_type(rest.trim()).map_err(|e| format!("column {name:?}: {e}"))?;
        fields.push(Field::new(name, data_type, nullable));
    }
    if fields.is_empty() {
        return Err("the schema has no columns; write them as `id BIGINT, name STRING`".into());
    }
    Ok(Arc::new(Schema::new(fields)))
}

fn split_top_level(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn split_name(column: &str) -> Result<(String, &str), String> {
    if let Some(quoted) = column.strip_prefix('`') {
        let end = quoted
            .find('`')
            .ok_or_else(|| format!("{column:?}: a `name` is not closed"))?;
        return Ok((quoted[..end].to_string(), &quoted[end + 1..]));
    }
    let end = column
        .find(char::is_whitespace)
        .ok_or_else(|| format!("{column:?}: write a name and a type, e.g. `id BIGINT`"))?;
    Ok((column[..end].to_string(), &column[end..]))
}

fn data_type(text: &str) -> Result<DataType, String> {
    let upper = text.to_ascii_uppercase().replace(' ', "");
    Ok(match upper.as_str() {
        "BOOLEAN" | "BOOL" => DataType::Boolean,
        "INT" | "INTEGER" => DataType::Int32,
        "BIGINT" | "LONG" => DataType::Int64,
        "FLOAT" | "REAL" => DataType::Float32,
        "DOUBLE" => DataType::Float64,
        "STRING" | "VARCHAR" | "TEXT" => DataType::Utf8,
        "BINARY" => DataType::Binary,
        "DATE" => DataType::Date32,
        "TIMESTAMP" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        "TIMESTAMP_NTZ" => DataType::Timestamp(TimeUnit::Microsecond, None),
        d if d.starts_with("DECIMAL(") && d.ends_with(')') => {
            let inner = &d["DECIMAL(".len()..d.len() - 1];
            let (p, s) = inner.split_once(',').ok_or("DECIMAL needs (precision,scale)")?;
            let p: u8 = p.parse().map_err(|_| "DECIMAL precision is a number")?;
            let s: i8 = s.parse().map_err(|_| "DECIMAL scale is a number")?;
            if p == 0 || p > 38 || s < 0 || s as u8 > p {
                return Err(format!("DECIMAL({p},{s}): precision 1 to 38, scale 0 to precision"));
            }
            DataType::Decimal128(p, s)
        }
        _ => {
            return Err(format!(
                "unknown type {text:?}; use BOOLEAN, INT, BIGINT, FLOAT, DOUBLE, STRING, BINARY, DATE, TIMESTAMP, TIMESTAMP_NTZ or DECIMAL(p,s)"
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparks_ddl_becomes_an_arrow_schema() {
        let s = parse("id BIGINT NOT NULL, amount decimal(18, 2), `merchant id` STRING,\n ts TIMESTAMP").unwrap();
        assert_eq!(s.fields().len(), 4);
        assert_eq!(s.field(0).data_type(), &DataType::Int64);
        assert!(!s.field(0).is_nullable());
        assert_eq!(s.field(1).data_type(), &DataType::Decimal128(18, 2));
        assert_eq!(s.field(2).name(), "merchant id");
        assert!(s.field(3).is_nullable());
    }

    #[test]
    fn a_bad_schema_says_what_is_wrong() {
        assert!(parse("id BIGNUM").unwrap_err().contains("unknown type \"BIGNUM\""));
        assert!(parse("id").unwrap_err().contains("a name and a type"));
        assert!(parse("d DECIMAL(40,2)").unwrap_err().contains("precision 1 to 38"));
        assert!(parse(" , ").unwrap_err().contains("no columns"));
    }
}
