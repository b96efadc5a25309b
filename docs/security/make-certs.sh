#!/bin/sh
# A private certificate authority and one certificate per Istos role, for Zenoh TLS with mutual TLS.
#
#   docs/security/make-certs.sh OUTDIR [ROLE ...]      (default roles: router worker producer)
#
# Writes OUTDIR/ca.pem + ca.key (kept if they already exist, so roles can be added later) and, for
# each ROLE, OUTDIR/ROLE.pem + ROLE.key. The certificate's common name is the role name: that is
# what the router's access-control rules match (`cert_common_names`). Every certificate is valid
# for both TLS server and client use and carries the subject alternative names in $SAN (default
# "DNS:localhost,IP:127.0.0.1"); set SAN to the names and addresses clients use to reach the
# router, e.g. SAN="DNS:<router-host>,IP:<router-ip>". DAYS (default 365) sets the lifetime.
# Keep ca.key offline: whoever holds it can mint certificates the mesh trusts.
set -eu

if [ "$#" -lt 1 ]; then
    echo "usage: $0 OUTDIR [ROLE ...]" >&2
    exit 2
fi
out=$1
shift
[ "$#" -gt 0 ] || set -- router worker producer
SAN=${SAN:-DNS:localhost,IP:127.0.0.1}
DAYS=${DAYS:-365}
mkdir -p "$out"
umask 077  # private keys readable by the owner only

if [ ! -f "$out/ca.pem" ]; then
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$out/ca.key"
    openssl req -x509 -new -key "$out/ca.key" -sha256 -days "$DAYS" -subj "/CN=istos-ca" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$out/ca.pem"
fi

ext="$out/.leaf.ext"
cat > "$ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$SAN
EXT
for role in "$@"; do
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$out/$role.key"
    openssl req -new -key "$out/$role.key" -subj "/CN=$role" -out "$out/$role.csr"
    openssl x509 -req -in "$out/$role.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
        -CAcreateserial -sha256 -days "$DAYS" -extfile "$ext" -out "$out/$role.pem"
    rm -f "$out/$role.csr"
done
rm -f "$ext"
chmod 644 "$out"/*.pem
