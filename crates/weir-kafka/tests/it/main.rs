//! weir-kafka's tests, on the real broker `scripts/services/kafka.sh`
//! starts (`WEIR_TEST_KAFKA_BOOTSTRAP`).

mod broker;
mod conformance;
mod network;
mod security;
mod sink;
mod source;
