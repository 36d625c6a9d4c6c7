#!/usr/bin/env bash
# Fetches the jars Spark needs to read weir's tables (Delta Lake on Spark,
# Iceberg's Spark runtime, the SQL catalogs' JDBC drivers) through Maven,
# pinned by integration/readers/spark/pom.xml, into .cache/spark-jars; a
# second run with the same pom does nothing. Spark itself is pyspark, in
# the readers' Python environment.
set -euo pipefail
cd "$(dirname "$0")/.."

pom=integration/readers/spark/pom.xml
lib=.cache/spark-jars

if cmp -s "$pom" "$lib/.pom" 2>/dev/null; then
    exit 0
fi
command -v java >/dev/null || scripts/apt-install.sh openjdk-17-jre-headless
command -v mvn >/dev/null || scripts/apt-install.sh maven
echo "fetching the Spark readers' jars through Maven" >&2
rm -rf "$lib"
mvn -q -B -f "$pom" dependency:copy-dependencies \
    -DoutputDirectory="$PWD/$lib" -DincludeScope=runtime -DexcludeTransitive=true >&2
cp "$pom" "$lib/.pom"
