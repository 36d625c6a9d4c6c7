//! The value formats: each parses a chunk of values, one row per value, or
//! fails if any value is not exactly one row of its schema.

use std::borrow::Cow;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_avro::reader::ReaderBuilder as AvroReader;
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use arrow_json::reader::ReaderBuilder as JsonReader;
use arrow_schema::{ArrowError, SchemaRef};

use crate::error::KafkaError;

/// How each Avro value is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AvroFraming {
    /// Confluent's wire format: byte 0, the schema's registry id (4 bytes,
    /// big-endian), then the datum. A value with another id is refused.
    Confluent {
        /// The schema's id in the registry.
        schema_id: u32,
    },
    /// Avro's single-object encoding: `C3 01`, the schema's 64-bit Rabin
    /// fingerprint, then the datum.
    SingleObject,
    /// The datum alone.
    Bare,
}

/// A value format with its schema.
#[derive(Debug, Clone)]
pub(crate) enum Parser {
    Json(SchemaRef),
    Avro(Avro),
}

#[derive(Debug, Clone)]
pub(crate) struct Avro {
    store: SchemaStore,
    fingerprint: Fingerprint,
    /// Put before a bare datum: the single-object header of the schema.
    header: Option<Vec<u8>>,
    schema: SchemaRef,
}

impl Parser {
    pub(crate) fn json(schema: SchemaRef) -> Self {
        Parser::Json(schema)
    }

    pub(crate) fn avro(schema: &str, framing: AvroFraming) -> Result<Self, KafkaError> {
        let invalid = |reason: String| KafkaError::InvalidOption {
            option: "avro schema",
            reason,
        };
        let avro = AvroSchema::new(schema.to_string());
        let (store, fingerprint, header) = match framing {
            AvroFraming::Confluent { schema_id } => {
                let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
                let fp = store
                    .set(Fingerprint::Id(schema_id), avro)
                    .map_err(|e| invalid(e.to_string()))?;
                (store, fp, None)
            }
            AvroFraming::SingleObject | AvroFraming::Bare => {
                let mut store = SchemaStore::new();
                let fp = store.register(avro).map_err(|e| invalid(e.to_string()))?;
                let header = match (framing, fp) {
                    (AvroFraming::Bare, Fingerprint::Rabin(n)) => {
                        Some([&[0xC3u8, 0x01][..], &n.to_le_bytes()].concat())
                    }
                    _ => None,
                };
                (store, fp, header)
            }
        };
        let decoder = AvroReader::new()
            .with_writer_schema_store(store.clone())
            .with_active_fingerprint(fingerprint)
            .build_decoder()
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Parser::Avro(Avro {
            store,
            fingerprint,
            header,
            schema: decoder.schema(),
        }))
    }

    /// The columns a value becomes.
    pub(crate) fn schema(&self) -> SchemaRef {
        match self {
            Parser::Json(schema) => schema.clone(),
            Parser::Avro(a) => a.schema.clone(),
        }
    }

    /// One row per value; an error if any value is missing (a tombstone) or
    /// not exactly one row of the schema.
    pub(crate) fn parse(&self, rows: &[Option<&[u8]>]) -> Result<RecordBatch, ArrowError> {
        let values = rows
            .iter()
            .map(|r| r.ok_or_else(|| ArrowError::ParseError("the record has no value (a tombstone)".into())))
            .collect::<Result<Vec<_>, _>>()?;
        let batch = match self {
            Parser::Json(schema) => parse_json(schema, &values)?,
            Parser::Avro(a) => a.parse(&values)?,
        };
        if batch.num_rows() != rows.len() {
            return Err(ArrowError::ParseError(
                "a value is not exactly one row of the schema".into(),
            ));
        }
        Ok(batch)
    }
}

fn parse_json(schema: &SchemaRef, values: &[&[u8]]) -> Result<RecordBatch, ArrowError> {
    let mut decoder = JsonReader::new(schema.clone())
        .with_batch_size(values.len().max(1))
        .build_decoder()?;
    for (i, bytes) in values.iter().enumerate() {
        // The decoder stops when a batch is full: what it left must be blank.
        let used = decoder.decode(bytes)?;
        let rest_blank = bytes[used..].iter().all(u8::is_ascii_whitespace);
        decoder.decode(b"\n")?;
        if !rest_blank || decoder.has_partial_record() || decoder.len() != i + 1 {
            return Err(ArrowError::JsonError("the value is not exactly one JSON object".into()));
        }
    }
    Ok(decoder
        .flush()?
        .unwrap_or_else(|| RecordBatch::new_empty(schema.clone())))
}

