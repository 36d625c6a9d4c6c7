//! Table names: `catalog.namespace.table` or `namespace.table`.

use crate::error::CatalogError;

/// A table's name, resolved to its catalog.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    /// The catalog holding the table.
    pub catalog: String,
    /// The namespace, one or more levels.
    pub namespace: Vec<String>,
    /// The table.
    pub table: String,
}

impl TableName {
    /// `namespace.table` within the catalog (dots between levels).
    pub fn in_catalog(&self) -> String {
        format!("{}.{}", self.namespace.join("."), self.table)
    }

    /// The namespace levels and the table, in order.
    pub fn parts(&self) -> Vec<String> {
        self.namespace.iter().cloned().chain([self.table.clone()]).collect()
    }

    /// The table's folder below a warehouse: `namespace/.../table`.
    pub fn relative_path(&self) -> String {
        format!("{}/{}", self.namespace.join("/"), self.table)
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.catalog, self.in_catalog())
    }
}

/// Checks one part of a name. Parts become folder names and SQL values, so
/// only ASCII letters, digits, `_` and `-` are allowed, starting with a
/// letter or digit, at most 128 bytes.
pub fn check_part(name: &str, part: &str) -> Result<(), CatalogError> {
    let err = |reason: String| CatalogError::Name {
        name: name.to_string(),
        reason,
    };
    if part.is_empty() {
        return Err(err(
            "a part of the name is empty (two dots in a row, or a dot at an end)".into(),
        ));
    }
    if part.len() > 128 {
        return Err(err(format!("{part:?} is longer than 128 bytes")));
    }
    if let Some(bad) = part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(err(format!(
            "{part:?} contains {bad:?}; a part may hold only ASCII letters, digits, '_' and '-'"
        )));
    }
    if part.starts_with(['-', '_']) {
        // `_` folders are the formats' own (`_delta_log`), `-` reads as a flag.
        return Err(err(format!("{part:?} starts with {:?}", &part[..1])));
    }
    Ok(())
}

/// Splits `name` into its parts and checks each one.
pub(crate) fn parts(name: &str) -> Result<Vec<String>, CatalogError> {
    let parts: Vec<String> = name.split('.').map(str::to_string).collect();
    for part in &parts {
        check_part(name, part)?;
    }
    if parts.len() < 2 {
        return Err(CatalogError::Name {
            name: name.to_string(),
            reason: "a table name needs a namespace: namespace.table or catalog.namespace.table".into(),
        });
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass() {
        assert_eq!(parts("bronze.payments").unwrap(), ["bronze", "payments"]);
        assert_eq!(
            parts("lake.bronze.pay_ments-2").unwrap(),
            ["lake", "bronze", "pay_ments-2"]
        );
    }

    #[test]
    fn bad_names_are_refused_naming_the_problem() {
        for (name, says) in [
            ("payments", "needs a namespace"),
            ("bronze..payments", "empty"),
            ("bronze.payments.", "empty"),
            ("../etc.passwd", "empty"),
            ("bronze/x.payments", "'/'"),
            ("bronze.pay'ments", "'\\''"),
            ("bronze.pay;DROP TABLE x", "';'"),
            ("bronze.pay ments", "' '"),
            ("bronze.-payments", "starts with \"-\""),
            ("bronze.payments._delta_log", "starts with \"_\""),
            ("bronze.zahlüngen", "'ü'"),
        ] {
            let e = parts(name).unwrap_err().to_string();
            assert!(e.contains(says), "{name}: {e}");
            assert!(e.contains(&format!("{name:?}")), "{name}: {e}");
        }
        let long = format!("b.{}", "x".repeat(129));
        assert!(parts(&long).unwrap_err().to_string().contains("128"));
    }
}
