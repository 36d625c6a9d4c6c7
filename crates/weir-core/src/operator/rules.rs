//! Which output modes a query may use, by its stateful operators: Spark
//! Structured Streaming's rules, checked when the query starts.

use super::OperatorKind;
use crate::sink::OutputMode;

/// A rule of the output modes that a query breaks, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModeRule {
    /// Complete mode hands the sink the whole result every trigger; without
    /// an aggregation the whole result is every row ever read.
    #[error("Complete mode needs an aggregation: without one the whole result is every row the query ever read. Use Append to add each trigger's rows, or aggregate first")]
    CompleteWithoutAggregation,
    /// An aggregation's group can change while rows for it may still
    /// arrive; Append emits a group only once it cannot change, which only
    /// a watermark on a window of event time tells.
    #[error("Append mode with the aggregation {operator:?} needs a watermark and a window of its event-time column: without them no group is ever final, so nothing would be emitted. Add with_watermark(column, delay) before it and group by window(column, ..), or use Update or Complete")]
    AppendAggregationWithoutWatermark {
        /// The aggregation.
        operator: String,
    },
    /// A deduplication that forgets keys behind the watermark needs one.
    #[error("{operator:?} keeps each key until the watermark passes it, and the query has no watermark. Add with_watermark(column, delay) before it, or use drop_duplicates")]
    DedupWithinWatermarkWithoutWatermark {
        /// The deduplication.
        operator: String,
    },
    /// Update and Complete hand the sink one aggregation's groups; a second
    /// aggregation would get changed groups it cannot tell from new ones.
    #[error("more than one aggregation ({first:?}, then {second:?}) works in Append mode only: in {mode} mode the second would aggregate updates of the first as if they were new rows")]
    ChainedAggregations {
        /// The mode asked for.
        mode: OutputMode,
        /// The first aggregation.
        first: String,
        /// The one after it.
        second: String,
    },
    /// A watermark after the operator it should bound comes too late.
    #[error("the watermark on {column:?} is set after the stateful operator {operator:?}; set with_watermark before the operators it bounds")]
    WatermarkAfterOperator {
        /// The watermark's event-time column.
        column: String,
        /// The operator before it.
        operator: String,
    },
}

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
pub fn check_query_mode(shape: &QueryShape, mode: OutputMode) -> Result<(), ModeRule> {
    if let Some((column, before)) = &shape.watermark {
        if *before > 0 {
            return Err(ModeRule::WatermarkAfterOperator {
                column: column.clone(),
                operator: shape.operators[before - 1].name.clone(),
            });
        }
    }
    let has_watermark = shape.watermark.is_some();
    let aggregations: Vec<&OperatorFacts> = shape
        .operators
        .iter()
        .filter(|o| matches!(o.kind, OperatorKind::Aggregation { .. }))
        .collect();
    for op in &shape.operators {
        match op.kind {
            OperatorKind::Deduplication { within_watermark: true } if !has_watermark => {
                return Err(ModeRule::DedupWithinWatermarkWithoutWatermark {
                    operator: op.name.clone(),
                })
            }
            OperatorKind::Aggregation { event_time_window }
                if mode == OutputMode::Append && !(has_watermark && event_time_window) =>
            {
                return Err(ModeRule::AppendAggregationWithoutWatermark {
                    operator: op.name.clone(),
                })
            }
            _ => {}
        }
    }
    if mode != OutputMode::Append && aggregations.len() > 1 {
        return Err(ModeRule::ChainedAggregations {
            mode,
            first: aggregations[0].name.clone(),
            second: aggregations[1].name.clone(),
        });
    }
    if mode == OutputMode::Complete && aggregations.is_empty() {
        return Err(ModeRule::CompleteWithoutAggregation);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agg(window: bool) -> OperatorFacts {
        OperatorFacts {
            name: "totals".into(),
            kind: OperatorKind::Aggregation {
                event_time_window: window,
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

    /// Spark's table of modes: (operators, watermark) x mode -> allowed.
    #[test]
    fn the_modes_follow_sparks_rules() {
        let cases: Vec<(Vec<OperatorFacts>, bool, [bool; 3])> = vec![
            // stateless: Append and Update, never Complete
            (vec![], false, [true, false, true]),
            (vec![], true, [true, false, true]),
            // an aggregation: Append only with a watermark on a window
            (vec![agg(true)], true, [true, true, true]),
            (vec![agg(true)], false, [false, true, true]),
            (vec![agg(false)], true, [false, true, true]),
            // a deduplication is not an aggregation: no Complete
            (vec![dedup(false)], false, [true, false, true]),
            (vec![dedup(true)], true, [true, false, true]),
            (vec![dedup(true)], false, [false, false, false]),
            // two aggregations: Append only
            (vec![agg(true), agg(true)], true, [true, false, false]),
            (vec![dedup(false), agg(true)], true, [true, true, true]),
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
        let e = check_query_mode(&shape(vec![agg(true)], false), Append).unwrap_err();
        assert!(e.to_string().contains("with_watermark"), "{e}");
        assert!(e.to_string().contains("use Update or Complete"), "{e}");
        let e = check_query_mode(&shape(vec![dedup(true)], false), Update).unwrap_err();
        assert!(e.to_string().contains("drop_duplicates"), "{e}");
        let late = QueryShape {
            operators: vec![agg(true)],
            watermark: Some(("ts".into(), 1)),
        };
        let e = check_query_mode(&late, Update).unwrap_err();
        assert_eq!(
            e,
            ModeRule::WatermarkAfterOperator {
                column: "ts".into(),
                operator: "totals".into()
            }
        );
    }
}
