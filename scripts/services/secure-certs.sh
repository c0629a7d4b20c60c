#!/usr/bin/env bash
# Test-time TLS material for the secure service instances (kafka.sh,
# redis.sh, cassandra.sh --secure). Made with openssl + keytool; nothing
# is checked in.
#
#   scripts/services/secure-certs.sh up      create what is missing or stale (idempotent)
#   scripts/services/secure-certs.sh status  one line; exit 0 if the set is complete and valid
#   scripts/services/secure-certs.sh reset   delete the set (next `up` makes a new CA)
#   scripts/services/secure-certs.sh env     print `export` lines (paths, store password)
#
# Output in ${READFOLD_SERVICES_HOME:-~/.cache/readfold-services}/secure/certs:
#   ca.pem  ca.key              test CA (clients trust ca.pem)
#   server.pem  server.key      leaf, CN=localhost, SAN DNS:localhost,IP:127.0.0.1 (PEM; Redis)
#   server-chain.pem            leaf + CA
#   server.keystore.p12 / .jks  key + chain, alias "server"        (Kafka, Cassandra)
#   truststore.p12 / .jks       CA as trusted entry, alias "ca"     (Java clients/servers)
#   store.pass                  password of the key/trust stores and of the key in them
#
# Environment: READFOLD_SECURE_STORE_PASSWORD (default rf-store-secret-3K),
#   READFOLD_SECURE_CERT_DAYS (leaf validity, default 825), READFOLD_SECURE_CA_DAYS (3650).
# A leaf that expires within 7 days, no longer verifies against ca.pem, or
# whose store password differs from the requested one is re-issued (the CA is
# kept unless it is missing or expires within 30 days).
set -euo pipefail

export SVC_NAME=secure-certs
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

CERTS="$STATE/secure/certs"
STORE_PASS="${READFOLD_SECURE_STORE_PASSWORD:-rf-store-secret-3K}"
LEAF_DAYS="${READFOLD_SECURE_CERT_DAYS:-825}"
CA_DAYS="${READFOLD_SECURE_CA_DAYS:-3650}"
CN=localhost
SAN="DNS:localhost,IP:127.0.0.1"
FILES=(ca.pem ca.key server.pem server.key server-chain.pem
       server.keystore.p12 server.keystore.jks truststore.p12 truststore.jks store.pass)

ensure_tools() {
  command -v openssl >/dev/null 2>&1 || die "openssl not found (apt-get install openssl)"
  command -v keytool >/dev/null 2>&1 || die "keytool not found (apt-get install default-jre-headless)"
}

take_lock() {  # serialise against the other secure scripts running `up` at the same time
  mkdir -p "$CERTS"
  exec 8>"$CERTS/.lock"
  flock -w 120 8 || die "could not lock $CERTS/.lock within 120s"
}

ca_ok() {
  [[ -s "$CERTS/ca.pem" && -s "$CERTS/ca.key" ]] || return 1
  openssl x509 -in "$CERTS/ca.pem" -noout -checkend $((30 * 86400)) >/dev/null 2>&1 || return 1
  # key matches cert
  [[ "$(openssl x509 -in "$CERTS/ca.pem" -noout -pubkey 2>/dev/null)" == \
     "$(openssl pkey -in "$CERTS/ca.key" -pubout 2>/dev/null)" ]]
}

# complete: every file there, leaf valid >7 days, chains to ca.pem, stores open with STORE_PASS.
complete() {
  local f
  for f in "${FILES[@]}"; do [[ -s "$CERTS/$f" ]] || return 1; done
  [[ "$(cat "$CERTS/store.pass")" == "$STORE_PASS" ]] || return 1
  openssl x509 -in "$CERTS/server.pem" -noout -checkend $((7 * 86400)) >/dev/null 2>&1 || return 1
  openssl verify -CAfile "$CERTS/ca.pem" "$CERTS/server.pem" >/dev/null 2>&1 || return 1
  keytool -list -keystore "$CERTS/server.keystore.p12" -storetype PKCS12 -storepass "$STORE_PASS" -alias server >/dev/null 2>&1 || return 1
  keytool -list -keystore "$CERTS/truststore.jks" -storetype JKS -storepass "$STORE_PASS" -alias ca >/dev/null 2>&1 || return 1
}

make_ca() {
  local tmp="$1"
  log "creating test CA ($CERTS/ca.pem, ${CA_DAYS} days)"
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$CA_DAYS" \
    -keyout "$tmp/ca.key" -out "$tmp/ca.pem" \
    -subj "/O=readfold tests/CN=readfold test CA" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" >/dev/null 2>&1 || die "openssl could not create the CA"
}

