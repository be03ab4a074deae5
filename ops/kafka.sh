#!/usr/bin/env bash
# ops/kafka.sh -- a real single-node Apache Kafka broker (KRaft, broker and
# controller in one JVM, loopback only) for the tests and the demo.
#
#   ops/kafka.sh fetch                    fetch the broker jars (cached)
#   ops/kafka.sh start [DIR]              start a fresh broker, print host:port
#   ops/kafka.sh stop [DIR] [--clean]     stop it (--clean also removes DIR)
#   ops/kafka.sh restart [DIR]            stop it if it runs, then start it
#                                         again on the SAME ports with its data
#                                         kept (topics, offsets, transactions)
#   ops/kafka.sh status [DIR]             running or not (exit 0 / 1)
#   ops/kafka.sh topic create NAME PARTITIONS [DIR]
#   ops/kafka.sh --help
#
# DIR defaults to $D3_KAFKA_DIR, else build/_kafka under the repository root;
# for stop, restart, status and topic, to the DIR of the last `start` while that
# broker still runs. `start` writes DIR/server.properties, DIR/data (formatted
# anew each start), DIR/broker.log, DIR/bootstrap (host:port) and DIR/pid.
# `restart` reuses DIR/server.properties and DIR/data as they are (a test
# that stops its own broker mid-run and brings it back: `stop DIR`, wait,
# `restart DIR`); it fails when another process took the port meanwhile.
#
# The jars are org.apache.kafka:kafka_2.13 and its runtime dependencies from
# Maven Central (mvn dependency:copy-dependencies), plus kafka-tools for the
# topic command and slf4j-reload4j for readable logs, cached in
# $D3_KAFKA_CACHE, else build/_fetch/kafka-<version>. Needs java 17+ and mvn
# (ops/setup-deps.sh installs both when missing).
set -euo pipefail

KAFKA_VERSION="3.9.2" # newest 3.9.x; 3.9 is the safest with librdkafka 2.0.2
SCALA_VERSION="2.13"
SLF4J_VERSION="1.7.36" # the slf4j that Kafka 3.9 itself uses
# SHA-1 of kafka_2.13-3.9.2.jar, as Maven Central's .sha1 file gives it.
KAFKA_JAR_SHA1="a671d4c2c65740d4a564687d9313ca50be6c10e5"
START_TIMEOUT_S=60
STOP_TIMEOUT_S=30

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${D3_KAFKA_CACHE:-$ROOT/build/_fetch/kafka-$KAFKA_VERSION}"
M2_REPO="${D3_MAVEN_REPO:-$HOME/.m2/repository}"
KAFKA_JAR="kafka_$SCALA_VERSION-$KAFKA_VERSION.jar"
LAST_DIR_FILE="$ROOT/build/.kafka-last-dir" # the DIR of the last `start`

usage() {
    # the header comment, whatever its length
    awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"
}

die() {
    echo "kafka.sh: error: $*" >&2
    exit 1
}

log() {
    echo "kafka.sh: $*" >&2
}

now_ms() {
    date +%s%3N
}

# ---------------------------------------------------------------- java, fetch

require_java() {
    command -v java >/dev/null 2>&1 || die "java is not installed (run ops/setup-deps.sh)"
    local line major minor
    line="$(java -version 2>&1 | head -n 1)"
    read -r major minor <<<"$(sed -E 's/.*version "([0-9]+)(\.([0-9]+))?.*/\1 \3/' <<<"$line")"
    [ "$major" = "1" ] && major="$minor" # "1.8.0" is Java 8
    if ! [[ "$major" =~ ^[0-9]+$ ]] || [ "$major" -lt 17 ]; then
        die "Kafka $KAFKA_VERSION needs java 17 or newer; found: $line"
    fi
}

