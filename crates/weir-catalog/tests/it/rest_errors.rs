//! How the REST catalog's failures are reported: each keeps its kind (no
//! answer, an error status, an answer that is not the protocol's) and a
//! correct retryable judgement. A local server answers as a broken or busy
//! catalog would.

use std::collections::HashMap;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use weir_catalog::{RestCatalog, RestError};
use weir_iceberg::IcebergSinkError;

/// Serves `answer` (status line, content type, body) to every request.
async fn serve(status: &'static str, content_type: &'static str, body: &'static str) -> String {
    serve_declaring(status, content_type, body, body.len()).await
}

/// The same, declaring a body of `length` bytes (more than it sends: an
/// answer cut off).
async fn serve_declaring(
    status: &'static str,
    content_type: &'static str,
    body: &'static str,
    length: usize,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut request = vec![0u8; 64 * 1024];
            let _ = stream.read(&mut request).await;
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {length}\r\nconnection: close\r\n\r\n{body}"
            );
            let _ = stream.write_all(response.as_bytes()).await;
        }
    });
    uri
}

async fn connect(uri: &str) -> IcebergSinkError {
    RestCatalog::connect("rest", uri, "s3://warehouse/", None, HashMap::new())
        .await
        .expect_err("the catalog answers wrongly")
}

/// The REST catalog's own error, kept as the cause of the catalog failure.
fn rest(e: &IcebergSinkError) -> &RestError {
    match e {
        IcebergSinkError::Catalog { source, .. } => source
            .downcast_ref::<RestError>()
            .unwrap_or_else(|| panic!("expected a REST catalog error, got {e:?}")),
        other => panic!("expected a REST catalog error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_body_that_is_not_json_is_an_error_not_an_empty_answer() {
    let uri = serve("200 OK", "application/json", "{\"defaults\": {\"s3.endpoint\"").await;
    let err = connect(&uri).await;
    assert!(
        matches!(rest(&err), RestError::Malformed { part: "body", .. }),
        "{err:?}"
    );
    assert!(!err.retryable(), "a malformed answer does not mend itself: {err}");
}

#[tokio::test]
async fn an_answer_cut_off_midway_is_retryable() {
    // The connection closes after part of the body: what the request did
    // is unknown, and asking again may tell.
    let uri = serve_declaring("200 OK", "application/json", "{\"defaults\": {", 4096).await;
    let err = connect(&uri).await;
    assert!(matches!(rest(&err), RestError::Cut(_)), "{err:?}");
    assert!(err.retryable(), "a cut connection may hold next time: {err}");
}

#[tokio::test]
async fn a_server_error_from_a_proxy_is_retryable_and_shows_its_page() {
    let uri = serve(
        "503 Service Unavailable",
        "text/html",
        "<html>upstream connect error</html>",
    )
    .await;
    let err = connect(&uri).await;
    let RestError::Status { status, message } = rest(&err) else {
        panic!("expected an error status, got {err:?}");
    };
    assert_eq!(status.as_u16(), 503);
    assert!(message.contains("upstream connect error"), "{message}");
    assert!(err.retryable(), "a busy server may answer later: {err}");
}

#[tokio::test]
async fn a_refusal_keeps_the_protocols_message_and_is_not_retryable() {
    let uri = serve(
        "400 Bad Request",
        "application/json",
        r#"{"error": {"message": "warehouse is not known", "type": "BadRequestException", "code": 400}}"#,
    )
    .await;
    let err = connect(&uri).await;
    let RestError::Status { status, message } = rest(&err) else {
        panic!("expected an error status, got {err:?}");
    };
    assert_eq!(status.as_u16(), 400);
    assert_eq!(message, "warehouse is not known");
    assert!(!err.retryable(), "{err}");
}

#[tokio::test]
async fn a_catalog_that_does_not_answer_is_retryable() {
    // A port that was just free: nothing listens on it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let err = connect(&uri).await;
    assert!(matches!(rest(&err), RestError::Request(_)), "{err:?}");
    assert!(err.retryable(), "a catalog that did not answer may answer later: {err}");
    assert!(
        err.to_string().contains("no answer"),
        "the message says what happened: {err}"
    );
}

#[tokio::test]
async fn a_refused_credential_is_named_without_the_secret() {
    let uri = serve("401 Unauthorized", "application/json", r#"{"error": "invalid_client"}"#).await;
    let credential = Some(("id".to_string(), "very-secret".to_string()));
    let err = RestCatalog::connect("rest", &uri, "s3://warehouse/", credential, HashMap::new())
        .await
        .expect_err("the credential is refused");
    assert!(
        matches!(rest(&err), RestError::Credential { status } if status.as_u16() == 401),
        "{err:?}"
    );
    assert!(!err.retryable());
    assert!(!format!("{err} {err:?}").contains("very-secret"));
}
