#!/usr/bin/env bash
# Makes a private certificate authority and a server certificate signed by
# it, for running a coordinator on a private network or in tests:
#   deploy/make-cert.sh OUTDIR [HOST ...]
# writes OUTDIR/ca.pem (give it to peers: --cacert), OUTDIR/server.pem and
# OUTDIR/server.key (give them to the coordinator). Hosts default to
# 127.0.0.1 and localhost; each becomes a subjectAltName.
set -euo pipefail
out=${1:?usage: make-cert.sh OUTDIR [HOST ...]}
shift || true
hosts=("$@")
[ "${#hosts[@]}" -gt 0 ] || hosts=(127.0.0.1 localhost)

san=""
for h in "${hosts[@]}"; do
  if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then san+="IP:$h,"; else san+="DNS:$h,"; fi
done
san=${san%,}

mkdir -p "$out"
umask 077
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
  -subj "/CN=volley test CA" -keyout "$out/ca.key" -out "$out/ca.pem" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
  2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj "/CN=${hosts[0]}" -keyout "$out/server.key" -out "$out/server.csr" 2>/dev/null
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$san" \
  > "$out/server.ext"
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
  -CAcreateserial -days 30 -extfile "$out/server.ext" -out "$out/server.pem" 2>/dev/null
rm -f "$out/server.csr" "$out/server.ext" "$out/ca.srl"
chmod 644 "$out/ca.pem" "$out/server.pem"
# umask 077 made them so; said again so that it never depends on openssl.
chmod 600 "$out/ca.key" "$out/server.key"
echo "make-cert: CA $out/ca.pem, server cert $out/server.pem for ${hosts[*]}"
