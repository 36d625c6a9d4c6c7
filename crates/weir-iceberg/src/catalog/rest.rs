//! The Iceberg REST catalog: a swap is one commit request whose
//! requirements (`assert-table-uuid`, `assert-ref-snapshot-id` on `main`)
//! make the server refuse it if the table moved since the base.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use iceberg::io::FileIO;
use iceberg::spec::{TableMetadata, MAIN_BRANCH};
use iceberg::{TableIdent, TableRequirement, TableUpdate};
use serde_json::{json, Value};

use super::{check_ident, Catalog, LoadedTable, Swap};
use crate::error::IcebergSinkError;

/// An Iceberg REST catalog with OAuth2 client credentials.
pub struct RestCatalog {
    name: String,
    uri: String,
    /// `/v1/<prefix>/` from the server's config, or `/v1/`.
    base: String,
    warehouse: String,
    credential: Option<(String, String)>,
    token: tokio::sync::Mutex<Option<(String, Instant)>>,
    http: reqwest::Client,
    file_io: FileIO,
}

impl std::fmt::Debug for RestCatalog {
    // The client secret and the token are never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestCatalog")
            .field("name", &self.name)
            .field("uri", &self.uri)
            .field("warehouse", &self.warehouse)
            .finish_non_exhaustive()
    }
}

impl RestCatalog {
    /// Connects to the REST catalog at `uri` for `warehouse`, with OAuth2
    /// client credentials (`client_id`, `client_secret`) if given. Data and
    /// metadata files are read and written with `storage` settings
    /// (`s3.endpoint`, ...; the server's config fills in what is missing).
    pub async fn connect(
        name: &str,
        uri: &str,
        warehouse: &str,
        credential: Option<(String, String)>,
        mut storage: HashMap<String, String>,
    ) -> Result<Self, IcebergSinkError> {
        let mut catalog = RestCatalog {
            name: name.to_string(),
            uri: uri.trim_end_matches('/').to_string(),
            base: "/v1/".into(),
            warehouse: warehouse.to_string(),
            credential,
            token: tokio::sync::Mutex::new(None),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .map_err(|e| catalog_err(name, "build the HTTP client", e.to_string()))?,
            file_io: FileIO::new_with_fs(),
        };
        let config = catalog
            .call(reqwest::Method::GET, &format!("/v1/config?warehouse={warehouse}"), None)
            .await?
            .1;
        if let Some(prefix) = config["overrides"]["prefix"].as_str() {
            catalog.base = format!("/v1/{prefix}/");
        }
        for section in ["defaults", "overrides"] {
            if let Some(map) = config[section].as_object() {
                for (k, v) in map {
                    if let (true, Some(v)) = (k.starts_with("s3."), v.as_str()) {
                        storage.entry(k.clone()).or_insert_with(|| v.to_string());
                    }
                }
            }
        }
        catalog.file_io = crate::storage::file_io(warehouse, storage);
        Ok(catalog)
    }

    async fn token(&self) -> Result<Option<String>, IcebergSinkError> {
        let Some((id, secret)) = &self.credential else {
            return Ok(None);
        };
        let mut slot = self.token.lock().await;
        if let Some((token, until)) = slot.as_ref() {
            if Instant::now() < *until {
                return Ok(Some(token.clone()));
            }
        }
        let form = [
            ("grant_type", "client_credentials"),
            ("client_id", id.as_str()),
            ("client_secret", secret.as_str()),
            ("scope", "catalog"),
        ];
        let response = self
            .http
            .post(format!("{}/v1/oauth/tokens", self.uri))
            .form(&form)
            .send()
            .await
            .map_err(|e| self.err("get an OAuth2 token", e.without_url().to_string()))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let Some(token) = body["access_token"].as_str().filter(|_| status.is_success()) else {
            return Err(self.err(
                "get an OAuth2 token",
                format!("the server answered {status} (the credential is not shown)"),
            ));
        };
        let lifetime = body["expires_in"].as_u64().unwrap_or(3600);
        // Renew a minute early.
        let until = Instant::now() + Duration::from_secs(lifetime.saturating_sub(60).max(1));
        *slot = Some((token.to_string(), until));
        Ok(Some(token.to_string()))
    }

    fn err(&self, operation: &str, reason: String) -> IcebergSinkError {
        catalog_err(&self.name, operation, reason)
    }

    /// One request; returns the status and the JSON body.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(reqwest::StatusCode, Value), IcebergSinkError> {
        let mut request = self.http.request(method, format!("{}{path}", self.uri));
        if let Some(token) = self.token().await? {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| self.err(path, e.without_url().to_string()))?;
        let status = response.status();
        let body = response.json().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    fn table_path(&self, ident: &TableIdent) -> String {
        format!(
            "{}namespaces/{}/tables/{}",
            self.base,
            ident.namespace.join("\u{1f}"),
            ident.name
        )
    }