write_pom() {
    cat >"$CACHE/pom.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by ops/kafka.sh: the broker's jars, fetched with
     mvn dependency:copy-dependencies -DincludeScope=runtime. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>d3stream</groupId>
  <artifactId>kafka-broker-jars</artifactId>
  <version>$KAFKA_VERSION</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_$SCALA_VERSION</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <!-- org.apache.kafka.tools.TopicCommand; Connect is not needed for it. -->
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka-tools</artifactId>
      <version>$KAFKA_VERSION</version>
      <exclusions>
        <exclusion><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId></exclusion>
        <exclusion><groupId>com.fasterxml.jackson.jaxrs</groupId><artifactId>*</artifactId></exclusion>
      </exclusions>
    </dependency>
    <!-- The logging backend is not a runtime dependency of the broker. -->
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-reload4j</artifactId>
      <version>$SLF4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
}

sha1_of() {
    sha1sum "$1" | cut -d' ' -f1
}

# The kafka jar in libs/ must match both the pinned SHA-1 and the .sha1 file
# that Maven fetched from Central beside it.
verify_kafka_jar() {
    local jar="$CACHE/libs/$KAFKA_JAR" got
    [ -f "$jar" ] || return 1
    got="$(sha1_of "$jar")"
    if [ "$got" != "$KAFKA_JAR_SHA1" ]; then
        log "SHA-1 MISMATCH for $jar: got $got, pinned $KAFKA_JAR_SHA1"
        return 1
    fi
}

cmd_fetch() {
    local marker="$CACHE/.fetched" t0 m2sha
    if [ -f "$marker" ] && [ "$(cat "$marker")" = "$KAFKA_VERSION" ] && verify_kafka_jar; then
        log "Kafka $KAFKA_VERSION jars up to date in $CACHE"
        return 0
    fi
    command -v mvn >/dev/null 2>&1 || die "mvn is not installed (run ops/setup-deps.sh)"
    t0="$(now_ms)"
    mkdir -p "$CACHE"
    rm -rf "$CACHE/libs" "$marker"
    write_pom
    log "fetching org.apache.kafka:kafka_$SCALA_VERSION:$KAFKA_VERSION and its runtime dependencies"
    # -C: fail on any checksum mismatch against Central's .sha1 files.
    if ! mvn -B -q -C -f "$CACHE/pom.xml" -Dmaven.repo.local="$M2_REPO" \
        dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$CACHE/libs" >"$CACHE/mvn.log" 2>&1; then
        tail -n 30 "$CACHE/mvn.log" >&2
        die "mvn dependency:copy-dependencies failed (log: $CACHE/mvn.log)"
    fi
    m2sha="$M2_REPO/org/apache/kafka/kafka_$SCALA_VERSION/$KAFKA_VERSION/$KAFKA_JAR.sha1"
    [ -f "$m2sha" ] || die "Maven left no $m2sha to check the jar against"
    if [ "$(cut -c1-40 "$m2sha")" != "$(sha1_of "$CACHE/libs/$KAFKA_JAR")" ]; then
        die "SHA-1 MISMATCH: $CACHE/libs/$KAFKA_JAR does not match $m2sha"
    fi
    verify_kafka_jar || die "refusing to use $CACHE/libs/$KAFKA_JAR"
    echo "$KAFKA_VERSION" >"$marker"
    log "fetched $(find "$CACHE/libs" -name '*.jar' | wc -l) jars" \
        "($(du -sh "$CACHE/libs" | cut -f1)) in $(($(now_ms) - t0)) ms to $CACHE/libs"
}

# ---------------------------------------------------------------- broker

# A port nobody listens on, below Linux's ephemeral range (32768+) so that
# outgoing connections do not take it meanwhile.
free_port() {
    local p i
    for i in $(seq 1 200); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
        [ "$p" = "${1:-}" ] && continue
        if command -v ss >/dev/null 2>&1 && [ -n "$(ss -Htln "sport = :$p" 2>/dev/null)" ]; then
            continue
        fi
        if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            continue
        fi
        echo "$p"
        return 0
    done
    die "no free loopback port found after $i tries"
}

