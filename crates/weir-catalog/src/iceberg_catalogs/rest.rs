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

use weir_iceberg::{check_ident, shown, Catalog, IcebergSinkError, LoadedTable, Swap};

use crate::error::RestError;

/// How deep nested namespaces are listed.
const MAX_NAMESPACE_DEPTH: usize = 8;
/// Tries at making a namespace that another process is making too.
const NAMESPACE_ATTEMPTS: u32 = 6;

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
    /// The storage settings, the server's included (secrets: never shown).
    storage: HashMap<String, String>,
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
                .map_err(|e| rest_err(name, "build the HTTP client", RestError::Request(e)))?,
            file_io: weir_iceberg::local_file_io(),
            storage: HashMap::new(),
        };
        let (status, config) = catalog
            .call(
                reqwest::Method::GET,
                &format!("/v1/config?warehouse={}", encode(warehouse)),
                None,
            )
            .await?;
        if !status.is_success() {
            return Err(catalog.refused("read the catalog's configuration", status, &config));
        }
        if let Some(prefix) = config["overrides"]["prefix"].as_str() {
            catalog.base = format!("/v1/{prefix}/");
        }
        // The server's defaults fill in what the client did not set; its
        // overrides win.
        for (section, wins) in [("defaults", false), ("overrides", true)] {
            if let Some(map) = config[section].as_object() {
                for (k, v) in map {
                    if let (true, Some(v)) = (k.starts_with("s3."), v.as_str()) {
                        if wins {
                            storage.insert(k.clone(), v.to_string());
                        } else {
                            storage.entry(k.clone()).or_insert_with(|| v.to_string());
                        }
                    }
                }
            }
        }
        // A REST warehouse is often a name, not a location: the tables'
        // locations decide, so the file IO handles local paths and s3://.
        catalog.file_io = weir_iceberg::object_file_io(storage.clone());
        catalog.storage = storage;
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
            .map_err(|e| self.err("get an OAuth2 token", RestError::Request(e.without_url())))?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.err("get an OAuth2 token", RestError::Credential { status }));
        }
        let body = json_body(response)
            .await
            .map_err(|e| self.err("get an OAuth2 token", e))?;
        let Some(token) = body["access_token"].as_str() else {
            return Err(self.err("get an OAuth2 token", RestError::Missing { part: "access_token" }));
        };
        let lifetime = body["expires_in"].as_u64().unwrap_or(3600);
        // Renew a minute early.
        let until = Instant::now() + Duration::from_secs(lifetime.saturating_sub(60).max(1));
        *slot = Some((token.to_string(), until));
        Ok(Some(token.to_string()))
    }

    fn err(&self, operation: &str, source: RestError) -> IcebergSinkError {
        rest_err(&self.name, operation, source)
    }

    /// One request; returns the status and the JSON body (`null` when the
    /// body is empty). A successful answer whose body is not JSON is an
    /// error; an error's body that is not JSON becomes its message.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(reqwest::StatusCode, Value), IcebergSinkError> {
        for renewed in [false, true] {
            let mut request = self.http.request(method.clone(), format!("{}{path}", self.uri));
            if let Some(token) = self.token().await? {
                request = request.bearer_auth(token);
            }
            if let Some(body) = &body {
                request = request.json(body);
            }
            let response = request
                .send()
                .await
                .map_err(|e| self.err(path, RestError::Request(e.without_url())))?;
            let status = response.status();
            // A revoked token: nothing was done; renew it once.
            if status.as_u16() == 401 && self.credential.is_some() && !renewed {
                *self.token.lock().await = None;
                continue;
            }
            if status.is_success() {
                return Ok((status, json_body(response).await.map_err(|e| self.err(path, e))?));
            }
            // The status decides; a body that cannot be read only loses
            // the message.
            let text = response.text().await.unwrap_or_default();
            let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
            return Ok((status, body));
        }
        unreachable!("the second pass returns")
    }

    /// Every item of `key` in the answers to `path`, following
    /// `next-page-token`; a missing namespace has none.
    async fn pages(&self, path: &str, key: &'static str, operation: &str) -> Result<Vec<Value>, IcebergSinkError> {
        let mut items = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let separator = if path.contains('?') { '&' } else { '?' };
            let url = match &page {
                Some(token) => format!("{path}{separator}pageToken={}", encode(token)),
                None => path.to_string(),
            };
            let (status, body) = self.call(reqwest::Method::GET, &url, None).await?;
            match status.as_u16() {
                200 => {}
                404 => return Ok(items),
                _ => return Err(self.refused(operation, status, &body)),
            }
            let Some(found) = body[key].as_array() else {
                return Err(self.err(operation, RestError::Missing { part: key }));
            };
            items.extend(found.iter().cloned());
            page = body["next-page-token"]
                .as_str()
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            if page.is_none() {
                return Ok(items);
            }
        }
    }

    fn table_path(&self, ident: &TableIdent) -> String {
        format!("{}tables/{}", self.namespace_path(ident), encode(&ident.name))
    }

    /// `namespaces/<parts joined by 0x1F>/`, each part percent-encoded.
    fn namespace_path(&self, ident: &TableIdent) -> String {
        let parts: Vec<String> = ident.namespace.iter().map(|p| encode(p)).collect();
        format!("{}namespaces/{}/", self.base, parts.join("%1F"))
    }

    /// Makes the table's namespace unless it exists. Processes that create
    /// tables in a new namespace at once race here, and a catalog may
    /// answer the loser with a server error rather than 409 (SeaweedFS's
    /// does, while the winner's namespace is half made): a server error is
    /// asked again, after a pause, whether the namespace exists now.
    async fn ensure_namespace(&self, ident: &TableIdent) -> Result<(), IcebergSinkError> {
        let namespaces = format!("{}namespaces", self.base);
        let body = json!({"namespace": ident.namespace.clone().inner(), "properties": {}});
        let exists = self.namespace_path(ident).trim_end_matches('/').to_string();
        let mut pause = Duration::from_millis(50);
        for attempt in 1..=NAMESPACE_ATTEMPTS {
            let (status, answer) = self.call(reqwest::Method::GET, &exists, None).await?;
            if status.is_success() {
                return Ok(());
            }
            if status.as_u16() != 404 {
                return Err(self.refused("look up the namespace", status, &answer));
            }
            let (status, answer) = self
                .call(reqwest::Method::POST, &namespaces, Some(body.clone()))
                .await?;
            if status.is_success() || status.as_u16() == 409 {
                return Ok(());
            }
            if !status.is_server_error() || attempt == NAMESPACE_ATTEMPTS {
                return Err(self.refused("create the namespace", status, &answer));
            }
            tracing::debug!(%status, attempt, "creating the namespace failed; asking again whether it exists");
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
        unreachable!("the last attempt returns")
    }

    fn loaded(&self, ident: &TableIdent, body: &Value) -> Result<LoadedTable, IcebergSinkError> {
        let operation = || format!("read table {}", shown(ident));
        let metadata: TableMetadata = serde_json::from_value(body["metadata"].clone()).map_err(|source| {
            self.err(
                &operation(),
                RestError::Malformed {
                    part: "table metadata",
                    source,
                },
            )
        })?;
        let Some(location) = body["metadata-location"].as_str() else {
            return Err(self.err(
                &operation(),
                RestError::Missing {
                    part: "metadata-location",
                },
            ));
        };
        Ok(LoadedTable {
            metadata,
            metadata_location: location.to_string(),
        })
    }

    fn refused(&self, operation: &str, status: reqwest::StatusCode, body: &Value) -> IcebergSinkError {
        self.err(
            operation,
            RestError::Status {
                status,
                message: error_message(body),
            },
        )
    }
}

