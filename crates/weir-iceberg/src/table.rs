//! Creating a table from the stream's schema, and fitting the stream's rows
//! to a table's schema.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{new_null_array, RecordBatch};
use arrow_schema::{Schema as ArrowSchema, SchemaRef as ArrowSchemaRef};
use iceberg::arrow::{arrow_schema_to_schema_auto_assign_ids, arrow_type_to_type, schema_to_arrow_schema};
use iceberg::spec::{
    NestedField, NestedFieldRef, PartitionSpecRef, SchemaRef, TableMetadata, TableMetadataBuilder, Transform,
    UnboundPartitionSpec,
};
use iceberg::TableCreation;

use crate::error::IcebergSinkError;

/// `write.target-file-size-bytes` when the table does not set it.
pub const DEFAULT_TARGET_FILE_SIZE: u64 = 128 * 1024 * 1024;

/// How the stream's rows map onto the table's data files, fixed when the
/// query starts.
#[derive(Debug)]
pub(crate) struct Layout {
    /// The table's uuid.
    pub table_uuid: String,
    pub schema: SchemaRef,
    /// The table's schema in Arrow, with Parquet field ids.
    pub arrow_schema: ArrowSchemaRef,
    /// For each table column, its index in the stream's batches, or `None`
    /// for an optional column the stream does not have (written null).
    pub sources: Vec<Option<usize>>,
    pub spec: PartitionSpecRef,
    pub target_file_size: u64,
    /// With schema merging, the table's schema plus the stream's new
    /// optional columns (new field ids), made current by the first commit.
    pub evolution: Option<Evolution>,
}

/// A schema change the sink makes in the swap of its first batch.
#[derive(Debug)]
pub(crate) struct Evolution {
    /// The table's `last-column-id` the new field ids follow.
    pub base_last_column_id: i32,
    /// The new columns, with their field ids.
    pub fields: Vec<NestedFieldRef>,
}

/// Parses one partition field: `col`, `bucket(N, col)`, `truncate(W, col)`,
/// `year(col)`, `month(col)`, `day(col)` or `hour(col)`. Returns the source
/// column, the transform and the partition field's name (as Spark names
/// them: `col`, `col_bucket`, `col_trunc`, `col_day`, ...).
pub(crate) fn parse_partition_field(text: &str) -> Result<(String, Transform, String), String> {
    let text = text.trim();
    let Some((func, rest)) = text.split_once('(') else {
        return Ok((text.to_string(), Transform::Identity, text.to_string()));
    };
    let args: Vec<&str> = rest
        .strip_suffix(')')
        .ok_or_else(|| format!("{text:?} lacks a closing parenthesis"))?
        .split(',')
        .map(str::trim)
        .collect();
    let number = |s: &str| {
        s.parse::<u32>()
            .map_err(|_| format!("{s:?} in {text:?} is not a number"))
    };
    let (column, transform, suffix) = match (func.trim(), args.as_slice()) {
        ("bucket", [n, col]) => (*col, Transform::Bucket(number(n)?), "bucket"),
        ("truncate", [w, col]) => (*col, Transform::Truncate(number(w)?), "trunc"),
        ("year" | "years", [col]) => (*col, Transform::Year, "year"),
        ("month" | "months", [col]) => (*col, Transform::Month, "month"),
        ("day" | "days", [col]) => (*col, Transform::Day, "day"),
        ("hour" | "hours", [col]) => (*col, Transform::Hour, "hour"),
        _ => {
            return Err(format!(
                "{text:?} is not a partition field (col, bucket(N, col), truncate(W, col), year/month/day/hour(col))"
            ))
        }
    };
    Ok((column.to_string(), transform, format!("{column}_{suffix}")))
}

/// The metadata of a new table at `location` for rows of `schema`.
pub(crate) fn new_metadata(
    table: &str,
    location: &str,
    schema: &ArrowSchema,
    partition_by: &[String],
    properties: &HashMap<String, String>,
) -> Result<TableMetadata, IcebergSinkError> {
    let mismatch = |differences: String| IcebergSinkError::SchemaMismatch {
        table: table.to_string(),
        differences,
    };
    let schema = arrow_schema_to_schema_auto_assign_ids(schema)
        .map_err(|e| mismatch(format!("the stream's schema has no Iceberg equivalent: {e}")))?;
    let mut spec = UnboundPartitionSpec::builder();
    for text in partition_by {
        let (column, transform, name) = parse_partition_field(text).map_err(|reason| IcebergSinkError::Config {
            catalog: String::new(),
            reason: format!("table {table}: {reason}"),
        })?;
        let field = schema
            .field_by_name(&column)
            .ok_or_else(|| mismatch(format!("partition column {column:?} is not in the stream")))?;
        spec = spec
            .add_partition_field(field.id, name, transform)
            .map_err(|e| mismatch(format!("partition field {text:?}: {e}")))?;
    }
    let creation = TableCreation::builder()
        .name(table.to_string())
        .location(location.to_string())
        .schema(schema)
        .partition_spec(spec.build())
        .properties(properties.clone())
        .build();
    let built = TableMetadataBuilder::from_table_creation(creation)
        .and_then(|b| b.build())
        .map_err(|source| IcebergSinkError::Iceberg {
            table: table.to_string(),
            context: "build the new table's metadata".into(),
            source: Box::new(source),
        })?;
    Ok(built.metadata)
}

