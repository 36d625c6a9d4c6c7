#!/usr/bin/env bash
# Starts a single-node Apache Kafka (KRaft: one process is broker and
# controller) on 127.0.0.1 for weir's tests, or stops it. The broker's jars
# come through Maven from scripts/services/kafka/pom.xml (pinned) and are
# kept in .cache/kafka-VERSION for the next run.
#
#   scripts/services/kafka.sh start DIR   # prints the variables to export
#   scripts/services/kafka.sh stop DIR
set -euo pipefail
cd "$(dirname "$0")/../.."

cmd=${1:?start or stop}
dir=${2:?a working directory}
pom=scripts/services/kafka/pom.xml
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
lib=.cache/kafka-$version/lib

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Java and Maven come from the system's packages when the machine lacks them.
need_tools() {
    command -v java >/dev/null || scripts/apt-install.sh openjdk-17-jre-headless
    command -v mvn >/dev/null || scripts/apt-install.sh maven
}

fetch_jars() {
    if cmp -s "$pom" "$lib/.pom" 2>/dev/null; then
        return
    fi
    echo "fetching Apache Kafka $version through Maven" >&2
    rm -rf "$lib"
    mvn -q -B -f "$pom" dependency:copy-dependencies \
        -DoutputDirectory="$PWD/$lib" -DincludeScope=runtime >&2
    cp "$pom" "$lib/.pom"
}

case "$cmd" in
start)
    need_tools
    fetch_jars
    home=$dir/kafka
    mkdir -p "$home/data"
    port=$(free_port)
    controller_port=$(free_port)
    sasl_port=$(free_port)
    # A listener for a test's proxy: clients reach the broker through the
    # proxy's port, which this listener advertises, and the proxy forwards
    # to the listener's own port.
    proxied_port=$(free_port)
    proxy_port=$(free_port)
    cat >"$home/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port,SASL_PLAINTEXT://127.0.0.1:$sasl_port,PROXIED://127.0.0.1:$proxied_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_PLAINTEXT://127.0.0.1:$sasl_port,PROXIED://127.0.0.1:$proxy_port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,PROXIED:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_weir="weir-secret";
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
log.dirs=$home/data
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
group.initial.rebalance.delay.ms=0
log.flush.interval.messages=9223372036854775807
PROPS
    cat >"$home/log4j2.properties" <<PROPS
rootLogger.level=WARN
rootLogger.appenderRef.file.ref=file
appender.file.type=File
appender.file.name=file
appender.file.fileName=$home/server.log
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
PROPS
    java=(java -Xms128m -Xmx512m -XX:+UseSerialGC
        -Dlog4j2.configurationFile="$home/log4j2.properties" -cp "$PWD/$lib/*")
    cluster=$("${java[@]}" kafka.tools.StorageTool random-uuid 2>/dev/null)
    # A SASL listener beside the plain one: user weir, password weir-secret,
    # for PLAIN and both SCRAM mechanisms.
    "${java[@]}" kafka.tools.StorageTool format -t "$cluster" \
        -c "$home/server.properties" \
        --add-scram 'SCRAM-SHA-256=[name=weir,password=weir-secret]' \
        --add-scram 'SCRAM-SHA-512=[name=weir,password=weir-secret]' \
        >"$home/format.log" 2>&1 || {
        echo "formatting Kafka's storage failed:" >&2
        cat "$home/format.log" >&2
        exit 1
    }
    "${java[@]}" kafka.Kafka "$home/server.properties" >"$home/stdout.log" 2>&1 &
    echo $! >"$dir/kafka.pid"
    listening() {
        python3 -c "import socket,sys; s=socket.socket(); s.settimeout(0.5); sys.exit(s.connect_ex(('127.0.0.1', $port)))"
    }
    for _ in $(seq 1 300); do
        listening && break
        kill -0 "$(cat "$dir/kafka.pid")" 2>/dev/null || break
        sleep 0.2
    done
    if ! listening; then
        echo "Kafka did not start; its logs:" >&2
        tail -20 "$home/stdout.log" "$home/server.log" >&2 || true
        exit 1
    fi
    echo "export WEIR_TEST_KAFKA_BOOTSTRAP=127.0.0.1:$port"
    echo "export WEIR_TEST_KAFKA_SASL_BOOTSTRAP=127.0.0.1:$sasl_port"
    echo "export WEIR_TEST_KAFKA_PROXIED=127.0.0.1:$proxied_port"
    echo "export WEIR_TEST_KAFKA_PROXY=127.0.0.1:$proxy_port"
    ;;
stop)
    if [ -f "$dir/kafka.pid" ]; then
        pid=$(cat "$dir/kafka.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$dir/kafka.pid"
    fi
    ;;
*)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
