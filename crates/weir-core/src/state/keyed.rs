//! The state of one operator: a map from key to value, both Arrow rows,
//! that remembers which keys changed since it was last written.

use std::collections::{HashMap, HashSet};

use foldhash::fast::RandomState;
use std::fmt;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BinaryArray, BooleanArray, LargeBinaryArray, RecordBatch};
use arrow_row::{RowConverter, RowParser, Rows, SortField};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};

/// The column of a delta file that marks a removed key.
pub(crate) const DELETED: &str = "__weir_deleted";

/// A delta file's metadata entry naming a range of removed keys: every key
/// that sorts before these bytes (hex), removed before the file's rows apply.
pub(crate) const REMOVED_BEFORE: &str = "weir.removed_before";

/// A key and its value, as the state holds them.
type Entry = (Box<[u8]>, Box<[u8]>);

/// How values are held as bytes.
enum ValueCodec {
    /// No value columns.
    None,
    /// Arrow rows of the value columns.
    Rows(RowConverter, RowParser),
    /// One non-null binary column, held as its bytes: an operator that
    /// keeps encoded blobs (Arrow IPC) pays no row encoding for them.
    Blob(DataType),
}

/// Values encoded for a state, one per row: see
/// [`KeyedState::encode_values`].
#[derive(Debug)]
pub enum Values {
    /// Arrow rows of the value columns.
    Rows(Rows),
    /// The bytes of a single binary value column, as they are.
    Blobs(ArrayRef),
}

impl Values {
    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::Rows(r) => r.num_rows(),
            Values::Blobs(a) => a.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of value `i`.
    pub fn value(&self, i: usize) -> &[u8] {
        match self {
            Values::Rows(r) => r.row(i).data(),
            Values::Blobs(a) => match a.data_type() {
                DataType::LargeBinary => a.as_binary::<i64>().value(i),
                _ => a.as_binary::<i32>().value(i),
            },
        }
    }

    /// The bytes of each value, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).map(|i| self.value(i))
    }
}

/// The key and value columns of an operator's state.
#[derive(Debug, Clone, PartialEq)]
pub struct StateSchema {
    /// The key columns.
    pub key: SchemaRef,
    /// The value columns (may be empty).
    pub value: SchemaRef,
}

impl StateSchema {
    /// A state of `key` and `value` columns.
    pub fn new(key: SchemaRef, value: SchemaRef) -> Self {
        StateSchema { key, value }
    }

    /// The columns of a snapshot: keys, then values.
    pub(crate) fn snapshot(&self) -> SchemaRef {
        let fields: Vec<_> = self.key.fields().iter().chain(self.value.fields()).cloned().collect();
        Arc::new(Schema::new(fields))
    }

    /// The columns of a delta: keys, nullable values, and the deleted mark.
    pub(crate) fn delta(&self) -> SchemaRef {
        let mut fields: Vec<Field> = self.key.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.extend(
            self.value
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true)),
        );
        fields.push(Field::new(DELETED, DataType::Boolean, false));
        Arc::new(Schema::new(fields))
    }
}

/// One operator's state: values by key, held as Arrow rows (a value of one
/// binary column as its bytes).
///
/// Operators read and change it during a batch; the engine writes what
/// changed to the checkpoint before the sink commits, and restores it when
/// a query restarts. Keys and values are the bytes of
/// [`KeyedState::encode_keys`] and [`KeyedState::encode_values`].
pub struct KeyedState {
    schema: StateSchema,
    keys: RowConverter,
    key_parser: RowParser,
    values: ValueCodec,
    // Keys are row-encoded bytes: a fast hash (seeded per process) rather
    // than SipHash, which was a tenth of an aggregation's time.
    map: HashMap<Box<[u8]>, Box<[u8]>, RandomState>,
    changed: HashSet<Box<[u8]>, RandomState>,
    /// Every key before these bytes was removed since the last write.
    removed_before: Option<Box<[u8]>>,
    bytes: usize,
}

impl fmt::Debug for KeyedState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedState")
            .field("schema", &self.schema)
            .field("keys", &self.map.len())
            .field("changed", &self.changed.len())
            .finish()
    }
}

fn converter(schema: &Schema) -> Result<RowConverter, ArrowError> {
    RowConverter::new(
        schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect(),
    )
}