make_leaf() {
  local tmp="$1" ca_dir="$2"
  log "issuing server certificate CN=$CN, SAN $SAN (${LEAF_DAYS} days)"
  openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$tmp/server.key" -out "$tmp/server.csr" \
    -subj "/O=readfold tests/CN=$CN" >/dev/null 2>&1 || die "openssl could not create the server key/CSR"
  cat >"$tmp/leaf.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$SAN
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EOF
  openssl x509 -req -in "$tmp/server.csr" -CA "$ca_dir/ca.pem" -CAkey "$ca_dir/ca.key" \
    -CAcreateserial -CAserial "$tmp/ca.srl" -days "$LEAF_DAYS" -sha256 \
    -extfile "$tmp/leaf.ext" -out "$tmp/server.pem" >/dev/null 2>&1 || die "openssl could not sign the server certificate"
  cat "$tmp/server.pem" "$ca_dir/ca.pem" >"$tmp/server-chain.pem"

  # Keystores: PKCS12 from openssl, JKS converted by keytool (same password for store and key).
  openssl pkcs12 -export -name server -inkey "$tmp/server.key" -in "$tmp/server.pem" \
    -certfile "$ca_dir/ca.pem" -out "$tmp/server.keystore.p12" -passout "pass:$STORE_PASS" \
    >/dev/null 2>&1 || die "openssl could not write server.keystore.p12"
  keytool -importkeystore -noprompt \
    -srckeystore "$tmp/server.keystore.p12" -srcstoretype PKCS12 -srcstorepass "$STORE_PASS" \
    -destkeystore "$tmp/server.keystore.jks" -deststoretype JKS \
    -deststorepass "$STORE_PASS" -destkeypass "$STORE_PASS" >/dev/null 2>&1 \
    || die "keytool could not write server.keystore.jks"
  # Truststores via keytool: an openssl-made PKCS12 holding only a certificate
  # is not a *trusted* entry for Java.
  local t
  for t in PKCS12:p12 JKS:jks; do
    keytool -importcert -noprompt -alias ca -file "$ca_dir/ca.pem" \
      -keystore "$tmp/truststore.${t#*:}" -storetype "${t%%:*}" -storepass "$STORE_PASS" \
      >/dev/null 2>&1 || die "keytool could not write truststore.${t#*:}"
  done
  printf '%s\n' "$STORE_PASS" >"$tmp/store.pass"
}

cmd_up() {
  ensure_tools
  take_lock
  if complete; then
    log "certificates present in $CERTS (CA + CN=$CN, expires $(openssl x509 -in "$CERTS/server.pem" -noout -enddate | cut -d= -f2))"
    return 0
  fi
  local tmp
  tmp="$(mktemp -d "$CERTS/.new.XXXXXX")"
  chmod 700 "$tmp"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  local ca_dir="$CERTS"
  if ! ca_ok; then
    make_ca "$tmp"
    ca_dir="$tmp"
    if [[ -e "$CERTS/ca.pem" ]]; then
      warn "replacing the CA: restart running secure services (their certificates no longer chain to ca.pem)"
    fi
  fi
  make_leaf "$tmp" "$ca_dir"
  rm -f "$tmp"/*.csr "$tmp"/*.ext "$tmp"/*.srl
  chmod 600 "$tmp"/*.key "$tmp"/*.p12 "$tmp"/*.jks "$tmp/store.pass"
  chmod 644 "$tmp"/*.pem
  # Each file is replaced by rename; readers see the old or the new one.
  local f
  for f in "$tmp"/*; do mv -f "$f" "$CERTS/"; done
  complete || die "certificate set in $CERTS is still incomplete after generation"
  log "certificates ready in $CERTS"
}

cmd_status() {
  if complete; then
    printf 'secure-certs: ok (%s, CN=%s, expires %s)\n' "$CERTS" "$CN" \
      "$(openssl x509 -in "$CERTS/server.pem" -noout -enddate | cut -d= -f2)"
    return 0
  fi
  printf 'secure-certs: missing or stale (%s)\n' "$CERTS"
  return 1
}

cmd_reset() {
  take_lock
  rm -rf "${CERTS:?}"/*
  log "removed $CERTS/*"
}

cmd_env() {
  cat <<EOF
export READFOLD_SECURE_CERTS='$CERTS'
export READFOLD_SECURE_CA_PEM='$CERTS/ca.pem'
export READFOLD_SECURE_TRUSTSTORE='$CERTS/truststore.p12'
export READFOLD_SECURE_STORE_PASSWORD='$STORE_PASS'
EOF
}

case "${1:-}" in
  up) cmd_up ;;
  down) log "nothing to stop (use reset to delete the certificates)" ;;
  status) cmd_status ;;
  reset) cmd_reset ;;
  env) cmd_env ;;
  *) service_usage "$0" "|reset|env"; exit 2 ;;
esac
