//! The clients' context: librdkafka's logs and errors go to `tracing`, and
//! an authentication failure, which librdkafka explains only in its log, is
//! kept so that the request that failed for it can say why.

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext};
use rdkafka::error::{KafkaError as ClientError, RDKafkaErrorCode};
use rdkafka::message::Message;

use crate::error::KafkaError;
use weir_core::sync::Recover;

/// A consumer with weir's context.
pub(crate) type Consumer = BaseConsumer<Context>;

/// What a client reports besides the results of its calls.
#[derive(Debug)]
pub(crate) struct Context {
    /// The brokers, for messages.
    brokers: String,
    /// librdkafka's reason for the last failed authentication.
    auth_failure: Mutex<Option<String>>,
}

impl Context {
    pub(crate) fn new(brokers: &str) -> Self {
        Context {
            brokers: brokers.to_string(),
            auth_failure: Mutex::default(),
        }
    }

    /// `e`, or the authentication failure behind it.
    pub(crate) fn explain(&self, e: KafkaError) -> KafkaError {
        match (&e, self.auth_failure.lock().recover().clone()) {
            (KafkaError::Client { .. } | KafkaError::Stalled { .. }, Some(reason)) => KafkaError::Authentication {
                brokers: self.brokers.clone(),
                reason,
            },
            _ => e,
        }
    }
}

/// Serves what librdkafka queued for a client that is not reading (logs,
/// errors), so that it reaches the context and the queue stays small, then
/// explains `e` by it.
pub(crate) fn explained(consumer: &Consumer, e: KafkaError) -> KafkaError {
    serve(consumer);
    consumer.context().explain(e)
}

/// Serves the queued events of a consumer that reads nothing.
pub(crate) fn serve(consumer: &Consumer) {
    for _ in 0..10_000 {
        match consumer.poll(Duration::ZERO) {
            None => break,
            Some(Err(e)) => tracing::debug!(error = %e, "Kafka client event"),
            Some(Ok(m)) => tracing::debug!(offset = m.offset(), "a record on a client that reads nothing"),
        }
    }
}

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        // Consumers get authentication failures as bare error codes; the
        // reason comes only in the log.
        if message.contains("SASL authentication error") || message.contains("Authentication failed") {
            *self.auth_failure.lock().recover() = Some(message.to_string());
        }
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", fac, "{message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", fac, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => tracing::info!(target: "librdkafka", fac, "{message}"),
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", fac, "{message}"),
        }
    }

    fn error(&self, error: ClientError, reason: &str) {
        if matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed)
        ) {
            *self.auth_failure.lock().recover() = Some(reason.to_string());
        }
        tracing::warn!(target: "librdkafka", %error, reason, "Kafka client error");
    }
}

impl ConsumerContext for Context {}
