//! JSON text parsed into columns by a schema: Spark's `from_json`.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{new_null_array, Array, RecordBatch, StringArray, StructArray};
use arrow_buffer::NullBuffer;
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};

use crate::error::SqlError;

/// Characters of a malformed value an error shows.
const EXCERPT: usize = 120;

/// Parses the JSON objects in a string column into the fields of a schema
/// (Spark's `from_json`), on each record batch of a stream:
///
/// ```
/// use std::sync::Arc;
/// use arrow_schema::{DataType, Field, Schema};
/// use weir_core::prelude::*;
/// use weir_sql::{FromJson, StreamSqlExt};
///
/// let payment = Arc::new(Schema::new(vec![
///     Field::new("merchant_id", DataType::Int64, true),
///     Field::new("amount", DataType::Float64, true),
/// ]));
/// let events = read_stream(RateSource::rows_per_batch(10))
///     .sql("SELECT event_id, '{\"merchant_id\": 7, \"amount\": 1.5}' AS body FROM input")
///     .parse_json(FromJson::new("body", payment).flatten());
/// let names: Vec<String> = events.schema().unwrap().fields().iter().map(|f| f.name().clone()).collect();
/// assert_eq!(names, ["event_id", "merchant_id", "amount"]);
/// ```
///
/// - By default the string column is replaced by a struct column of the
///   same name; [`FromJson::into_column`] adds it under another name and
///   keeps the text; [`FromJson::flatten`] puts its fields in the text's
///   place (as `SELECT data.*` would).
/// - Every parsed field is nullable: a JSON object without a field gives
///   null there; fields the schema does not name are ignored. A null text,
///   an empty one or the JSON literal `null` gives a null struct (null
///   fields when flattened).
/// - A value that is not one JSON object of the schema's types (bad JSON,
///   an array, a string where a number goes) fails the batch with an error
///   naming the row, the reason and the start of the value: nothing of the
///   batch is committed. [`FromJson::permissive`] makes such a value null
///   instead, as Spark's default mode does, for streams where a bad record
///   must not stop the query.
#[derive(Debug, Clone)]
pub struct FromJson {
    column: String,
    fields: Fields,
    output: Output,
    permissive: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Output {
    Replace,
    Column(String),
    Flatten,
}

impl FromJson {
    /// Parses the string column `column` by `schema`.
    pub fn new(column: impl Into<String>, schema: SchemaRef) -> Self {
        let fields: Fields = schema
            .fields()
            .iter()
            .map(|f| Arc::new(f.as_ref().clone().with_nullable(true)))
            .collect();
        FromJson {
            column: column.into(),
            fields,
            output: Output::Replace,
            permissive: false,
        }
    }

    /// Adds the struct column `name` (replacing a column of that name) and
    /// keeps the text column.
    pub fn into_column(mut self, name: impl Into<String>) -> Self {
        self.output = Output::Column(name.into());
        self
    }

    /// Puts the parsed fields, as top-level columns, in the text column's
    /// place.
    pub fn flatten(mut self) -> Self {
        self.output = Output::Flatten;
        self
    }

    /// Makes a malformed value null instead of failing the batch.
    pub fn permissive(mut self) -> Self {
        self.permissive = true;
        self
    }