fn rest_err(catalog: &str, operation: &str, source: RestError) -> IcebergSinkError {
    IcebergSinkError::Catalog {
        catalog: catalog.to_string(),
        operation: operation.to_string(),
        retryable: source.retryable(),
        source: Box::new(source),
    }
}

/// A successful answer's JSON body; `null` when it is empty (a 204).
async fn json_body(response: reqwest::Response) -> Result<Value, RestError> {
    let bytes = response.bytes().await.map_err(|e| RestError::Cut(e.without_url()))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|source| RestError::Malformed { part: "body", source })
}

/// What an error answer says: the protocol's `error.message`, or the start
/// of a body that is not the protocol's error.
fn error_message(body: &Value) -> String {
    if let Some(message) = body["error"]["message"].as_str() {
        return message.to_string();
    }
    match body {
        Value::Null => "no message".to_string(),
        Value::String(text) => {
            let text = text.trim();
            let cut = text.char_indices().nth(200).map_or(text.len(), |(i, _)| i);
            format!("{} (not the protocol's error answer)", &text[..cut])
        }
        other => format!("unexpected answer {other}"),
    }
}

/// Percent-encodes all but the unreserved characters (RFC 3986).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[async_trait]
impl Catalog for RestCatalog {
    fn name(&self) -> &str {
        &self.name
    }

    fn file_io(&self) -> &FileIO {
        &self.file_io
    }

    fn storage_settings(&self) -> HashMap<String, String> {
        self.storage.clone()
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
        self.ensure_namespace(ident).await?;
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
        let path = format!("{}tables", self.namespace_path(ident));
        let (status, answer) = self.call(reqwest::Method::POST, &path, Some(request)).await?;
        match status.as_u16() {
            200 => {
                let created = self.loaded(ident, &answer)?;
                // A catalog that answers concurrent creates of one table
                // with success each (SeaweedFS's does, the last one
                // replacing the others) leaves one of them: the table as
                // the catalog keeps it is the one to write.
                match self.load(ident).await? {
                    Some(kept) if kept.metadata.uuid() != created.metadata.uuid() => {
                        tracing::info!(table = %shown(ident), "another process created the Iceberg table at once; writing to its table");
                        Ok(kept)
                    }
                    _ => {
                        tracing::info!(table = %shown(ident), "created the Iceberg table in the REST catalog");
                        Ok(created)
                    }
                }
            }
            409 => self.load(ident).await?.ok_or_else(|| IcebergSinkError::NoSuchTable {
                catalog: self.name.clone(),
                table: shown(ident),
            }),
            _ => Err(self.refused(&format!("create table {}", shown(ident)), status, &answer)),
        }
    }