# Is $1 the pid of the broker started from directory $2?
is_our_broker() {
    local pid="$1" dir="$2"
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "kafka.Kafka $dir/server.properties"
}

broker_pid() { # <dir>: prints the pid when the broker runs
    local dir="$1" pid
    [ -f "$dir/pid" ] || return 1
    pid="$(cat "$dir/pid")"
    is_our_broker "$pid" "$dir" || return 1
    echo "$pid"
}

# The DIR that stop, status and topic use when given none.
running_dir() {
    local last
    if [ -n "${D3_KAFKA_DIR:-}" ]; then
        echo "$D3_KAFKA_DIR"
        return
    fi
    if [ -f "$LAST_DIR_FILE" ]; then
        last="$(cat "$LAST_DIR_FILE")"
        if broker_pid "$last" >/dev/null; then
            echo "$last"
            return
        fi
    fi
    echo "$ROOT/build/_kafka"
}

write_configs() { # <dir> <port> <controller port>
    local dir="$1" port="$2" cport="$3"
    cat >"$dir/server.properties" <<EOF
# Written by ops/kafka.sh: one KRaft node, broker and controller, loopback.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
# One node: every internal topic has one replica.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
# Tests: no wait for more members before the first rebalance.
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
log.retention.hours=24
EOF
    cat >"$dir/log4j.properties" <<'EOF'
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.org.apache.kafka.clients=WARN
EOF
    cat >"$dir/tools-log4j.properties" <<'EOF'
log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
}

# A metadata request that lists broker 1 is the readiness test (kcat when
# installed, else the listener plus the broker's own "started" log line).
broker_answers() { # <port> <dir>
    local port="$1" dir="$2"
    if command -v kcat >/dev/null 2>&1; then
        kcat -L -b "127.0.0.1:$port" -m 3 2>/dev/null | grep -q "broker 1 at"
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null &&
            grep -q "Kafka Server started" "$dir/broker.log"
    fi
}

