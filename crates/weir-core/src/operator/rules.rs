//! Which output modes a query may use, by its stateful operators and its
//! watermark: Spark Structured Streaming's rules, checked when the query
//! starts, before anything is written.

use super::query_rule::QueryRule;
use super::OperatorKind;
use crate::sink::OutputMode;

/// One stateful operator of a query, as the rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorFacts {
    /// The operator's name.
    pub name: String,
    /// What it does.
    pub kind: OperatorKind,
}

/// What the rules need to know of a query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryShape {
    /// The stateful operators, in the order rows pass them.
    pub operators: Vec<OperatorFacts>,
    /// The watermark's column and how many operators come before it, if
    /// the query has one.
    pub watermark: Option<(String, usize)>,
}

/// Checks `mode` against the query's operators (a pure function; the
/// driver calls it before it touches the checkpoint or the sink).
pub fn check_query_mode(shape: &QueryShape, mode: OutputMode) -> Result<(), QueryRule> {
    if let Some((column, before)) = &shape.watermark {
        if *before > 0 {
            return Err(QueryRule::WatermarkAfterOperator {
                column: column.clone(),
                operator: shape.operators[before - 1].name.clone(),
            });
        }
    }
    let watermark = shape.watermark.as_ref().map(|(c, _)| c.as_str());
    let mut aggregation: Option<&str> = None;
    for op in &shape.operators {
        if let (Some(agg), true) = (aggregation, mode != OutputMode::Append) {
            return Err(QueryRule::OperatorAfterAggregation {
                mode,
                aggregation: agg.to_string(),
                after: op.name.clone(),
            });
        }
        match &op.kind {
            OperatorKind::Deduplication { within_watermark: true } if watermark.is_none() => {
                return Err(QueryRule::DedupWithinWatermarkWithoutWatermark {
                    operator: op.name.clone(),
                })
            }
            OperatorKind::Aggregation { sessions: true, .. } if mode == OutputMode::Update => {
                return Err(QueryRule::UpdateWithSessions {
                    operator: op.name.clone(),
                })
            }
            OperatorKind::Aggregation { event_time, .. }
                if mode == OutputMode::Append && (watermark.is_none() || event_time.as_deref() != watermark) =>
            {
                return Err(QueryRule::AppendAggregationWithoutWatermark {
                    operator: op.name.clone(),
                })
            }
            OperatorKind::Aggregation { .. } => aggregation = Some(&op.name),
            _ => {}
        }
    }
    if mode == OutputMode::Complete && aggregation.is_none() {
        return Err(QueryRule::CompleteWithoutAggregation);
    }
    Ok(())
}

/// Whether the query has an aggregation. Without one, Update mode hands
/// the sink the same rows as Append (as in Spark), and sinks get Append.
pub fn has_aggregation(shape: &QueryShape) -> bool {
    shape
        .operators
        .iter()
        .any(|o| matches!(o.kind, OperatorKind::Aggregation { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agg(event_time: Option<&str>) -> OperatorFacts {
        OperatorFacts {
            name: "totals".into(),
            kind: OperatorKind::Aggregation {
                event_time: event_time.map(Into::into),
                sessions: false,
            },
        }
    }

    fn sessions(event_time: Option<&str>) -> OperatorFacts {
        OperatorFacts {
            name: "sessions".into(),
            kind: OperatorKind::Aggregation {
                event_time: event_time.map(Into::into),
                sessions: true,
            },
        }
    }

    fn dedup(within: bool) -> OperatorFacts {
        OperatorFacts {
            name: "dedup".into(),
            kind: OperatorKind::Deduplication {
                within_watermark: within,
            },
        }
    }

    fn shape(operators: Vec<OperatorFacts>, watermark: bool) -> QueryShape {
        QueryShape {
            operators,
            watermark: watermark.then(|| ("ts".to_string(), 0)),
        }
    }

    use OutputMode::{Append, Complete, Update};

    /// Spark's table of modes: (operators, watermark on `ts`) x mode ->
    /// allowed.
    #[test]
    fn the_modes_follow_sparks_rules() {
        let ts = Some("ts");
        let cases: Vec<(Vec<OperatorFacts>, bool, [bool; 3])> = vec![
            // stateless: Append and Update, never Complete
            (vec![], false, [true, false, true]),
            (vec![], true, [true, false, true]),
            // an aggregation: Append only with a watermark on its event time
            (vec![agg(ts)], true, [true, true, true]),
            (vec![agg(ts)], false, [false, true, true]),
            (vec![agg(None)], true, [false, true, true]),
            (vec![agg(Some("other"))], true, [false, true, true]),
            // a deduplication is not an aggregation: no Complete
            (vec![dedup(false)], false, [true, false, true]),
            (vec![dedup(true)], true, [true, false, true]),
            (vec![dedup(true)], false, [false, false, false]),
            // anything stateful after an aggregation: Append only
            (vec![agg(ts), agg(ts)], true, [true, false, false]),
            (vec![agg(ts), dedup(true)], true, [true, false, false]),
            (vec![agg(ts), dedup(false)], true, [true, false, false]),
            (vec![dedup(false), agg(ts)], true, [true, true, true]),
            // sessions: as an aggregation, but never Update
            (vec![sessions(ts)], true, [true, true, false]),
            (vec![sessions(ts)], false, [false, true, false]),
        ];
        for (ops, wm, allowed) in cases {
            let s = shape(ops.clone(), wm);
            for (mode, want) in [Append, Complete, Update].into_iter().zip(allowed) {
                let got = check_query_mode(&s, mode);
                assert_eq!(got.is_ok(), want, "{ops:?} watermark={wm} {mode}: {got:?}");
            }
        }
    }

    #[test]
    fn each_refusal_names_the_rule_and_the_fix() {
        let e = check_query_mode(&shape(vec![], false), Complete).unwrap_err();
        assert!(e.to_string().contains("needs an aggregation"), "{e}");
        let e = check_query_mode(&shape(vec![agg(Some("ts"))], false), Append).unwrap_err();
        assert!(e.to_string().contains("with_watermark"), "{e}");
        assert!(e.to_string().contains("use Update or Complete"), "{e}");
        let e = check_query_mode(&shape(vec![dedup(true)], false), Update).unwrap_err();
        assert!(e.to_string().contains("drop_duplicates"), "{e}");
        let e = check_query_mode(&shape(vec![agg(Some("ts")), dedup(false)], true), Update).unwrap_err();
        assert!(e.to_string().contains("Append mode only"), "{e}");
        let e = check_query_mode(&shape(vec![sessions(Some("ts"))], true), Update).unwrap_err();
        assert!(e.to_string().contains("Use Append"), "{e}");
        let late = QueryShape {
            operators: vec![agg(Some("ts"))],
            watermark: Some(("ts".into(), 1)),
        };
        let e = check_query_mode(&late, Update).unwrap_err();
        assert_eq!(
            e,
            QueryRule::WatermarkAfterOperator {
                column: "ts".into(),
                operator: "totals".into()
            }
        );
    }
}
