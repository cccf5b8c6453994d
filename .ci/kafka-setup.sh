#!/usr/bin/env bash
# Install what the real-broker Kafka tests need and resolve the Apache Kafka broker jars from Maven
# Central (tools/kafka/pom.xml) into tools/kafka/lib. Safe to rerun: a resolved lib is reused, and
# Maven keeps its download cache in ~/.m2 for fresh clones on the same machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[kafka-setup] apt-get install ${need_apt[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ "${java_major:-0}" -lt 17 ]; then
  echo "[kafka-setup] Kafka 4 needs Java >= 17, found ${java_major:-none}" >&2
  exit 1
fi

lib=tools/kafka/lib
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' tools/kafka/pom.xml)
if [ ! -f "$lib/kafka_2.13-$version.jar" ]; then
  echo "[kafka-setup] resolving org.apache.kafka:kafka_2.13:$version into $lib"
  rm -rf "$lib"
  mvn -q -B -f tools/kafka/pom.xml dependency:copy-dependencies
fi
test -f "$lib/kafka_2.13-$version.jar" || { echo "[kafka-setup] broker jar missing after resolve" >&2; exit 1; }
echo "[kafka-setup] broker jars ready: $(ls "$lib" | wc -l) files in $lib"