    /// The batch with its text column parsed.
    pub fn apply(&self, batch: &RecordBatch) -> Result<RecordBatch, SqlError> {
        let schema = batch.schema();
        let at = schema.index_of(&self.column).map_err(|_| SqlError::MissingColumn {
            operator: "from_json".into(),
            column: self.column.clone(),
            available: schema.fields().iter().map(|f| f.name().clone()).collect(),
        })?;
        let text = batch.column(at);
        let text = match text.data_type() {
            DataType::Utf8 => text.clone(),
            DataType::LargeUtf8 | DataType::Utf8View => {
                arrow_cast::cast(text, &DataType::Utf8).map_err(arrow_err("read the JSON column as text"))?
            }
            other => {
                return Err(SqlError::NotText {
                    column: self.column.clone(),
                    data_type: other.clone(),
                })
            }
        };
        let parsed = self.parse(text.as_string::<i32>())?;
        let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
        let mut columns = batch.columns().to_vec();
        let data_type = DataType::Struct(self.fields.clone());
        match &self.output {
            Output::Replace => {
                fields[at] = Arc::new(Field::new(&self.column, data_type, true));
                columns[at] = Arc::new(parsed);
            }
            Output::Column(name) => {
                let field = Arc::new(Field::new(name, data_type, true));
                match schema.index_of(name) {
                    Ok(i) => {
                        fields[i] = field;
                        columns[i] = Arc::new(parsed);
                    }
                    Err(_) => {
                        fields.push(field);
                        columns.push(Arc::new(parsed));
                    }
                }
            }
            Output::Flatten => {
                // A null struct's fields are null already (a blank text
                // decodes as `{}`, a malformed one as a null row).
                let (_, parsed_columns, _) = parsed.into_parts();
                fields.splice(at..=at, self.fields.iter().cloned());
                columns.splice(at..=at, parsed_columns);
            }
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = fields.iter().find(|f| !seen.insert(f.name().clone())) {
            return Err(SqlError::DuplicateColumn {
                operator: "from_json".into(),
                column: dup.name().clone(),
            });
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(arrow_err("build the parsed rows"))
    }

    /// One struct per text: through one decoder, checked after each text
    /// to have given exactly one whole object; else text by text, to name
    /// the malformed one (or null it).
    fn parse(&self, text: &StringArray) -> Result<StructArray, SqlError> {
        let blank = |i: usize| {
            text.is_null(i) || {
                let t = text.value(i).trim_matches(|c: char| c.is_ascii_whitespace());
                t.is_empty() || t == "null"
            }
        };
        let valid: Vec<bool> = (0..text.len()).map(|i| !blank(i)).collect();
        if let Some(rows) = self.decode_aligned(text, &valid) {
            return self.to_struct(rows, valid);
        }
        // Some text is malformed: each alone, to name it (or null it).
        let mut valid = valid;
        let mut rows = Vec::with_capacity(text.len());
        for (i, ok) in valid.iter_mut().enumerate() {
            if !*ok {
                rows.push(self.null_row());
                continue;
            }
            let value = text.value(i);
            match self.decode_one(value.as_bytes()) {
                Ok(r) => rows.push(r),
                Err(_) if self.permissive => {
                    *ok = false;
                    rows.push(self.null_row());
                }
                Err(reason) => {
                    return Err(SqlError::MalformedJson {
                        column: self.column.clone(),
                        row: i,
                        reason,
                        excerpt: value.chars().take(EXCERPT).collect(),
                    })
                }
            }
        }
        let schema = Arc::new(Schema::new(self.fields.clone()));
        let all = arrow_select::concat::concat_batches(&schema, &rows).map_err(arrow_err("join the parsed rows"))?;
        self.to_struct(all, valid)
    }

    /// Every text through one decoder, `{}` for a blank one; `None` unless
    /// each gave exactly one whole object (a value may not run into the
    /// next text, nor two share one).
    fn decode_aligned(&self, text: &StringArray, valid: &[bool]) -> Option<RecordBatch> {
        let schema = Arc::new(Schema::new(self.fields.clone()));
        let mut decoder = arrow_json::ReaderBuilder::new(schema)
            .with_batch_size(text.len().max(1) + 1)
            .build_decoder()
            .ok()?;
        for (i, ok) in valid.iter().enumerate() {
            let bytes: &[u8] = if *ok { text.value(i).as_bytes() } else { b"{}" };
            let read = decoder.decode(bytes).ok()?;
            if read != bytes.len() || decoder.len() != i + 1 || decoder.has_partial_record() {
                return None;
            }
        }
        decoder.flush().ok()?.filter(|rows| rows.num_rows() == text.len())
    }

    /// The one object `bytes` hold, or why they are not one.
    fn decode_one(&self, bytes: &[u8]) -> Result<RecordBatch, String> {
        let schema = Arc::new(Schema::new(self.fields.clone()));
        let mut decoder = arrow_json::ReaderBuilder::new(schema)
            .with_batch_size(2)
            .build_decoder()
            .map_err(|e| e.to_string())?;
        let read = decoder.decode(bytes).map_err(|e| e.to_string())?;
        if read != bytes.len() || decoder.len() != 1 || decoder.has_partial_record() {
            return Err("it is not exactly one whole JSON object".into());
        }
        match decoder.flush().map_err(|e| e.to_string())? {
            Some(rows) if rows.num_rows() == 1 => Ok(rows),
            _ => Err("it is not exactly one whole JSON object".into()),
        }
    }

    fn null_row(&self) -> RecordBatch {
        let columns = self.fields.iter().map(|f| new_null_array(f.data_type(), 1)).collect();
        RecordBatch::try_new(Arc::new(Schema::new(self.fields.clone())), columns).expect("nullable fields")
    }

    fn to_struct(&self, rows: RecordBatch, valid: Vec<bool>) -> Result<StructArray, SqlError> {
        let nulls = NullBuffer::from(valid);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        StructArray::try_new(self.fields.clone(), rows.columns().to_vec(), nulls).map_err(arrow_err("build the struct"))
    }
}

fn arrow_err(context: &'static str) -> impl Fn(arrow_schema::ArrowError) -> SqlError {
    move |source| SqlError::Arrow {
        context: context.to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::types::Int64Type;
    use arrow_array::{ArrayRef, Int64Array};

    use super::*;

    fn payment() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("merchant_id", DataType::Int64, false),
            Field::new("note", DataType::Utf8, true),
        ]))
    }

