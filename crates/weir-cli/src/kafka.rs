//! `weir stream --from kafka`: the source its options describe.

use weir::kafka::{AvroFraming, KafkaSource, OnBadRecord, PartitionOffsets, StartingOffsets, ValueColumns};

use crate::args::{KafkaArgs, ValueFormatArg};
use crate::Failure;

pub fn source(args: &KafkaArgs) -> Result<KafkaSource, Failure> {
    let servers = args
        .bootstrap_servers
        .as_deref()
        .ok_or("--from kafka needs --bootstrap-servers HOST:PORT")?;
    let mut source = match (&args.topic_pattern, args.topic.is_empty()) {
        (Some(pattern), _) => KafkaSource::subscribe_pattern(servers, pattern)?,
        (None, false) => KafkaSource::subscribe(servers, args.topic.iter().cloned()),
        (None, true) => return Err("--from kafka needs --topic NAME (or --topic-pattern REGEX)".into()),
    };
    for option in &args.kafka_options {
        let (key, value) = option
            .split_once('=')
            // Not echoed: a mistyped setting may hold a secret.
            .ok_or("--kafka-option: write each setting as key=value")?;
        source = source.option(key.trim(), value.trim());
    }
    if let Some(ms) = args.starting_timestamp {
        source = source.starting_offsets(StartingOffsets::Timestamp(ms));
    }
    if let Some(start) = &args.starting_offsets {
        source = source.starting_offsets(starting_offsets(start)?);
    }
    if let Some(max) = args.max_offsets_per_trigger {
        source = source.max_offsets_per_trigger(max);
    }
    if let Some(group) = &args.commit_offsets_to_group {
        source = source.commit_offsets_to_group(group);
    }
    if args.accept_data_loss {
        source = source.fail_on_data_loss(false);
    }
    match args.value_format {
        ValueFormatArg::Raw => {
            if args.schema.is_some() || !args.keep_kafka_columns.is_empty() || args.dead_letter_column.is_some() {
                return Err(
                    "--schema, --keep-kafka-columns and --dead-letter-column need --value-format json or avro".into(),
                );
            }
        }
        format => {
            let file = args
                .schema
                .as_ref()
                .ok_or("--value-format json or avro needs --schema FILE")?;
            let text = std::fs::read_to_string(file).map_err(|e| format!("--schema {}: {e}", file.display()))?;
            let values = match format {
                ValueFormatArg::Json => ValueColumns::json(
                    crate::ddl::parse(&text).map_err(|e| format!("--schema {}: {e}", file.display()))?,
                ),
                _ => ValueColumns::avro(&text, avro_framing(&args.avro_framing)?)?,
            };
            let mut values = values.keep_columns(args.keep_kafka_columns.iter().cloned());
            if let Some(column) = &args.dead_letter_column {
                values = values.on_bad_record(OnBadRecord::DeadLetterColumn(column.clone()));
            }
            source = source.value_columns(values)?;
        }
    }
    Ok(source)
}

fn avro_framing(text: &str) -> Result<AvroFraming, Failure> {
    Ok(match text {
        "single-object" => AvroFraming::SingleObject,
        "bare" => AvroFraming::Bare,
        other => match other.strip_prefix("confluent:").map(str::parse) {
            Some(Ok(schema_id)) => AvroFraming::Confluent { schema_id },
            _ => return Err(format!("--avro-framing {other:?}: use confluent:ID, single-object or bare").into()),
        },
    })
}

fn starting_offsets(text: &str) -> Result<StartingOffsets, Failure> {
    Ok(match text {
        "earliest" => StartingOffsets::Earliest,
        "latest" => StartingOffsets::Latest,
        json => {
            let value: serde_json::Value = serde_json::from_str(json)
                .map_err(|e| format!("--starting-offsets: earliest, latest or JSON offsets; {e}"))?;
            let offsets = PartitionOffsets::from_json(&value)
                .ok_or("--starting-offsets: JSON offsets are {\"topic\": {\"0\": 42}} (-2 earliest, -1 latest)")?;
            StartingOffsets::Specific(offsets)
        }
    })
}