launch() { # <dir> <port> <controller port>; as run_broker
    local dir="$1" port="$2" cport="$3" cid
    rm -rf "$dir/data"
    write_configs "$dir" "$port" "$cport"
    cid="$(java -cp "$CACHE/libs/*" -Dlog4j.configuration="file:$dir/tools-log4j.properties" \
        kafka.tools.StorageTool random-uuid)"
    java -cp "$CACHE/libs/*" -Dlog4j.configuration="file:$dir/tools-log4j.properties" \
        kafka.tools.StorageTool format -t "$cid" -c "$dir/server.properties" >"$dir/format.log" 2>&1 ||
        {
            cat "$dir/format.log" >&2
            die "kafka.tools.StorageTool format failed"
        }
    : >"$dir/broker.log"
    run_broker "$dir" "$port"
}

# Starts the JVM on DIR's existing configuration and data and waits until it
# answers on port; 0 ready, 2 port taken, 1 or 3 failed (the JVM stopped).
run_broker() { # <dir> <port>
    local dir="$1" port="$2" pid rc
    # setsid: the broker leaves the caller's process group, so a Ctrl-C meant
    # for a test run reaches it only through that run's `kafka.sh stop`.
    setsid java -Xms256m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true \
        -Dlog4j.configuration="file:$dir/log4j.properties" -Dkafka.logs.dir="$dir/logs" \
        -cp "$CACHE/libs/*" kafka.Kafka "$dir/server.properties" \
        </dev/null >>"$dir/broker.log" 2>&1 &
    pid=$!
    echo "$pid" >"$dir/pid"
    # setsid also keeps a Ctrl-C during the wait below from reaching the JVM:
    # a start cut short stops the broker it began, or it would run on with a
    # pid file and no bootstrap file for the next start to find.
    trap 'kill -KILL "$pid" 2>/dev/null; rm -f "$dir/pid"; exit 130' INT TERM HUP
    rc=0
    await_broker "$dir" "$port" "$pid" || rc=$?
    trap - INT TERM HUP
    if [ "$rc" -eq 1 ]; then
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$dir/pid"
    fi
    return "$rc"
}

# Waits until the broker PID started from DIR answers on PORT and writes
# DIR/bootstrap; 0 ready, 1 not within START_TIMEOUT_S (still running),
# 2 exited on a taken port, 3 exited otherwise.
await_broker() { # <dir> <port> <pid>
    local dir="$1" port="$2" pid="$3" deadline
    deadline=$(($(date +%s) + START_TIMEOUT_S))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$dir/pid"
            grep -q "Address already in use" "$dir/broker.log" && return 2
            return 3
        fi
        if broker_answers "$port" "$dir"; then
            echo "127.0.0.1:$port" >"$dir/bootstrap"
            return 0
        fi
        sleep 0.5
    done
    return 1
}

cmd_start() { # [dir]
    local dir="${1:-${D3_KAFKA_DIR:-$ROOT/build/_kafka}}" pid port cport try rc t0
    require_java
    cmd_fetch
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    if pid="$(broker_pid "$dir")"; then
        log "a broker already runs from $dir (pid $pid)"
        if [ ! -s "$dir/bootstrap" ]; then
            # Started by a run that was killed before the broker answered:
            # wait for it as that run would have.
            port="$(listener_port "$dir" PLAINTEXT)"
            rc=0
            await_broker "$dir" "$port" "$pid" || rc=$?
            [ "$rc" -eq 0 ] ||
                die "the broker from $dir (pid $pid) does not answer on port $port;" \
                    "ops/kafka.sh stop $dir stops it"
        fi
        echo "$dir" >"$LAST_DIR_FILE"
        cat "$dir/bootstrap"
        return 0
    fi
    rm -f "$dir/bootstrap" "$dir/pid"
    t0="$(now_ms)"
    for try in 1 2 3; do
        port="$(free_port)"
        cport="$(free_port "$port")"
        rc=0
        launch "$dir" "$port" "$cport" || rc=$?
        [ "$rc" -eq 2 ] && {
            log "port $port or $cport was taken meanwhile; try $try of 3"
            continue
        }
        break
    done
    if [ "$rc" -ne 0 ]; then
        echo "---- last lines of $dir/broker.log" >&2
        tail -n 40 "$dir/broker.log" >&2
        die "Kafka $KAFKA_VERSION did not answer a metadata request within ${START_TIMEOUT_S} s"
    fi
    mkdir -p "$(dirname "$LAST_DIR_FILE")"
    echo "$dir" >"$LAST_DIR_FILE"
    log "Kafka $KAFKA_VERSION ready at 127.0.0.1:$port (controller $cport, pid $(cat "$dir/pid"))" \
        "after $(($(now_ms) - t0)) ms; log: $dir/broker.log"
    cat "$dir/bootstrap"
}

# The port of listener NAME in DIR/server.properties.
listener_port() { # <dir> <PLAINTEXT|CONTROLLER>
    sed -n "s/^listeners=.*$2:\/\/[^,:]*:\([0-9]*\).*/\1/p" "$1/server.properties"
}