impl KeyedState {
    /// An empty state of `schema`.
    pub fn new(schema: StateSchema) -> Result<Self, ArrowError> {
        if schema.key.fields().is_empty() {
            return Err(ArrowError::InvalidArgumentError(
                "a keyed state needs at least one key column".into(),
            ));
        }
        for field in schema.key.fields().iter().chain(schema.value.fields()) {
            if field.name() == DELETED {
                return Err(ArrowError::InvalidArgumentError(format!(
                    "{DELETED} is a reserved column name"
                )));
            }
            // Rows give dictionaries back as their values' type, so a state
            // file would not match its schema.
            if matches!(field.data_type(), DataType::Dictionary(_, _)) {
                return Err(ArrowError::InvalidArgumentError(format!(
                    "state column {:?} is dictionary-encoded; cast it to its value type first",
                    field.name()
                )));
            }
        }
        let keys = converter(&schema.key)?;
        let key_parser = keys.parser();
        let fields = schema.value.fields();
        let values = match fields.first().map(|f| (f.data_type(), f.is_nullable())) {
            None => ValueCodec::None,
            Some((t @ (DataType::Binary | DataType::LargeBinary), false)) if fields.len() == 1 => {
                ValueCodec::Blob(t.clone())
            }
            Some(_) => {
                let c = converter(&schema.value)?;
                let p = c.parser();
                ValueCodec::Rows(c, p)
            }
        };
        Ok(KeyedState {
            schema,
            keys,
            key_parser,
            values,
            map: HashMap::default(),
            changed: HashSet::default(),
            removed_before: None,
            bytes: 0,
        })
    }

    /// The state's schema.
    pub fn schema(&self) -> &StateSchema {
        &self.schema
    }

    /// The keys of `columns` (the key columns, in order), one row each.
    pub fn encode_keys(&self, columns: &[ArrayRef]) -> Result<Rows, ArrowError> {
        self.keys.convert_columns(columns)
    }

    /// The values of `columns` (the value columns, in order), one row each;
    /// `None` when the state has no value columns. A state whose value is
    /// one non-null binary column holds each value as its bytes, so its
    /// operator may also pass those bytes to [`KeyedState::put`] directly.
    pub fn encode_values(&self, columns: &[ArrayRef]) -> Result<Option<Values>, ArrowError> {
        self.values_of(columns, false)
    }

    /// [`KeyedState::encode_values`]; a delta's deleted keys have null
    /// values, which `nulls` lets through.
    fn values_of(&self, columns: &[ArrayRef], nulls: bool) -> Result<Option<Values>, ArrowError> {
        match &self.values {
            ValueCodec::None => Ok(None),
            ValueCodec::Rows(c, _) => c.convert_columns(columns).map(|r| Some(Values::Rows(r))),
            ValueCodec::Blob(t) => match columns {
                [c] if c.data_type() == t && (nulls || c.null_count() == 0) => Ok(Some(Values::Blobs(c.clone()))),
                _ => Err(ArrowError::InvalidArgumentError(format!(
                    "the state's value is one non-null {t} column; got {}",
                    columns
                        .iter()
                        .map(|c| c.data_type().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))),
            },
        }
    }

    /// Key columns for the given encoded keys.
    pub fn decode_keys<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<ArrayRef>, ArrowError> {
        self.keys
            .convert_rows(keys.into_iter().map(|k| self.key_parser.parse(k)))
    }

    /// Value columns for the given encoded values (none when the state has
    /// no value columns).
    pub fn decode_values<'a>(&self, values: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<ArrayRef>, ArrowError> {
        match &self.values {
            ValueCodec::Rows(c, p) => c.convert_rows(values.into_iter().map(|v| p.parse(v))),
            ValueCodec::Blob(DataType::LargeBinary) => {
                Ok(vec![Arc::new(LargeBinaryArray::from_iter_values(values)) as ArrayRef])
            }
            ValueCodec::Blob(_) => Ok(vec![Arc::new(BinaryArray::from_iter_values(values)) as ArrayRef]),
            ValueCodec::None => Ok(Vec::new()),
        }
    }

