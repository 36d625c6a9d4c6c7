//! What every maintenance job's builder shares: the compaction setters,
//! written once for each compaction job over [`CompactOptions`]' own (which
//! keep the limits), and the `IntoFuture` that lets a job be awaited.
//!
//! [`CompactOptions`]: super::CompactOptions

/// The `with_*` setters of a compaction job that holds its
/// [`CompactOptions`] in field `$options` and its progress callback in
/// field `$progress`: each sets the option through [`CompactOptions`]'s
/// own setter, so the limits are [`CompactOptions::limited`]'s alone.
///
/// [`CompactOptions`]: crate::maintenance::CompactOptions
/// [`CompactOptions::limited`]: crate::maintenance::CompactOptions::limited
#[doc(hidden)]
#[macro_export]
macro_rules! compact_setters {
    ($options:ident, $progress:ident) => {
        /// The size of the files written (at least 1 byte); files under
        /// three quarters of it are inputs.
        pub fn with_target_file_size(mut self, bytes: u64) -> Self {
            self.$options = ::std::mem::take(&mut self.$options).with_target_file_size(bytes);
            self
        }

        /// The fewest files a group must have to be rewritten (at least 2).
        pub fn with_min_input_files(mut self, files: usize) -> Self {
            self.$options = ::std::mem::take(&mut self.$options).with_min_input_files(files);
            self
        }

        /// How many groups are rewritten at once (at least 1); peak memory
        /// grows with it, not with the table.
        pub fn with_max_concurrent_rewrites(mut self, groups: usize) -> Self {
            self.$options = ::std::mem::take(&mut self.$options).with_max_concurrent_rewrites(groups);
            self
        }

        /// Commit every `groups` groups (at least 1; partial progress for
        /// large tables) instead of once at the end.
        pub fn with_groups_per_commit(mut self, groups: usize) -> Self {
            self.$options = ::std::mem::take(&mut self.$options).with_groups_per_commit(groups);
            self
        }

        /// Only the partitions where `column` (Delta: a partition column;
        /// Iceberg: a partition field, its value as Iceberg shows it) has
        /// `value` (`None`: null). Each call adds a condition; all must hold.
        pub fn with_partition(mut self, column: impl Into<String>, value: Option<String>) -> Self {
            self.$options = ::std::mem::take(&mut self.$options).with_partition(column, value);
            self
        }

        /// Plans only: report the groups, write nothing.
        pub fn with_dry_run(mut self, yes: bool) -> Self {
            self.$options.dry_run = yes;
            self
        }

        /// Every option at once (their limits applied).
        pub fn with_options(mut self, options: $crate::maintenance::CompactOptions) -> Self {
            self.$options = options.limited();
            self
        }

        /// Called as the job plans, rewrites and commits.
        pub fn with_progress(
            mut self,
            f: impl Fn($crate::maintenance::CompactProgress) + Send + Sync + 'static,
        ) -> Self {
            self.$progress = Some(::std::sync::Arc::new(f));
            self
        }
    };
}

/// Deprecated aliases of renamed setters, each calling the setter it was
/// renamed to: `renamed!(dry_run => with_dry_run(yes: bool))`.
#[doc(hidden)]
#[macro_export]
macro_rules! renamed {
    ($($old:ident => $new:ident($($arg:ident: $ty:ty),*)),+ $(,)?) => {
        $(
            #[deprecated(since = "0.1.0", note = "renamed to its `with_` form, as every builder's setters are")]
            #[doc(hidden)]
            pub fn $old(self, $($arg: $ty),*) -> Self {
                self.$new($($arg),*)
            }
        )+
    };
}

/// The names the compaction setters had before they were `with_*`, as
/// deprecated aliases, for the jobs that had them.
#[doc(hidden)]
#[macro_export]
macro_rules! compact_setters_renamed {
    () => {
        $crate::renamed!(
            on_progress => with_progress(f: impl Fn($crate::maintenance::CompactProgress) + Send + Sync + 'static),
            target_file_size => with_target_file_size(bytes: u64),
            min_input_files => with_min_input_files(files: usize),
            max_concurrent_rewrites => with_max_concurrent_rewrites(groups: usize),
            groups_per_commit => with_groups_per_commit(groups: usize),
            partition => with_partition(column: impl Into<String>, value: Option<String>),
            dry_run => with_dry_run(yes: bool),
        );
    };
}

/// Makes a job awaitable: `job.await` runs it as `job.run().await` does.
/// `awaitable!(Job => Result<Report, Error>)`, or with a lifetime,
/// `awaitable!(<'a> Job<'a> => ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! awaitable {
    (<$lt:lifetime> $job:ty => $output:ty) => {
        impl<$lt> ::std::future::IntoFuture for $job {
            type Output = $output;
            type IntoFuture = ::std::pin::Pin<Box<dyn ::std::future::Future<Output = $output> + Send + $lt>>;

            fn into_future(self) -> Self::IntoFuture {
                Box::pin(async move { self.run().await })
            }
        }
    };
    ($job:ty => $output:ty) => {
        impl ::std::future::IntoFuture for $job {
            type Output = $output;
            type IntoFuture = ::std::pin::Pin<Box<dyn ::std::future::Future<Output = $output> + Send>>;

            fn into_future(self) -> Self::IntoFuture {
                Box::pin(async move { self.run().await })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use crate::maintenance::CompactOptions;

    #[test]
    fn setters_apply_their_limits() {
        let options = CompactOptions::default()
            .with_target_file_size(0)
            .with_min_input_files(0)
            .with_max_concurrent_rewrites(0)
            .with_groups_per_commit(0)
            .with_partition("day", Some("2026-12-03".into()))
            .with_partition("zone", None)
            .with_dry_run(true);
        assert_eq!(options.target_file_size, Some(1));
        assert_eq!(options.min_input_files, 2);
        assert_eq!(options.max_concurrent_rewrites, 1);
        assert_eq!(options.groups_per_commit, Some(1));
        assert_eq!(options.partition.len(), 2);
        assert_eq!(options.partition["zone"], None);
        assert!(options.dry_run);
    }

    #[test]
    fn options_set_whole_are_limited() {
        let options = CompactOptions {
            min_input_files: 0,
            max_concurrent_rewrites: 0,
            groups_per_commit: Some(0),
            target_file_size: Some(0),
            ..CompactOptions::default()
        }
        .limited();
        assert_eq!(
            (
                options.min_input_files,
                options.max_concurrent_rewrites,
                options.groups_per_commit,
                options.target_file_size
            ),
            (2, 1, Some(1), Some(1))
        );
    }
}