/// Fits the stream's `schema` to the table: every stream column must be a
/// table column of the same type; every required table column must be in
/// the stream.
pub(crate) fn layout(
    table: &str,
    metadata: &TableMetadata,
    schema: &ArrowSchema,
    merge_schema: bool,
) -> Result<Layout, IcebergSinkError> {
    if metadata.format_version() == iceberg::spec::FormatVersion::V3 {
        return Err(IcebergSinkError::Unsupported {
            table: table.to_string(),
            feature: "format version 3".into(),
        });
    }
    let mut table_schema = metadata.current_schema().clone();
    let mut differences = Vec::new();
    let mut added = Vec::new();
    let mut next_id = metadata.last_column_id();
    for field in schema.fields() {
        if table_schema.as_struct().field_by_name(field.name()).is_some() {
            continue;
        }
        match arrow_type_to_type(field.data_type()) {
            Ok(t) if merge_schema && field.is_nullable() => {
                next_id += 1;
                added.push(Arc::new(NestedField::optional(next_id, field.name(), t)));
            }
            _ if merge_schema && !field.is_nullable() => differences.push(format!(
                "new column {:?} is not nullable, so it cannot be added",
                field.name()
            )),
            Ok(_) => differences.push(format!("column {:?} is not in the table", field.name())),
            Err(_) => differences.push(format!(
                "column {:?} has type {}, which weir does not write to Iceberg",
                field.name(),
                field.data_type()
            )),
        }
    }
    let evolution = if added.is_empty() {
        None
    } else {
        let fields = added.clone();
        let highest_schema_id = metadata.schemas_iter().map(|s| s.schema_id()).max().unwrap_or(0);
        let evolved = table_schema
            .as_ref()
            .clone()
            .into_builder()
            .with_schema_id(highest_schema_id + 1)
            .with_fields(added)
            .build()
            .map_err(|e| IcebergSinkError::SchemaMismatch {
                table: table.to_string(),
                differences: format!("the new columns do not fit the table's schema: {e}"),
            })?;
        table_schema = Arc::new(evolved);
        Some(Evolution {
            base_last_column_id: metadata.last_column_id(),
            fields,
        })
    };
    let arrow_schema = schema_to_arrow_schema(&table_schema).map_err(|source| IcebergSinkError::Iceberg {
        table: table.to_string(),
        context: "convert the table's schema to Arrow".into(),
        source: Box::new(source),
    })?;
    for field in schema.fields() {
        let Some(column) = table_schema.as_struct().field_by_name(field.name()) else {
            continue;
        };
        match arrow_type_to_type(field.data_type()) {
            Ok(t) if &t == column.field_type.as_ref() => {}
            Ok(t) => differences.push(format!(
                "column {:?} is {t} in the stream and {} in the table",
                field.name(),
                column.field_type
            )),
            Err(_) => differences.push(format!(
                "column {:?} has type {}, which weir does not write to Iceberg",
                field.name(),
                field.data_type()
            )),
        }
        if field.is_nullable() && column.required {
            differences.push(format!(
                "column {:?} may be null in the stream but is required in the table",
                field.name()
            ));
        }
    }
    let mut sources = Vec::new();
    for column in table_schema.as_struct().fields() {
        let index = schema.index_of(&column.name).ok();
        if index.is_none() && column.required {
            differences.push(format!(
                "the stream lacks column {:?}, which the table requires",
                column.name
            ));
        }
        sources.push(index);
    }
    if !differences.is_empty() {
        return Err(IcebergSinkError::SchemaMismatch {
            table: table.to_string(),
            differences: differences.join("; "),
        });
    }
    let target_file_size = metadata
        .properties()
        .get("write.target-file-size-bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_TARGET_FILE_SIZE);
    Ok(Layout {
        table_uuid: metadata.uuid().to_string(),
        schema: table_schema,
        arrow_schema: Arc::new(arrow_schema),
        sources,
        spec: metadata.default_partition_spec().clone(),
        target_file_size,
        evolution,
    })
}

impl Layout {
    /// The stream's batch as the table's columns, in table order (casting
    /// where only the Arrow representation differs, e.g. a time zone's name).
    pub(crate) fn project(&self, batch: &RecordBatch) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let columns = self
            .arrow_schema
            .fields()
            .iter()
            .zip(&self.sources)
            .map(|(field, source)| match source {
                Some(i) => {
                    let column = batch.column(*i);
                    if column.data_type() == field.data_type() {
                        Ok(column.clone())
                    } else {
                        arrow_cast::cast(column, field.data_type())
                    }
                }
                None => Ok(new_null_array(field.data_type(), batch.num_rows())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        RecordBatch::try_new(self.arrow_schema.clone(), columns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_fields_parse_as_spark_names_them() {
        let parse = |s| parse_partition_field(s).unwrap();
        assert_eq!(
            parse("account_id"),
            ("account_id".into(), Transform::Identity, "account_id".into())
        );
        assert_eq!(
            parse("bucket(16, account_id)"),
            ("account_id".into(), Transform::Bucket(16), "account_id_bucket".into())
        );
        assert_eq!(
            parse("truncate(4,name)"),
            ("name".into(), Transform::Truncate(4), "name_trunc".into())
        );
        assert_eq!(parse("day(ts)"), ("ts".into(), Transform::Day, "ts_day".into()));
        assert_eq!(parse("hours(ts)"), ("ts".into(), Transform::Hour, "ts_hour".into()));
        assert!(parse_partition_field("bucket(x, id)").is_err());
        assert!(parse_partition_field("weekday(ts)").is_err());
        assert!(parse_partition_field("day(ts").is_err());
    }
}