    /// The encoding of the leading key columns `columns` (one row each):
    /// a key sorts before such a prefix exactly when its leading columns
    /// sort before the prefix's values, so [`KeyedState::take_before`]
    /// can find every key whose first column is below a bound.
    pub fn key_prefix(&self, columns: &[ArrayRef]) -> Result<Rows, ArrowError> {
        prefix(&self.schema.key, columns, "key")
    }

    /// The encoding of the leading value columns `columns` (one row each):
    /// a value's bytes start with its leading columns' encoding, and when
    /// those are fixed-width (integers, timestamps) the first bytes compare
    /// as the values do, so an operator can find the entries whose first
    /// value column is at most a bound without decoding them. A value of
    /// one binary column is held as its bytes and has no such prefix.
    pub fn value_prefix(&self, columns: &[ArrayRef]) -> Result<Rows, ArrowError> {
        if matches!(self.values, ValueCodec::Blob(_)) {
            return Err(ArrowError::InvalidArgumentError(
                "a value of one binary column is held as its bytes, without a row prefix".into(),
            ));
        }
        if columns.is_empty() {
            return Err(ArrowError::InvalidArgumentError("a value prefix of no columns".into()));
        }
        prefix(&self.schema.value, columns, "value")
    }

    /// Removes every key that sorts before `bound` (a
    /// [`KeyedState::key_prefix`] row or a whole key) and returns them with
    /// their values, sorted by key, as a batch of the key columns then the
    /// value columns. It compares bytes, without decoding a key, and the
    /// next delta records the removal as one range rather than a key each.
    pub fn take_before(&mut self, bound: &[u8]) -> Result<RecordBatch, ArrowError> {
        let mut taken: Vec<Entry> = self.map.extract_if(|k, _| **k < *bound).collect();
        for (k, v) in &taken {
            self.bytes -= k.len() + v.len();
        }
        if !taken.is_empty() && self.removed_before.as_deref().is_none_or(|b| b < bound) {
            self.removed_before = Some(bound.into());
        }
        sort_by_bytes(&mut taken, |(k, _)| k);
        self.batch_of_entries(taken.iter().map(|(k, v)| (&**k, &**v)))
    }

