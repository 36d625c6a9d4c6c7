//! Update mode into an Iceberg table: each batch's rows replace the
//! table's rows of the same groups, copy-on-write, in one `overwrite`
//! snapshot with the query's marker.
//!
//! The batch's files hold the groups it changed. Their keys are read back;
//! every live data file whose column bounds leave room for one of them is
//! read, and where it holds one, written again without those rows. The
//! snapshot deletes each such file and adds its rewrite and the batch's
//! files: readers see a group's old row or its new one, never both, and a
//! replayed batch, finding its marker, changes nothing.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array, Int32Array, Int64Array,
    RecordBatch, StringArray, TimestampMicrosecondArray, TimestampNanosecondArray,
};
use arrow_row::{RowConverter, SortField};
use arrow_schema::SchemaRef as ArrowSchemaRef;
use iceberg::io::FileIO;
use iceberg::spec::{DataFile, Datum, PrimitiveLiteral, PrimitiveType};
use iceberg::writer::file_writer::location_generator::DefaultLocationGenerator;
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;
use weir_core::sink::prune::may_hold;
use weir_core::sink::DataWriter;

use crate::catalog::LoadedTable;
use crate::commit::Replaced;
use crate::data_files::{self, conform, identity_sources, Live};
use crate::error::IcebergSinkError;
use crate::table::{self, Layout};
use crate::writer::{self, IcebergWriter, WriterContext};

/// The keys of the groups a batch changed.
pub(crate) struct Keys {
    /// The key columns' names (for errors) and field ids, in key order: a
    /// later try finds them by id, since other writers may add columns.
    names: Vec<String>,
    ids: Vec<i32>,
    converter: RowConverter,
    /// The keys, encoded as rows.
    rows: HashSet<Box<[u8]>>,
    /// The keys' columns, to prune files by their bounds.
    columns: Vec<ArrayRef>,
}

/// What the batch's snapshot changes besides adding its files.
#[derive(Debug, Default)]
pub(crate) struct Rewrite {
    /// The live files holding rows of the batch's groups, by manifest.
    pub replaced: Replaced,
    /// Their other rows, written again.
    pub adds: Vec<DataFile>,
    /// Files read because their bounds did not rule them out.
    pub read: usize,
}

/// What reading and writing the table's files needs.
pub(crate) struct Table<'a> {
    pub shown: String,
    pub io: &'a FileIO,
    pub base: &'a LoadedTable,
}

impl Table<'_> {
    fn unreadable(&self, file: &str) -> impl Fn(String) -> IcebergSinkError + '_ {
        let file = file.to_string();
        move |reason| IcebergSinkError::UnreadableFile {
            table: self.shown.clone(),
            file: file.clone(),
            reason,
        }
    }

    fn rewrite_failed(&self, source: weir_core::Error) -> IcebergSinkError {
        IcebergSinkError::RewriteFailed {
            table: self.shown.clone(),
            source: Box::new(source),
        }
    }

    fn iceberg_err(&self, context: &str) -> impl Fn(iceberg::Error) -> IcebergSinkError + '_ {
        let context = context.to_string();
        move |source| IcebergSinkError::Iceberg {
            table: self.shown.clone(),
            context: context.clone(),
            source: Box::new(source),
        }
    }

    /// The table's columns as its own files hold them (not the stream's).
    fn layout(&self) -> Result<Layout, IcebergSinkError> {
        let metadata = &self.base.metadata;
        let arrow = iceberg::arrow::schema_to_arrow_schema(metadata.current_schema())
            .map_err(self.iceberg_err("convert the table's schema to Arrow"))?;
        table::layout(&self.shown, metadata, &arrow, false)
    }

    /// The rows of the data file at `path` in the table's columns.
    async fn rows(
        &self,
        target: &ArrowSchemaRef,
        sources: &[i32],
        path: &str,
    ) -> Result<Vec<RecordBatch>, IcebergSinkError> {
        let batches = data_files::read(self.io, &self.shown, path).await?;
        batches
            .iter()
            .map(|b| conform(target, sources, b).map_err(self.unreadable(path)))
            .collect()
    }
}

