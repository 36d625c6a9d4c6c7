//! Typed columns from record values (JSON into a given Arrow schema, Avro
//! with a given schema), with the Kafka columns a query keeps beside them,
//! and records that do not parse failing the batch or set aside in a
//! dead-letter column.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BinaryArray, Int32Array, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::KafkaError;
pub use crate::formats::AvroFraming;
use crate::formats::Parser;
use crate::offsets::TopicPartition;

/// What to do with a record whose value does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnBadRecord {
    /// Fail the batch, naming the record's partition and offset (the
    /// default). Nothing of the batch is committed.
    Fail,
    /// Keep the row: its parsed columns are null and this binary column holds
    /// the value as it came, so the query can route it elsewhere.
    DeadLetterColumn(String),
}

/// How record values become typed columns: parsed by a format, followed by
/// the Kafka columns named in `keep_columns`.
#[derive(Debug, Clone)]
pub struct ValueColumns {
    parser: Parser,
    keep_columns: Vec<String>,
    on_bad_record: OnBadRecord,
}

impl ValueColumns {
    /// Each value one JSON object, parsed into `schema`'s fields: a field the
    /// object lacks is null (an error if the field is not nullable); a field
    /// the schema lacks is ignored.
    pub fn json(schema: SchemaRef) -> Self {
        Self::with(Parser::json(schema))
    }

    /// Each value one Avro datum of the record schema `schema` (Avro's JSON
    /// form), framed as `framing` says; the columns follow the schema's
    /// fields.
    pub fn avro(schema: &str, framing: AvroFraming) -> Result<Self, KafkaError> {
        Ok(Self::with(Parser::avro(schema, framing)?))
    }

    fn with(parser: Parser) -> Self {
        ValueColumns {
            parser,
            keep_columns: Vec::new(),
            on_bad_record: OnBadRecord::Fail,
        }
    }

    /// Keeps these Kafka columns (`partition`, `offset`, `timestamp`, ...)
    /// after the parsed ones.
    pub fn keep_columns<I, S>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.keep_columns = columns.into_iter().map(Into::into).collect();
        self
    }

    /// What to do with a record whose value does not parse.
    pub fn on_bad_record(mut self, on_bad: OnBadRecord) -> Self {
        self.on_bad_record = on_bad;
        self
    }
}

/// Turns the raw columns of a chunk of records into the query's columns.
#[derive(Debug, Clone)]
pub(crate) struct ValueDecoder {
    parser: Parser,
    keep: Vec<String>,
    on_bad: OnBadRecord,
    output: SchemaRef,
}

impl ValueDecoder {
    /// A decoder for `values`, whose kept columns come from `raw`.
    pub(crate) fn new(values: &ValueColumns, raw: &Schema) -> Result<Self, KafkaError> {
        let (keep, on_bad) = (&values.keep_columns, values.on_bad_record.clone());
        let invalid = |reason: String| KafkaError::InvalidOption {
            option: "value_columns",
            reason,
        };
        let dead_letter = matches!(on_bad, OnBadRecord::DeadLetterColumn(_));
        // A row that did not parse has nulls in every parsed column.
        let mut out: Vec<Field> = values
            .parser
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(f.is_nullable() || dead_letter))
            .collect();
        let mut names: BTreeSet<String> = out.iter().map(|f| f.name().clone()).collect();
        for name in keep {
            let field = raw
                .field_with_name(name)
                .map_err(|_| invalid(format!("{name:?} is not a Kafka column (key, value, topic, partition, offset, timestamp, timestamp_type, headers)")))?;
            if !names.insert(name.clone()) {
                return Err(invalid(format!("the value's schema already has a column {name:?}")));
            }
            out.push(field.clone());
        }
        if let OnBadRecord::DeadLetterColumn(name) = &on_bad {
            if !names.insert(name.clone()) {
                return Err(invalid(format!("the dead-letter column {name:?} is already a column")));
            }
            out.push(Field::new(name, DataType::Binary, true));
        }
        Ok(ValueDecoder {
            parser: values.parser.clone(),
            keep: keep.to_vec(),
            on_bad,
            output: Arc::new(Schema::new(out)),
        })
    }

    /// The schema of what [`ValueDecoder::decode`] returns.
    pub(crate) fn schema(&self) -> SchemaRef {
        self.output.clone()
    }

    /// The query's columns for the raw records `raw`.
    pub(crate) fn decode(&self, raw: &RecordBatch) -> Result<RecordBatch, KafkaError> {
        let values = column::<BinaryArray>(raw, "value");
        let rows: Vec<Option<&[u8]>> = (0..values.len())
            .map(|i| values.is_valid(i).then(|| values.value(i)))
            .collect();
        let (mut columns, dead) = match self.parser.parse(&rows) {
            Ok(batch) => (batch.columns().to_vec(), None),
            Err(_) => self.parse_around_bad(raw, &rows)?,
        };
        for name in &self.keep {
            columns.push(raw.column_by_name(name).expect("a raw column").clone());
        }
        if let OnBadRecord::DeadLetterColumn(_) = self.on_bad {
            columns.push(dead.unwrap_or_else(|| arrow_array::new_null_array(&DataType::Binary, raw.num_rows())));
        }
        Ok(RecordBatch::try_new(self.output.clone(), columns)?)
    }

    /// Finds the rows that do not parse, one by one; fails on the first, or
    /// parses the others and returns their columns with nulls in the bad
    /// rows, and the dead-letter column holding the bad values.
    fn parse_around_bad(
        &self,
        raw: &RecordBatch,
        rows: &[Option<&[u8]>],
    ) -> Result<(Vec<ArrayRef>, Option<ArrayRef>), KafkaError> {
        let mut good = Vec::with_capacity(rows.len());
        let mut dead: Vec<Option<&[u8]>> = vec![None; rows.len()];
        for (i, row) in rows.iter().enumerate() {
            match self.parser.parse(std::slice::from_ref(row)) {
                Ok(_) => good.push(i),
                Err(e) => match &self.on_bad {
                    OnBadRecord::Fail => {
                        return Err(KafkaError::BadRecord {
                            tp: TopicPartition {
                                topic: column::<StringArray>(raw, "topic").value(i).to_string(),
                                partition: column::<Int32Array>(raw, "partition").value(i),
                            },
                            offset: column::<Int64Array>(raw, "offset").value(i),
                            reason: e.to_string(),
                        });
                    }
                    OnBadRecord::DeadLetterColumn(_) => dead[i] = Some(row.unwrap_or_default()),
                },
            }
        }
        let good_rows: Vec<Option<&[u8]>> = good.iter().map(|i| rows[*i]).collect();
        let parsed = self.parser.parse(&good_rows)?;
        // Row i of the chunk is row `slot[i]` of `parsed`, or null.
        let mut slot = vec![None; rows.len()];
        for (n, i) in good.iter().enumerate() {
            slot[*i] = Some(n as u32);
        }
        let indices = UInt32Array::from(slot);
        let columns = parsed
            .columns()
            .iter()
            .map(|c| arrow_select::take::take(c.as_ref(), &indices, None))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((columns, Some(Arc::new(BinaryArray::from(dead)))))
    }
}

fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> &'a T {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .expect("the raw columns")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::RecordColumns;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type};
    use rdkafka::message::{OwnedMessage, Timestamp};

    fn raw(values: &[Option<&str>]) -> RecordBatch {
        let schema = crate::schema(false);
        let mut cols = RecordColumns::new(schema, false);
        for (i, v) in values.iter().enumerate() {
            let m = OwnedMessage::new(
                v.map(|v| v.as_bytes().to_vec()),
                None,
                "payments".into(),
                Timestamp::CreateTime(1000),
                3,
                40 + i as i64,
                None,
            );
            cols.push(&m);
        }
        cols.finish().unwrap()
    }

    fn values() -> ValueColumns {
        ValueColumns::json(Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("amount", DataType::Float64, true),
        ])))
    }

    fn decoder(json: ValueColumns) -> ValueDecoder {
        ValueDecoder::new(&json, &crate::schema(false)).unwrap()
    }

    #[test]
    fn values_become_typed_columns_beside_the_kept_kafka_columns() {
        let d = decoder(values().keep_columns(["partition", "offset"]));
        let out = d
            .decode(&raw(&[
                Some(r#"{"id":1,"amount":2.5}"#),
                Some(r#"{"id":2,"extra":true}"#),
            ]))
            .unwrap();
        let schema = out.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["id", "amount", "partition", "offset"]);
        assert_eq!(out.column(0).as_primitive::<Int64Type>().values(), &[1, 2]);
        assert_eq!(out.column(1).as_primitive::<Float64Type>().value(0), 2.5);
        assert!(out.column(1).is_null(1));
        assert_eq!(out.column(3).as_primitive::<Int64Type>().values(), &[40, 41]);
    }

    #[test]
    fn a_value_that_does_not_parse_fails_the_batch_naming_its_offset() {
        let d = decoder(values());
        for (bad, why) in [
            (Some(r#"{"id":"x"}"#), "type"),
            (Some(r#"{"id":3"#), "truncated"),
            (Some(r#"{"id":3}{"id":4}"#), "two objects"),
            (Some("not json"), "syntax"),
            (None, "tombstone"),
            (Some(r#"{"amount":1.0}"#), "missing required field"),
        ] {
            let err = d
                .decode(&raw(&[Some(r#"{"id":1}"#), bad, Some(r#"{"id":5}"#)]))
                .unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("payments-3 offset 41"), "{why}: {msg}");
            assert!(matches!(err, KafkaError::BadRecord { offset: 41, .. }), "{why}");
        }
    }

    #[test]
    fn a_dead_letter_column_keeps_the_bad_value_and_the_rest_of_the_batch() {
        let d = decoder(values().on_bad_record(OnBadRecord::DeadLetterColumn("corrupt".into())));
        let out = d
            .decode(&raw(&[Some(r#"{"id":1}"#), Some(r#"{"id":"x"}"#), Some(r#"{"id":3}"#)]))
            .unwrap();
        assert_eq!(out.num_rows(), 3);
        let ids = out.column(0).as_primitive::<Int64Type>();
        assert_eq!((ids.value(0), ids.is_null(1), ids.value(2)), (1, true, 3));
        let dead = out.column_by_name("corrupt").unwrap().as_binary::<i32>();
        assert!(dead.is_null(0) && dead.is_null(2));
        assert_eq!(dead.value(1), br#"{"id":"x"}"#);
        // Every row good: the column is there, all null.
        let out = d.decode(&raw(&[Some(r#"{"id":1}"#)])).unwrap();
        assert_eq!(out.column_by_name("corrupt").unwrap().null_count(), 1);
    }

    #[test]
    fn kept_columns_must_be_kafka_columns_with_names_of_their_own() {
        let unknown = ValueDecoder::new(&values().keep_columns(["offsett"]), &crate::schema(false)).unwrap_err();
        assert!(
            unknown.to_string().contains("\"offsett\" is not a Kafka column"),
            "{unknown}"
        );
        let schema = Arc::new(Schema::new(vec![Field::new("offset", DataType::Int64, true)]));
        let clash = ValueDecoder::new(
            &ValueColumns::json(schema).keep_columns(["offset"]),
            &crate::schema(false),
        )
        .unwrap_err();
        assert!(clash.to_string().contains("already has a column \"offset\""), "{clash}");
    }
}