    /// Removes every entry for which `take` returns true and returns them,
    /// sorted by key, as a batch of the key columns then the value
    /// columns; each removal goes into the next delta.
    pub fn take_if(&mut self, mut take: impl FnMut(&[u8], &[u8]) -> bool) -> Result<RecordBatch, ArrowError> {
        let mut taken: Vec<Entry> = self.map.extract_if(|k, v| take(k, v)).collect();
        for (k, v) in &taken {
            self.bytes -= k.len() + v.len();
            self.mark(k);
        }
        sort_by_bytes(&mut taken, |(k, _)| k);
        self.batch_of_entries(taken.iter().map(|(k, v)| (&**k, &**v)))
    }

    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.map.get(key).map(|v| &**v)
    }

    /// Whether `key` has a value.
    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.map.contains_key(key)
    }

    /// Sets the value of `key` (empty when the state has no value columns).
    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        self.put_owned(key, value.into());
    }

    /// Sets the value of `key` to `value` as it is, without copying it: for
    /// a value the operator made whole, as the bytes of a state whose value
    /// is one binary column.
    pub fn put_owned(&mut self, key: &[u8], value: Box<[u8]>) {
        self.bytes += value.len();
        match self.map.get_mut(key) {
            Some(old) => {
                self.bytes -= old.len();
                *old = value;
            }
            None => {
                self.bytes += key.len();
                self.map.insert(key.into(), value);
            }
        }
        self.mark(key);
    }

    /// Removes `key`; returns whether it had a value.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        match self.map.remove(key) {
            Some(old) => {
                self.bytes -= key.len() + old.len();
                self.mark(key);
                true
            }
            None => false,
        }
    }

    /// Removes every key for which `keep` returns false; returns how many.
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8], &[u8]) -> bool) -> usize {
        let gone: Vec<Box<[u8]>> = self
            .map
            .iter()
            .filter(|(k, v)| !keep(k, v))
            .map(|(k, _)| k.clone())
            .collect();
        for key in &gone {
            self.remove(key);
        }
        gone.len()
    }

    /// Every key and value, in an order that differs between runs: sort
    /// what is emitted from it, so a replay emits the same.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.map.iter().map(|(k, v)| (&**k, &**v))
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the state holds no key.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The bytes of its keys and values.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The number of keys changed since the state was last written.
    pub fn changed(&self) -> usize {
        self.changed.len()
    }

    fn mark(&mut self, key: &[u8]) {
        if !self.changed.contains(key) {
            self.changed.insert(key.into());
        }
    }

    /// The changes since the state was last written, sorted by key, as a
    /// batch of [`StateSchema::delta`]; `None` if nothing changed. Clears
    /// the record of changes.
    pub(crate) fn take_changes(&mut self) -> Result<Option<RecordBatch>, ArrowError> {
        let removed_before = self.removed_before.take();
        if self.changed.is_empty() && removed_before.is_none() {
            return Ok(None);
        }
        let mut keys: Vec<Box<[u8]>> = self.changed.drain().collect();
        // A removed key the range covers needs no row of its own.
        if let Some(bound) = &removed_before {
            keys.retain(|k| **k >= **bound || self.map.contains_key(k));
        }
        sort_by_bytes(&mut keys, |k| k);
        let deleted = BooleanArray::from(keys.iter().map(|k| !self.map.contains_key(k)).collect::<Vec<_>>());
        let mut columns = self.decode_keys(keys.iter().map(|k| &**k))?;
        if !matches!(self.values, ValueCodec::None) {
            let present: Vec<&[u8]> = keys.iter().filter_map(|k| self.map.get(k).map(|v| &**v)).collect();
            let values = self.decode_values(present.iter().copied())?;
            if present.len() == keys.len() {
                columns.extend(values);
            } else {
                // Deleted keys get null values: interleave the present values
                // with one null row.
                let mut next = 0usize;
                let indices: Vec<(usize, usize)> = deleted
                    .iter()
                    .map(|d| {
                        if d == Some(true) {
                            (1, 0)
                        } else {
                            next += 1;
                            (0, next - 1)
                        }
                    })
                    .collect();
                for (array, field) in values.iter().zip(self.schema.value.fields()) {
                    let null = arrow_array::new_null_array(field.data_type(), 1);
                    columns.push(arrow_select::interleave::interleave(
                        &[array.as_ref(), null.as_ref()],
                        &indices,
                    )?);
                }
            }
        }
        columns.push(Arc::new(deleted));
        let mut schema = self.schema.delta();
        if let Some(bound) = removed_before {
            let metadata = [(REMOVED_BEFORE.to_string(), hex(&bound))].into();
            schema = Arc::new(schema.as_ref().clone().with_metadata(metadata));
        }
        RecordBatch::try_new(schema, columns).map(Some)
    }

    /// The given keys (each held by the state) with their values, in that
    /// order: a batch of the key columns, then the value columns.
    pub fn batch_of(&self, keys: &[&[u8]]) -> Result<RecordBatch, ArrowError> {
        let schema = self.schema.snapshot();
        if keys.is_empty() {
            return Ok(RecordBatch::new_empty(schema));
        }
        let values = keys
            .iter()
            .map(|k| {
                self.get(k)
                    .ok_or_else(|| ArrowError::InvalidArgumentError("a key the state does not hold".into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.batch_of_entries(keys.iter().copied().zip(values))
    }

    /// Keys with their values as a batch of [`StateSchema::snapshot`].
    fn batch_of_entries<'a>(
        &self,
        entries: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])> + Clone,
    ) -> Result<RecordBatch, ArrowError> {
        let schema = self.schema.snapshot();
        if entries.len() == 0 {
            return Ok(RecordBatch::new_empty(schema));
        }
        let mut columns = self.decode_keys(entries.clone().map(|(k, _)| k))?;
        columns.extend(self.decode_values(entries.map(|(_, v)| v))?);
        RecordBatch::try_new(schema, columns)
    }

    /// Every key and value, sorted by key, as a batch of
    /// [`StateSchema::snapshot`]. Clears the record of changes.
    pub(crate) fn snapshot(&mut self) -> Result<RecordBatch, ArrowError> {
        self.changed.clear();
        self.removed_before = None;
        self.sorted()
    }

    /// Every key and value, sorted by key, as a batch of the key columns
    /// then the value columns.
    pub fn sorted(&self) -> Result<RecordBatch, ArrowError> {
        let mut entries: Vec<(&[u8], &[u8])> = self.map.iter().map(|(k, v)| (&**k, &**v)).collect();
        sort_by_bytes(&mut entries, |(k, _)| k);
        self.batch_of_entries(entries.into_iter())
    }

    /// Applies a snapshot or delta batch read back from the checkpoint,
    /// without marking anything changed.
    pub(crate) fn apply(&mut self, batch: &RecordBatch) -> Result<(), ArrowError> {
        let nkeys = self.schema.key.fields().len();
        let nvalues = self.schema.value.fields().len();
        let keys = self.encode_keys(&batch.columns()[..nkeys])?;
        let deleted = match batch.schema().column_with_name(DELETED) {
            Some((i, _)) => Some(
                batch
                    .column(i)
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .ok_or_else(|| ArrowError::SchemaError(format!("{DELETED} is not boolean")))?
                    .clone(),
            ),
            None => None,
        };
        let values = self.values_of(&batch.columns()[nkeys..nkeys + nvalues], true)?;
        for (name, value) in batch.schema().metadata() {
            match name.as_str() {
                REMOVED_BEFORE => {
                    let bound = unhex(value)
                        .ok_or_else(|| ArrowError::ParseError(format!("{REMOVED_BEFORE} is not hex: {value:?}")))?;
                    let bytes = &mut self.bytes;
                    self.map.retain(|k, v| {
                        let keep = **k >= *bound;
                        if !keep {
                            *bytes -= k.len() + v.len();
                        }
                        keep
                    });
                }
                other if other.starts_with("weir.") => {
                    return Err(ArrowError::ParseError(format!(
                        "a state file with {other:?}, which this version of weir does not know; \
                         it was written by a newer weir"
                    )))
                }
                _ => {}
            }
        }
        for i in 0..batch.num_rows() {
            let key = keys.row(i);
            if deleted.as_ref().is_some_and(|d| d.value(i)) {
                if let Some(old) = self.map.remove(key.as_ref()) {
                    self.bytes -= key.as_ref().len() + old.len();
                }
            } else {
                let value: &[u8] = match &values {
                    Some(v) => v.value(i),
                    None => &[],
                };
                self.put(key.as_ref(), value);
            }
        }
        self.changed.clear();
        Ok(())
    }
}