    fn loaded(&self, ident: &TableIdent, body: &Value) -> Result<LoadedTable, IcebergSinkError> {
        let metadata: TableMetadata = serde_json::from_value(body["metadata"].clone())
            .map_err(|e| self.err(&format!("read table {}", shown(ident)), e.to_string()))?;
        let location = body["metadata-location"].as_str().unwrap_or_default().to_string();
        Ok(LoadedTable {
            metadata,
            metadata_location: location,
        })
    }

    fn refused(&self, operation: &str, status: reqwest::StatusCode, body: &Value) -> IcebergSinkError {
        let message = body["error"]["message"].as_str().unwrap_or("no message");
        self.err(operation, format!("the server answered {status}: {message}"))
    }
}

fn catalog_err(catalog: &str, operation: &str, reason: String) -> IcebergSinkError {
    IcebergSinkError::Config {
        catalog: catalog.to_string(),
        reason: format!("{operation}: {reason}"),
    }
}

fn shown(ident: &TableIdent) -> String {
    format!("{}.{}", ident.namespace.join("."), ident.name)
}

#[async_trait]
impl Catalog for RestCatalog {
    fn name(&self) -> &str {
        &self.name
    }

    fn file_io(&self) -> &FileIO {
        &self.file_io
    }

    fn default_location(&self, ident: &TableIdent) -> String {
        format!(
            "{}/{}/{}",
            self.warehouse.trim_end_matches('/'),
            ident.namespace.join("/"),
            ident.name
        )
    }

    fn writes_metadata(&self) -> bool {
        false
    }

    async fn load(&self, ident: &TableIdent) -> Result<Option<LoadedTable>, IcebergSinkError> {
        check_ident(ident)?;
        let (status, body) = self.call(reqwest::Method::GET, &self.table_path(ident), None).await?;
        match status.as_u16() {
            200 => Ok(Some(self.loaded(ident, &body)?)),
            404 => Ok(None),
            _ => Err(self.refused(&format!("load table {}", shown(ident)), status, &body)),
        }
    }

    async fn create(&self, ident: &TableIdent, metadata: TableMetadata) -> Result<LoadedTable, IcebergSinkError> {
        check_ident(ident)?;
        let namespaces = format!("{}namespaces", self.base);
        let body = json!({"namespace": ident.namespace.clone().inner(), "properties": {}});
        let (status, answer) = self.call(reqwest::Method::POST, &namespaces, Some(body)).await?;
        if !status.is_success() && status.as_u16() != 409 {
            return Err(self.refused("create the namespace", status, &answer));
        }
        let spec = metadata.default_partition_spec();
        let fields: Vec<Value> = spec
            .fields()
            .iter()
            .map(
                |f| json!({"source-id": f.source_id, "field-id": f.field_id, "name": f.name, "transform": f.transform}),
            )
            .collect();
        let request = json!({
            "name": ident.name,
            "schema": metadata.current_schema(),
            "partition-spec": {"spec-id": 0, "fields": fields},
            "properties": metadata.properties(),
        });
        let path = format!("{}namespaces/{}/tables", self.base, ident.namespace.join("\u{1f}"));
        let (status, answer) = self.call(reqwest::Method::POST, &path, Some(request)).await?;
        match status.as_u16() {
            200 => {
                tracing::info!(table = %shown(ident), "created the Iceberg table in the REST catalog");
                self.loaded(ident, &answer)
            }
            409 => self.load(ident).await?.ok_or_else(|| IcebergSinkError::NoSuchTable {
                catalog: self.name.clone(),
                table: shown(ident),
            }),
            _ => Err(self.refused(&format!("create table {}", shown(ident)), status, &answer)),
        }
    }

    async fn swap(
        &self,
        ident: &TableIdent,
        base: &LoadedTable,
        _metadata: TableMetadata,
        changes: &[TableUpdate],
    ) -> Result<Swap, IcebergSinkError> {
        let requirements = vec![
            TableRequirement::UuidMatch {
                uuid: base.metadata.uuid(),
            },
            TableRequirement::RefSnapshotIdMatch {
                r#ref: MAIN_BRANCH.to_string(),
                snapshot_id: base.metadata.current_snapshot_id(),
            },
        ];
        let request = json!({
            "identifier": {"namespace": ident.namespace.clone().inner(), "name": ident.name},
            "requirements": requirements,
            "updates": changes,
        });
        let (status, answer) = self
            .call(reqwest::Method::POST, &self.table_path(ident), Some(request))
            .await?;
        match status.as_u16() {
            200 => Ok(Swap::Swapped(Box::new(self.loaded(ident, &answer)?))),
            409 => Ok(Swap::Conflict),
            // A server error may hide a commit that happened.
            _ => Err(self.refused(&format!("commit to table {}", shown(ident)), status, &answer)),
        }
    }
}