cmd_restart() { # [dir]
    local dir="${1:-$(running_dir)}" port t0 rc=0
    [ -d "$dir" ] || die "no broker directory $dir"
    dir="$(cd "$dir" && pwd)"
    [ -f "$dir/server.properties" ] && [ -f "$dir/data/meta.properties" ] ||
        die "$dir holds no formatted broker (ops/kafka.sh start $dir first)"
    require_java
    if broker_pid "$dir" >/dev/null; then
        cmd_stop "$dir"
    fi
    port="$(listener_port "$dir" PLAINTEXT)"
    [[ "$port" =~ ^[0-9]+$ ]] || die "no PLAINTEXT listener port in $dir/server.properties"
    rm -f "$dir/bootstrap" "$dir/pid"
    t0="$(now_ms)"
    # A fresh log: the readiness test without kcat looks for "started" in it.
    [ -f "$dir/broker.log" ] && mv -f "$dir/broker.log" "$dir/broker.log.1"
    : >"$dir/broker.log"
    run_broker "$dir" "$port" || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "---- last lines of $dir/broker.log" >&2
        tail -n 40 "$dir/broker.log" >&2
        [ "$rc" -eq 2 ] && die "port $port (or the controller's) is taken: cannot restart there"
        die "Kafka $KAFKA_VERSION did not come back within ${START_TIMEOUT_S} s"
    fi
    log "Kafka $KAFKA_VERSION back at 127.0.0.1:$port (pid $(cat "$dir/pid"), data kept)" \
        "after $(($(now_ms) - t0)) ms; log: $dir/broker.log"
    cat "$dir/bootstrap"
}

cmd_stop() { # [dir] [--clean]
    local dir="" clean=0 arg pid i
    for arg in "$@"; do
        case "$arg" in
        --clean) clean=1 ;;
        *) dir="$arg" ;;
        esac
    done
    dir="${dir:-$(running_dir)}"
    [ -d "$dir" ] || die "no broker directory $dir"
    dir="$(cd "$dir" && pwd)"
    if pid="$(broker_pid "$dir")"; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < STOP_TIMEOUT_S * 10; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "broker pid $pid still runs after ${STOP_TIMEOUT_S} s; SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        log "stopped the broker from $dir (pid $pid)"
    else
        log "no broker runs from $dir"
    fi
    rm -f "$dir/pid" "$dir/bootstrap"
    if [ "$clean" -eq 1 ]; then
        rm -rf "$dir"
    fi
}

cmd_status() { # [dir]
    local dir="${1:-$(running_dir)}" pid
    [ -d "$dir" ] && dir="$(cd "$dir" && pwd)"
    if pid="$(broker_pid "$dir")"; then
        echo "running: pid $pid, bootstrap $(cat "$dir/bootstrap" 2>/dev/null || echo '(not ready)'), dir $dir"
        return 0
    fi
    echo "not running (dir $dir)"
    return 1
}

cmd_topic() { # create NAME PARTITIONS [dir]
    if [ "${1:-}" != "create" ] || [ $# -lt 3 ] || [ $# -gt 4 ]; then
        die "usage: kafka.sh topic create NAME PARTITIONS [DIR]"
    fi
    local name="$2" parts="$3" dir="${4:-$(running_dir)}"
    [[ "$parts" =~ ^[1-9][0-9]*$ ]] || die "PARTITIONS must be a positive number, not \"$parts\""
    broker_pid "$dir" >/dev/null || die "no broker runs from $dir (ops/kafka.sh start $dir)"
    require_java
    java -cp "$CACHE/libs/*" -Dlog4j.configuration="file:$dir/tools-log4j.properties" \
        org.apache.kafka.tools.TopicCommand --bootstrap-server "$(cat "$dir/bootstrap")" \
        --create --topic "$name" --partitions "$parts" --replication-factor 1
}

case "${1:-}" in
fetch)
    shift
    [ $# -eq 0 ] || die "fetch takes no arguments"
    cmd_fetch
    ;;
start)
    shift
    [ $# -le 1 ] || die "usage: kafka.sh start [DIR]"
    cmd_start "$@"
    ;;
stop)
    shift
    [ $# -le 2 ] || die "usage: kafka.sh stop [DIR] [--clean]"
    cmd_stop "$@"
    ;;
restart)
    shift
    [ $# -le 1 ] || die "usage: kafka.sh restart [DIR]"
    cmd_restart "$@"
    ;;
status)
    shift
    [ $# -le 1 ] || die "usage: kafka.sh status [DIR]"
    cmd_status "$@"
    ;;
topic)
    shift
    cmd_topic "$@"
    ;;
-h | --help | help)
    usage
    ;;
*)
    usage >&2
    exit 2
    ;;
esac