impl Avro {
    fn parse(&self, values: &[&[u8]]) -> Result<RecordBatch, ArrowError> {
        let mut decoder = AvroReader::new()
            .with_writer_schema_store(self.store.clone())
            .with_active_fingerprint(self.fingerprint)
            .with_batch_size(values.len().max(1))
            .build_decoder()?;
        for bytes in values {
            let framed: Cow<[u8]> = match &self.header {
                Some(h) => Cow::Owned([h.as_slice(), bytes].concat()),
                None => Cow::Borrowed(bytes),
            };
            let used = decoder
                .decode(&framed)
                .map_err(|e| ArrowError::AvroError(e.to_string()))?;
            if used != framed.len() {
                return Err(ArrowError::AvroError(
                    "the value is not exactly one datum of the schema".into(),
                ));
            }
        }
        Ok(decoder
            .flush()
            .map_err(|e| ArrowError::AvroError(e.to_string()))?
            .unwrap_or_else(|| RecordBatch::new_empty(Arc::clone(&self.schema))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::types::Record;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::Array;

    const SCHEMA: &str = r#"{"type": "record", "name": "Payment", "fields": [
        {"name": "event_id", "type": "long"},
        {"name": "merchant", "type": ["null", "string"], "default": null}
    ]}"#;

    /// The datum alone, by the apache-avro crate.
    fn datum(id: i64, merchant: Option<&str>) -> Vec<u8> {
        let schema = apache_avro::Schema::parse_str(SCHEMA).unwrap();
        let mut record = Record::new(&schema).unwrap();
        record.put("event_id", id);
        record.put(
            "merchant",
            match merchant {
                Some(m) => apache_avro::types::Value::Union(1, Box::new(apache_avro::types::Value::String(m.into()))),
                None => apache_avro::types::Value::Union(0, Box::new(apache_avro::types::Value::Null)),
            },
        );
        apache_avro::to_avro_datum(&schema, record).unwrap()
    }

    fn ids(batch: &RecordBatch) -> Vec<i64> {
        batch.column(0).as_primitive::<Int64Type>().values().to_vec()
    }

    #[test]
    fn bare_avro_datums_become_rows() {
        let p = Parser::avro(SCHEMA, AvroFraming::Bare).unwrap();
        let (a, b) = (datum(1, Some("m1")), datum(2, None));
        let batch = p.parse(&[Some(&a), Some(&b)]).unwrap();
        assert_eq!(ids(&batch), [1, 2]);
        let merchants = batch.column(1).as_string::<i32>();
        assert_eq!(merchants.value(0), "m1");
        assert!(merchants.is_null(1));
    }

    #[test]
    fn confluent_framing_checks_the_schema_id() {
        let p = Parser::avro(SCHEMA, AvroFraming::Confluent { schema_id: 7 }).unwrap();
        let framed = |id: u32, d: Vec<u8>| [&[0u8][..], &id.to_be_bytes(), &d].concat();
        let good = framed(7, datum(3, Some("m3")));
        assert_eq!(ids(&p.parse(&[Some(&good)]).unwrap()), [3]);
        let other = framed(8, datum(4, None));
        assert!(
            p.parse(&[Some(&other)]).is_err(),
            "a value written with another schema id"
        );
        let bare = datum(5, None);
        assert!(
            p.parse(&[Some(&bare)]).is_err(),
            "a value without the wire format's header"
        );
    }

    #[test]
    fn a_value_that_is_not_one_datum_is_refused() {
        let p = Parser::avro(SCHEMA, AvroFraming::Bare).unwrap();
        let truncated = &datum(6, Some("merchant"))[..3];
        assert!(p.parse(&[Some(truncated)]).is_err());
        let two = [datum(7, None), datum(8, None)].concat();
        assert!(p.parse(&[Some(&two)]).is_err());
        assert!(p.parse(&[None]).is_err(), "a tombstone");
        assert!(Parser::avro("{\"type\": \"nonsense\"}", AvroFraming::Bare).is_err());
    }
}