    async fn list(&self, namespace: Option<&[String]>) -> Result<Vec<TableIdent>, IcebergSinkError> {
        let namespaces: Vec<Vec<String>> = match namespace {
            Some(ns) => vec![ns.to_vec()],
            None => {
                // Every namespace, nested ones through `parent`.
                let mut all = Vec::new();
                let mut pending: Vec<Option<Vec<String>>> = vec![None];
                while let Some(parent) = pending.pop() {
                    let mut path = format!("{}namespaces", self.base);
                    if let Some(parent) = &parent {
                        let parts: Vec<String> = parent.iter().map(|p| encode(p)).collect();
                        path.push_str(&format!("?parent={}", parts.join("%1F")));
                    }
                    for ns in self.pages(&path, "namespaces", "list the namespaces").await? {
                        let parts: Vec<String> = serde_json::from_value(ns).map_err(|source| {
                            self.err(
                                "list the namespaces",
                                RestError::Malformed {
                                    part: "namespace",
                                    source,
                                },
                            )
                        })?;
                        // A server that ignores `parent` answers the same
                        // namespaces again: only deeper ones are followed.
                        let deeper = parent
                            .as_ref()
                            .is_none_or(|p| parts.len() > p.len() && parts.starts_with(p));
                        if deeper && parts.len() <= MAX_NAMESPACE_DEPTH && !all.contains(&parts) {
                            all.push(parts.clone());
                            pending.push(Some(parts));
                        }
                    }
                }
                all
            }
        };
        let mut tables = Vec::new();
        for parts in namespaces {
            let Ok(ns) = iceberg::NamespaceIdent::from_vec(parts) else {
                continue;
            };
            let path = format!(
                "{}tables",
                self.namespace_path(&TableIdent::new(ns.clone(), String::new()))
            );
            for id in self.pages(&path, "identifiers", "list the tables").await? {
                let name = id["name"]
                    .as_str()
                    .ok_or_else(|| self.err("list the tables", RestError::Missing { part: "table name" }))?;
                tables.push(TableIdent::new(ns.clone(), name.to_string()));
            }
        }
        tables.sort_by(|a, b| (a.namespace.join("."), &a.name).cmp(&(b.namespace.join("."), &b.name)));
        Ok(tables)
    }

    async fn drop_table(&self, ident: &TableIdent, purge: bool) -> Result<bool, IcebergSinkError> {
        check_ident(ident)?;
        let path = format!("{}?purgeRequested={purge}", self.table_path(ident));
        let (status, body) = self.call(reqwest::Method::DELETE, &path, None).await?;
        match status.as_u16() {
            200 | 204 => Ok(true),
            404 => Ok(false),
            _ => Err(self.refused(&format!("drop table {}", shown(ident)), status, &body)),
        }
    }

    async fn swap(
        &self,
        ident: &TableIdent,
        base: &LoadedTable,
        _metadata: TableMetadata,
        changes: &[TableUpdate],
    ) -> Result<Swap, IcebergSinkError> {
        let mut requirements = vec![
            TableRequirement::UuidMatch {
                uuid: base.metadata.uuid(),
            },
            TableRequirement::RefSnapshotIdMatch {
                r#ref: MAIN_BRANCH.to_string(),
                snapshot_id: base.metadata.current_snapshot_id(),
            },
        ];
        // New columns take field ids after the base's last one: the schema
        // must not have moved either.
        if changes.iter().any(|c| matches!(c, TableUpdate::AddSchema { .. })) {
            requirements.push(TableRequirement::CurrentSchemaIdMatch {
                current_schema_id: base.metadata.current_schema_id(),
            });
            requirements.push(TableRequirement::LastAssignedFieldIdMatch {
                last_assigned_field_id: base.metadata.last_column_id(),
            });
        }
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
            // Asked to slow down, or the request timed out: not refused.
            // The sink reads the table to learn whether it landed.
            408 | 429 => Err(self.refused(&format!("commit to table {}", shown(ident)), status, &answer)),
            // Refused outright: the request was wrong or not allowed.
            400..=499 => Err(IcebergSinkError::CommitRefused {
                catalog: self.name.clone(),
                table: shown(ident),
                reason: format!("{status}: {}", error_message(&answer)),
            }),
            // A server error may hide a commit that happened.
            _ => Err(self.refused(&format!("commit to table {}", shown(ident)), status, &answer)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::encode;

    #[test]
    fn path_parts_are_percent_encoded() {
        assert_eq!(encode("payments_2026-v1.x~"), "payments_2026-v1.x~");
        assert_eq!(encode("a b/c?d#e%"), "a%20b%2Fc%3Fd%23e%25");
        assert_eq!(encode("s3://weirtables/"), "s3%3A%2F%2Fweirtables%2F");
    }
}
