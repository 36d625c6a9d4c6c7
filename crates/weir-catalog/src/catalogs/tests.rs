//! Unit tests of the catalogs by name.

use super::*;
use crate::config::CatalogConfig;

fn catalogs() -> Catalogs {
    Catalogs::new(
        Config::empty()
            .with_catalog("lake", CatalogConfig::sql("sqlite://x/c.db", "x/w"))
            .with_catalog("files", CatalogConfig::path("x/f")),
    )
}

#[test]
fn names_resolve_to_their_catalog() {
    let c = catalogs();
    let n = c.resolve("bronze.payments").unwrap();
    assert_eq!(
        (n.catalog.as_str(), n.namespace.clone(), n.table.as_str()),
        ("lake", vec!["bronze".to_string()], "payments")
    );
    let n = c.resolve("files.bronze.payments").unwrap();
    assert_eq!(n.catalog, "files");
    let n = c.resolve("lake.a.b.t").unwrap();
    assert_eq!(n.namespace, ["a", "b"]);
    assert_eq!(n.to_string(), "lake.a.b.t");
}

#[test]
fn a_misspelt_catalog_is_an_error_not_a_namespace() {
    let e = catalogs().resolve("lakee.bronze.payments").unwrap_err().to_string();
    assert!(
        e.contains("\"lakee\"") && e.contains("files, lake") && e.contains("lake.lakee.bronze.payments"),
        "{e}"
    );
}

#[test]
fn without_a_default_two_part_names_are_refused() {
    let c = Catalogs::new(
        Config::from_toml(
            "[catalogs.a]\ntype = \"path\"\nwarehouse = \"w\"\n[catalogs.b]\ntype = \"path\"\nwarehouse = \"v\"",
        )
        .unwrap(),
    );
    let e = c.resolve("bronze.payments").unwrap_err().to_string();
    assert!(e.contains("default_catalog"), "{e}");
}

#[test]
fn s3_settings_become_deltalake_options() {
    let storage = HashMap::from([
        ("s3.endpoint".to_string(), "http://127.0.0.1:9000".to_string()),
        ("s3.region".to_string(), "eu-west-1".to_string()),
    ]);
    let mut options: Vec<_> = super::kind::delta_storage(&storage).into_iter().collect();
    options.sort();
    assert_eq!(
        options,
        [
            ("AWS_ALLOW_HTTP".to_string(), "true".to_string()),
            ("AWS_ENDPOINT_URL".to_string(), "http://127.0.0.1:9000".to_string()),
            ("AWS_REGION".to_string(), "eu-west-1".to_string()),
        ]
    );
}

#[test]
fn deltalakes_own_names_win_and_other_names_pass_through() {
    let storage = HashMap::from([
        ("s3.endpoint".to_string(), "http://127.0.0.1:9000".to_string()),
        ("s3.region".to_string(), "eu-west-1".to_string()),
        ("AWS_REGION".to_string(), "us-east-1".to_string()),
        ("AWS_ALLOW_HTTP".to_string(), "false".to_string()),
        ("s3.path-style-access".to_string(), "true".to_string()),
    ]);
    let mut options: Vec<_> = super::kind::delta_storage(&storage).into_iter().collect();
    options.sort();
    let pairs = |p: &[(&str, &str)]| {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        options,
        pairs(&[
            ("AWS_ALLOW_HTTP", "false"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
            ("AWS_REGION", "us-east-1"),
            ("s3.path-style-access", "true"),
        ])
    );
}