/// The encoding of `columns` as the leading columns of `schema`'s rows.
fn prefix(schema: &Schema, columns: &[ArrayRef], what: &str) -> Result<Rows, ArrowError> {
    let fields = schema.fields();
    if columns.len() > fields.len() {
        return Err(ArrowError::InvalidArgumentError(format!(
            "a {what} prefix of {} columns for a {what} of {}",
            columns.len(),
            fields.len()
        )));
    }
    converter(&Schema::new(fields[..columns.len()].to_vec()))?.convert_columns(columns)
}

/// Sorts `items` by their key bytes. A 24-byte prefix of each key is
/// compared inline first, so most comparisons chase no pointer and call
/// no `memcmp` (which was a fifth of a high-cardinality aggregation's time).
pub(crate) fn sort_by_bytes<T>(items: &mut Vec<T>, key: impl Fn(&T) -> &[u8]) {
    fn prefix(bytes: &[u8]) -> (u128, u64) {
        let mut head = [0u8; 24];
        let n = bytes.len().min(24);
        head[..n].copy_from_slice(&bytes[..n]);
        let (a, b) = head.split_at(16);
        (
            u128::from_be_bytes(a.try_into().expect("16 bytes")),
            u64::from_be_bytes(b.try_into().expect("8 bytes")),
        )
    }
    let mut order: Vec<((u128, u64), usize)> = items.iter().enumerate().map(|(i, t)| (prefix(key(t)), i)).collect();
    // Equal prefixes (zero-padded) are ordered by the whole keys.
    order.sort_unstable_by(|x, y| x.0.cmp(&y.0).then_with(|| key(&items[x.1]).cmp(key(&items[y.1]))));
    let mut slots: Vec<Option<T>> = items.drain(..).map(Some).collect();
    items.extend(
        order
            .into_iter()
            .map(|(_, i)| slots[i].take().expect("each index once")),
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
