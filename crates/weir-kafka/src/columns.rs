//! The columns a Kafka record becomes, as Spark's Kafka source names them.

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, Int32Builder, Int64Builder, ListBuilder, StringBuilder, StructBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use rdkafka::message::{Headers, Message, Timestamp};

/// `timestamp_type` of a record whose producer set its time.
pub const CREATE_TIME: i32 = 0;
/// `timestamp_type` of a record the broker timed on arrival.
pub const LOG_APPEND_TIME: i32 = 1;

fn header_fields() -> Fields {
    Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Binary, true),
    ])
}

/// The schema of the records: `key` and `value` (binary, null for a missing
/// key or a tombstone), `topic`, `partition`, `offset`, `timestamp` (UTC,
/// microseconds), `timestamp_type` (0 create time, 1 log append time), and
/// with `headers` a list of `{key, value}`.
pub fn schema(headers: bool) -> SchemaRef {
    let mut fields = vec![
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new("topic", DataType::Utf8, false),
        Field::new("partition", DataType::Int32, false),
        Field::new("offset", DataType::Int64, false),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("timestamp_type", DataType::Int32, true),
    ];
    if headers {
        fields.push(Field::new(
            "headers",
            DataType::List(Arc::new(Field::new("item", DataType::Struct(header_fields()), true))),
            true,
        ));
    }
    Arc::new(Schema::new(fields))
}

/// Collects records into one record batch.
pub(crate) struct RecordColumns {
    schema: SchemaRef,
    key: BinaryBuilder,
    value: BinaryBuilder,
    topic: StringBuilder,
    partition: Int32Builder,
    offset: Int64Builder,
    timestamp: TimestampMicrosecondBuilder,
    timestamp_type: Int32Builder,
    headers: Option<ListBuilder<StructBuilder>>,
    rows: usize,
    bytes: usize,
}

impl RecordColumns {
    pub(crate) fn new(schema: SchemaRef, headers: bool) -> Self {
        RecordColumns {
            schema,
            key: BinaryBuilder::new(),
            value: BinaryBuilder::new(),
            topic: StringBuilder::new(),
            partition: Int32Builder::new(),
            offset: Int64Builder::new(),
            timestamp: TimestampMicrosecondBuilder::new().with_timezone("UTC"),
            timestamp_type: Int32Builder::new(),
            headers: headers.then(|| ListBuilder::new(StructBuilder::from_fields(header_fields(), 0))),
            rows: 0,
            bytes: 0,
        }
    }

    /// Rows collected so far.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Key and value bytes collected so far.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn push<M: Message>(&mut self, m: &M) {
        self.key.append_option(m.key());
        self.value.append_option(m.payload());
        self.topic.append_value(m.topic());
        self.partition.append_value(m.partition());
        self.offset.append_value(m.offset());
        let (ts, kind) = match m.timestamp() {
            Timestamp::CreateTime(ms) => (Some(ms * 1000), Some(CREATE_TIME)),
            Timestamp::LogAppendTime(ms) => (Some(ms * 1000), Some(LOG_APPEND_TIME)),
            Timestamp::NotAvailable => (None, None),
        };
        self.timestamp.append_option(ts);
        self.timestamp_type.append_option(kind);
        if let Some(list) = &mut self.headers {
            match m.headers() {
                Some(headers) => {
                    let entries = list.values();
                    for h in headers.iter() {
                        entries
                            .field_builder::<StringBuilder>(0)
                            .expect("header key is a string")
                            .append_value(h.key);
                        entries
                            .field_builder::<BinaryBuilder>(1)
                            .expect("header value is binary")
                            .append_option(h.value);
                        entries.append(true);
                    }
                    list.append(true);
                }
                None => list.append(false),
            }
        }
        self.rows += 1;
        self.bytes += m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len);
    }

    /// The rows collected, which are then forgotten.
    pub(crate) fn finish(&mut self) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(self.key.finish()),
            Arc::new(self.value.finish()),
            Arc::new(self.topic.finish()),
            Arc::new(self.partition.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(self.timestamp.finish()),
            Arc::new(self.timestamp_type.finish()),
        ];
        if let Some(list) = &mut self.headers {
            columns.push(Arc::new(list.finish()));
        }
        self.rows = 0;
        self.bytes = 0;
        RecordBatch::try_new(self.schema.clone(), columns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};

    #[test]
    fn records_become_sparks_columns() {
        let schema = schema(true);
        let mut cols = RecordColumns::new(schema.clone(), true);
        let headers = OwnedHeaders::new().insert(Header {
            key: "trace",
            value: Some("abc"),
        });
        let with = OwnedMessage::new(
            Some(b"{\"id\":1}".to_vec()),
            Some(b"k1".to_vec()),
            "payments".into(),
            Timestamp::CreateTime(1_700_000_000_123),
            2,
            41,
            Some(headers),
        );
        let tombstone = OwnedMessage::new(None, None, "payments".into(), Timestamp::NotAvailable, 2, 42, None);
        cols.push(&with);
        cols.push(&tombstone);
        assert_eq!((cols.rows(), cols.bytes()), (2, 10));
        let batch = cols.finish().unwrap();
        assert_eq!(batch.schema(), schema);
        assert_eq!(batch.num_rows(), 2);
        let offsets = batch
            .column(4)
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap();
        assert_eq!(offsets.values(), &[41, 42]);
        let ts = batch
            .column(5)
            .as_any()
            .downcast_ref::<arrow_array::TimestampMicrosecondArray>()
            .unwrap();
        assert_eq!(ts.value(0), 1_700_000_000_123_000);
        assert!(ts.is_null(1));
        assert!(batch.column(1).is_null(1));
        assert!(batch.column(7).is_null(1) && !batch.column(7).is_null(0));
        assert_eq!(cols.rows(), 0);
    }
}