impl Keys {
    /// The keys of the rows in the batch's files `new`; `key` names the
    /// key columns.
    pub(crate) async fn read(table: &Table<'_>, key: &[String], new: &[DataFile]) -> Result<Keys, IcebergSinkError> {
        let layout = table.layout()?;
        let target = &layout.arrow_schema;
        let missing = || IcebergSinkError::NoUpdateKey {
            table: table.shown.clone(),
        };
        let positions: Vec<usize> = key
            .iter()
            .map(|c| target.index_of(c).map_err(|_| missing()))
            .collect::<Result<_, _>>()?;
        let ids: Vec<i32> = positions
            .iter()
            .map(|&i| field_id(target, i).ok_or_else(missing))
            .collect::<Result<_, _>>()?;
        let fields = positions
            .iter()
            .map(|&i| SortField::new(target.field(i).data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields).map_err(|e| table.unreadable("")(e.to_string()))?;
        let sources = identity_sources(&table.base.metadata);
        let mut parts: Vec<Vec<ArrayRef>> = vec![Vec::new(); positions.len()];
        for file in new {
            for rows in table.rows(target, &sources, file.file_path()).await? {
                for (part, &i) in parts.iter_mut().zip(&positions) {
                    part.push(rows.column(i).clone());
                }
            }
        }
        let columns: Vec<ArrayRef> = parts
            .iter()
            .zip(&positions)
            .map(|(part, &i)| {
                let refs: Vec<&dyn Array> = part.iter().map(|a| a.as_ref()).collect();
                if refs.is_empty() {
                    return Ok(arrow_array::new_empty_array(target.field(i).data_type()));
                }
                arrow_select::concat::concat(&refs).map_err(|e| table.unreadable("")(e.to_string()))
            })
            .collect::<Result<_, _>>()?;
        let encoded = converter
            .convert_columns(&columns)
            .map_err(|e| table.unreadable("")(e.to_string()))?;
        let rows: HashSet<Box<[u8]>> = encoded.iter().map(|r| Box::from(r.as_ref())).collect();
        if rows.len() < encoded.num_rows() {
            return Err(IcebergSinkError::DuplicateGroup {
                table: table.shown.clone(),
                columns: key.to_vec(),
                rows: encoded.num_rows(),
                groups: rows.len(),
            });
        }
        Ok(Keys {
            names: key.to_vec(),
            ids,
            rows,
            converter,
            columns,
        })
    }

    /// The key columns' positions in `layout`'s columns, by field id.
    fn positions(&self, table: &Table<'_>, layout: &Layout) -> Result<Vec<usize>, IcebergSinkError> {
        let target = &layout.arrow_schema;
        self.ids
            .iter()
            .zip(&self.names)
            .map(|(id, name)| {
                (0..target.fields().len())
                    .find(|&i| field_id(target, i) == Some(*id))
                    .ok_or_else(|| IcebergSinkError::TableChanged {
                        table: table.shown.clone(),
                        change: format!("the key column {name:?} (field id {id}) was dropped"),
                    })
            })
            .collect()
    }

    /// Whether `file`'s column bounds leave room for one of the keys (see
    /// [`may_hold`]).
    fn may_hold(&self, file: &DataFile) -> bool {
        let bounds: Vec<_> = self
            .ids
            .iter()
            .map(|id| {
                let lower = file.lower_bounds().get(id).and_then(datum_array);
                let upper = file.upper_bounds().get(id).and_then(datum_array);
                (lower, upper)
            })
            .collect();
        may_hold(&self.columns, &bounds)
    }
}

/// The live data files of `table`'s base that hold rows of the keys' groups,
/// written again without them; files named `file_prefix`-something.
pub(crate) async fn rewrite(table: &Table<'_>, keys: &Keys, file_prefix: String) -> Result<Rewrite, IcebergSinkError> {
    let live = Live::of(table.io, &table.shown, table.base).await?;
    let layout = Arc::new(table.layout()?);
    let sources = identity_sources(&table.base.metadata);
    let locations =
        DefaultLocationGenerator::new(&table.base.metadata).map_err(table.iceberg_err("derive the data location"))?;
    let ctx = WriterContext {
        table: table.shown.clone(),
        file_io: table.io.clone(),
        layout: layout.clone(),
        locations,
        file_prefix,
    };
    let positions = keys.positions(table, &layout)?;
    let mut out: Box<dyn DataWriter> = Box::new(IcebergWriter::new(ctx, 0));
    let mut rewrite = Rewrite::default();
    let mut kept_rows = 0usize;
    let result = async {
        for (file, _) in &live.files {
            if !keys.may_hold(file) {
                continue;
            }
            rewrite.read += 1;
            let path = file.file_path();
            let mut dropped = 0;
            let mut kept = Vec::new();
            for rows in table.rows(&layout.arrow_schema, &sources, path).await? {
                let columns: Vec<ArrayRef> = positions.iter().map(|&i| rows.column(i).clone()).collect();
                let encoded = keys
                    .converter
                    .convert_columns(&columns)
                    .map_err(|e| table.unreadable(path)(e.to_string()))?;
                let keep: BooleanArray = encoded.iter().map(|r| Some(!keys.rows.contains(r.as_ref()))).collect();
                dropped += keep.false_count();
                let rows = arrow_select::filter::filter_record_batch(&rows, &keep)
                    .map_err(|e| table.unreadable(path)(e.to_string()))?;
                if rows.num_rows() > 0 {
                    kept.push(rows);
                }
            }
            if dropped == 0 {
                continue;
            }
            for rows in kept {
                kept_rows += rows.num_rows();
                out.write(rows)
                    .await
                    .map_err(|e| table.unreadable(path)(e.to_string()))?;
            }
            let manifest = live.manifest_of[path].clone();
            rewrite.replaced.entry(manifest).or_default().insert(path.to_string());
        }
        Ok::<_, IcebergSinkError>(())
    }
    .await;
    if let Err(e) = result {
        let _ = out.abort().await;
        return Err(e);
    }
    let message = out.commit().await.map_err(|e| table.rewrite_failed(e))?;
    if kept_rows > 0 {
        let partition_type = layout
            .spec
            .partition_type(&layout.schema)
            .map_err(table.iceberg_err("derive the partition type"))?;
        rewrite.adds = writer::decode(&[message], &layout.spec, &partition_type, &layout.schema)
            .map_err(|e| table.rewrite_failed(e))?;
    }
    Ok(rewrite)
}

fn field_id(schema: &ArrowSchemaRef, i: usize) -> Option<i32> {
    schema.field(i).metadata().get(PARQUET_FIELD_ID_META_KEY)?.parse().ok()
}

/// A bound as a one-element array, for the types a group's key has.
fn datum_array(datum: &Datum) -> Option<ArrayRef> {
    let array: ArrayRef = match (datum.data_type(), datum.literal()) {
        (PrimitiveType::Int, PrimitiveLiteral::Int(v)) => Arc::new(Int32Array::from(vec![*v])),
        (PrimitiveType::Long, PrimitiveLiteral::Long(v)) => Arc::new(Int64Array::from(vec![*v])),
        (PrimitiveType::Float, PrimitiveLiteral::Float(v)) => Arc::new(Float32Array::from(vec![v.into_inner()])),
        (PrimitiveType::Double, PrimitiveLiteral::Double(v)) => Arc::new(Float64Array::from(vec![v.into_inner()])),
        (PrimitiveType::String, PrimitiveLiteral::String(v)) => Arc::new(StringArray::from(vec![v.as_str()])),
        (PrimitiveType::Date, PrimitiveLiteral::Int(v)) => Arc::new(Date32Array::from(vec![*v])),
        (PrimitiveType::Timestamp, PrimitiveLiteral::Long(v)) => Arc::new(TimestampMicrosecondArray::from(vec![*v])),
        (PrimitiveType::Timestamptz, PrimitiveLiteral::Long(v)) => {
            Arc::new(TimestampMicrosecondArray::from(vec![*v]).with_timezone_utc())
        }
        (PrimitiveType::TimestampNs, PrimitiveLiteral::Long(v)) => Arc::new(TimestampNanosecondArray::from(vec![*v])),
        (PrimitiveType::TimestamptzNs, PrimitiveLiteral::Long(v)) => {
            Arc::new(TimestampNanosecondArray::from(vec![*v]).with_timezone_utc())
        }
        (PrimitiveType::Decimal { precision, scale }, PrimitiveLiteral::Int128(v)) => Arc::new(
            Decimal128Array::from(vec![*v])
                .with_precision_and_scale(*precision as u8, *scale as i8)
                .ok()?,
        ),
        _ => return None,
    };
    Some(array)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow_array::TimestampMillisecondArray;
    use iceberg::spec::{DataContentType, DataFileBuilder, DataFileFormat, Struct};

    use super::*;

    /// Keys of one column with field id 1.
    fn keys(column: ArrayRef) -> Keys {
        let converter = RowConverter::new(vec![SortField::new(column.data_type().clone())]).unwrap();
        let rows = converter.convert_columns(std::slice::from_ref(&column)).unwrap();
        Keys {
            names: vec!["k".into()],
            ids: vec![1],
            rows: rows.iter().map(|r| Box::from(r.as_ref())).collect(),
            converter,
            columns: vec![column],
        }
    }

    fn file(bounds: Option<(Datum, Datum)>) -> DataFile {
        let (lower, upper) = match bounds {
            Some((l, u)) => (HashMap::from([(1, l)]), HashMap::from([(1, u)])),
            None => (HashMap::new(), HashMap::new()),
        };
        DataFileBuilder::default()
            .content(DataContentType::Data)
            .file_format(DataFileFormat::Parquet)
            .file_path("f.parquet".to_string())
            .file_size_in_bytes(1)
            .record_count(1)
            .partition_spec_id(0)
            .partition(Struct::empty())
            .lower_bounds(lower)
            .upper_bounds(upper)
            .build()
            .unwrap()
    }

    #[test]
    fn a_file_is_read_when_a_key_lies_within_its_bounds() {
        let k = keys(Arc::new(Int64Array::from(vec![5, 50])));
        assert!(k.may_hold(&file(Some((Datum::long(0), Datum::long(9))))));
        assert!(!k.may_hold(&file(Some((Datum::long(6), Datum::long(49))))));
        // Without bounds nothing is ruled out.
        assert!(k.may_hold(&file(None)));
        let ms = keys(Arc::new(TimestampMillisecondArray::from(vec![2_001])));
        let bounds = (Datum::timestamp_micros(1_000_000), Datum::timestamp_micros(2_000_000));
        assert!(!ms.may_hold(&file(Some(bounds))));
    }

    #[test]
    fn bounds_of_the_key_types_become_arrays() {
        for datum in [
            Datum::int(1),
            Datum::long(1),
            Datum::string("a"),
            Datum::date(1),
            Datum::timestamp_micros(1),
            Datum::timestamptz_micros(1),
            Datum::decimal_from_str("1.00").unwrap(),
        ] {
            assert_eq!(datum_array(&datum).map(|a| a.len()), Some(1), "{datum:?}");
        }
        assert!(datum_array(&Datum::bool(true)).is_none());
    }
}