    fn batch(texts: Vec<Option<&str>>) -> RecordBatch {
        let ids = Int64Array::from_iter_values(0..texts.len() as i64);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("body", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(schema, vec![Arc::new(ids), Arc::new(StringArray::from(texts))]).unwrap()
    }

    fn merchants(column: &ArrayRef) -> Vec<Option<i64>> {
        column.as_primitive::<Int64Type>().iter().collect()
    }

    #[test]
    fn objects_become_structs_and_null_or_empty_text_a_null_struct() {
        let rows = batch(vec![
            Some(r#"{"merchant_id": 7, "note": "a", "extra": [1]}"#),
            Some(r#"{"note": "no merchant"}"#),
            None,
            Some("  "),
        ]);
        let out = FromJson::new("body", payment()).apply(&rows).unwrap();
        assert_eq!(out.schema().field(1).name(), "body");
        let body = out.column(1).as_struct();
        assert_eq!(merchants(body.column(0)), [Some(7), None, None, None]);
        assert_eq!(
            (0..4).map(|i| body.is_valid(i)).collect::<Vec<_>>(),
            [true, true, false, false]
        );
        // Parsed fields are nullable whatever the schema says.
        assert!(body.fields().iter().all(|f| f.is_nullable()));
    }

    #[test]
    fn flattened_fields_take_the_texts_place() {
        let rows = batch(vec![Some(r#"{"merchant_id": 1, "note": "x"}"#), None]);
        let out = FromJson::new("body", payment()).flatten().apply(&rows).unwrap();
        let names: Vec<String> = out.schema().fields().iter().map(|f| f.name().clone()).collect();
        assert_eq!(names, ["id", "merchant_id", "note"]);
        assert_eq!(merchants(out.column(1)), [Some(1), None]);
    }

    #[test]
    fn into_column_keeps_the_text() {
        let rows = batch(vec![Some(r#"{"merchant_id": 3}"#)]);
        let out = FromJson::new("body", payment())
            .into_column("parsed")
            .apply(&rows)
            .unwrap();
        let names: Vec<String> = out.schema().fields().iter().map(|f| f.name().clone()).collect();
        assert_eq!(names, ["id", "body", "parsed"]);
        assert_eq!(merchants(out.column(2).as_struct().column(0)), [Some(3)]);
    }

    #[test]
    fn a_malformed_value_fails_the_batch_naming_its_row_or_is_null_when_permissive() {
        for bad in [
            r#"{"merchant_id": "#,
            "[1, 2]",
            r#"{"merchant_id": "seven"}"#,
            "{} {}",
            "}",
        ] {
            let rows = batch(vec![
                Some(r#"{"merchant_id": 1}"#),
                Some(bad),
                Some(r#"{"merchant_id": 2}"#),
            ]);
            match FromJson::new("body", payment()).apply(&rows) {
                Err(SqlError::MalformedJson { row: 1, column, .. }) => assert_eq!(column, "body"),
                other => panic!("{bad}: expected row 1 malformed, got {other:?}"),
            }
            let out = FromJson::new("body", payment()).permissive().apply(&rows).unwrap();
            let body = out.column(1).as_struct();
            assert_eq!(merchants(body.column(0)), [Some(1), None, Some(2)], "{bad}");
            assert!(body.is_null(1), "{bad}");
        }
    }

    #[test]
    fn a_column_without_text_or_a_clashing_name_is_refused() {
        let rows = batch(vec![]);
        assert!(matches!(
            FromJson::new("id", payment()).apply(&rows),
            Err(SqlError::NotText { .. })
        ));
        assert!(matches!(
            FromJson::new("missing", payment()).apply(&rows),
            Err(SqlError::MissingColumn { .. })
        ));
        let clash = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        assert!(matches!(
            FromJson::new("body", clash).flatten().apply(&rows),
            Err(SqlError::DuplicateColumn { .. })
        ));
    }

    #[test]
    fn a_value_running_into_the_next_text_is_never_taken_for_two_rows() {
        // Three malformed texts whose values would balance out if decoded
        // together: the first is unfinished, the second closes it, the
        // third holds two objects.
        let rows = batch(vec![
            Some(r#"{"merchant_id": 1"#),
            Some("}"),
            Some(r#"{"merchant_id": 2}{"merchant_id": 3}"#),
        ]);
        assert!(matches!(
            FromJson::new("body", payment()).apply(&rows),
            Err(SqlError::MalformedJson { row: 0, .. })
        ));
        let out = FromJson::new("body", payment()).permissive().apply(&rows).unwrap();
        let body = out.column(1).as_struct();
        assert_eq!(body.null_count(), 3);
    }

    #[test]
    fn the_json_literal_null_is_a_null_struct() {
        let rows = batch(vec![Some("null"), Some(r#"{"merchant_id": 4}"#)]);
        let out = FromJson::new("body", payment()).apply(&rows).unwrap();
        let body = out.column(1).as_struct();
        assert!(body.is_null(0) && body.is_valid(1));
        assert_eq!(merchants(body.column(0)), [None, Some(4)]);
    }
}
