//! Identifiers of the streaming vocabulary: batches, queries and runs.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The id of one micro-batch. Batch ids of a query start at 0 (or right after
/// the marker of a query whose output was taken over) and grow by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BatchId(pub u64);

impl BatchId {
    /// The batch after this one.
    pub fn next(self) -> BatchId {
        BatchId(self.0 + 1)
    }

    /// The batch before this one, if any.
    pub fn prev(self) -> Option<BatchId> {
        self.0.checked_sub(1).map(BatchId)
    }
}

impl fmt::Display for BatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The id of a query: created once with its checkpoint and kept for its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QueryId(pub Uuid);

impl QueryId {
    /// A new random query id.
    pub fn new() -> Self {
        QueryId(Uuid::new_v4())
    }

    /// The id a sink reports for a marker whose owner it cannot name (the
    /// nil uuid). It is never the id of a real query.
    pub fn unknown() -> Self {
        QueryId(Uuid::nil())
    }
}

impl Default for QueryId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for QueryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The id of one run of a query: new each time the query starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(pub Uuid);

impl RunId {
    /// A new random run id.
    pub fn new() -> Self {
        RunId(Uuid::new_v4())
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The stable name of a query. Unlike the [`QueryId`], the name survives a
/// deleted checkpoint, which is how a sink recognises output written by an
/// earlier incarnation of the same query (invariant I4b).
///
/// Names are 1 to 200 characters of ASCII letters, digits, `.`, `_` and `-`,
/// so that every sink can store them in a file name, a property key or an
/// application id without quoting.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct QueryName(String);

impl QueryName {
    /// Validates and wraps a query name.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidQueryName> {
        let name = name.into();
        let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if name.is_empty() || name.len() > 200 || !name.chars().all(valid_char) {
            return Err(InvalidQueryName(name));
        }
        Ok(QueryName(name))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueryName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for QueryName {
    type Error = InvalidQueryName;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        QueryName::new(value)
    }
}

impl From<QueryName> for String {
    fn from(value: QueryName) -> Self {
        value.0
    }
}

/// A query name that breaks the rules of [`QueryName`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid query name {0:?}: use 1 to 200 ASCII letters, digits, '.', '_' or '-'")]
pub struct InvalidQueryName(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_names_are_validated() {
        assert!(QueryName::new("payments-bronze_v2.1").is_ok());
        for bad in ["", "a b", "../x", "x'y", "a/b", &"x".repeat(201)] {
            assert_eq!(QueryName::new(bad), Err(InvalidQueryName(bad.to_string())));
        }
    }

    #[test]
    fn batch_ids_step() {
        assert_eq!(BatchId(4).next(), BatchId(5));
        assert_eq!(BatchId(0).prev(), None);
        assert_eq!(BatchId(5).prev(), Some(BatchId(4)));
    }
}

/// A position in a source, as JSON (the form it takes in `offsets/N`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Offset(pub serde_json::Value);

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
