//! Client settings passed through to librdkafka, with secrets kept out of
//! logs, errors and `Debug`.

use std::collections::BTreeMap;
use std::fmt;

use rdkafka::ClientConfig;

/// Settings for the Kafka client (`bootstrap.servers`, `security.protocol`,
/// `sasl.*`, `ssl.*`, ...), given as librdkafka names them. Values of
/// settings that hold secrets (passwords, keys, JAAS and OAuth settings)
/// never appear in `Debug`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientSettings(BTreeMap<String, String>);

impl ClientSettings {
    /// Settings with only the brokers to start from.
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        let mut s = ClientSettings::default();
        s.set("bootstrap.servers", bootstrap_servers);
        s
    }

    /// Sets one setting (an existing value is replaced).
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.0.insert(key.into(), value.into());
        self
    }

    /// The value of a setting.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// The brokers, for messages.
    pub fn bootstrap_servers(&self) -> &str {
        self.get("bootstrap.servers").unwrap_or("")
    }

    /// The settings as librdkafka takes them: weir's `defaults` (and
    /// [`CLIENT_DEFAULTS`]) where the user set nothing, the user's, and
    /// weir's `overrides` on top.
    pub(crate) fn client_config(&self, defaults: &[(&str, &str)], overrides: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (k, v) in CLIENT_DEFAULTS.iter().chain(defaults) {
            config.set(*k, *v);
        }
        for (k, v) in &self.0 {
            config.set(k, v);
        }
        for (k, v) in overrides {
            config.set(*k, *v);
        }
        config
    }
}

/// What every client of weir's starts from unless the user sets it:
/// reconnecting to a broker backs off to at most one second, the Java
/// client's default (librdkafka's own is ten), so a connection cut for a
/// moment does not hold a batch for ten seconds.
pub(crate) const CLIENT_DEFAULTS: &[(&str, &str)] = &[("reconnect.backoff.max.ms", "1000")];

/// Whether a setting's value is a secret.
pub(crate) fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "jaas",
        "oauthbearer",
        "ssl.key.pem",
        "ssl_key",
        "ssl.keystore",
        "token",
    ]
    .iter()
    .any(|word| key.contains(word))
}

impl fmt::Debug for ClientSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.0
                    .iter()
                    .map(|(k, v)| (k, if is_secret(k) { "<redacted>" } else { v.as_str() })),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_show_in_debug() {
        let mut s = ClientSettings::new("127.0.0.1:9092");
        s.set("sasl.password", "hunter2")
            .set("sasl.username", "weir")
            .set("ssl.key.password", "k3y")
            .set("sasl.oauthbearer.client.secret", "s3cret");
        let shown = format!("{s:?}");
        assert!(shown.contains("weir") && shown.contains("127.0.0.1:9092"), "{shown}");
        for secret in ["hunter2", "k3y", "s3cret"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert_eq!(s.get("sasl.password"), Some("hunter2"));
    }

    #[test]
    fn reconnects_back_off_a_second_at_most_unless_the_user_says() {
        let key = "reconnect.backoff.max.ms";
        let mut s = ClientSettings::new("127.0.0.1:9092");
        let config = s.client_config(&[("enable.idempotence", "true")], &[]);
        assert_eq!(config.get(key), Some("1000"));
        assert_eq!(config.get("enable.idempotence"), Some("true"));
        s.set(key, "10000");
        assert_eq!(s.client_config(&[], &[]).get(key), Some("10000"));
    }
}
