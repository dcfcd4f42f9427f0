#!/usr/bin/env bash
# Copies into LIBDIR every shared library that ldd resolves for the given
# programs (the dynamic loader included, as ld-linux-x86-64.so.2), under the
# name the programs ask for, except those whose name matches the extended
# regular expression LEAVE (the libraries the target machine provides).
# Files that are not ELF are passed over. Used by deploy/gpu-bundle.sh and
# deploy/peer-bundle.sh.
#   bundle-libs.sh LIBDIR LEAVE PROGRAM...
set -euo pipefail
lib=${1:?usage: bundle-libs.sh LIBDIR LEAVE PROGRAM...}
leave=${2:?usage: bundle-libs.sh LIBDIR LEAVE PROGRAM...}
shift 2
mkdir -p "$lib"
for f in "$@"; do
  head -c 4 "$f" | grep -q ELF || continue
  # "name => /path (addr)" for a library, "/path (addr)" for the loader.
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }
                  $1 ~ /^\// && $2 ~ /^\(/ { n = split($1, p, "/"); print p[n], $1 }'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $leave ]]; then continue; fi
  cp -L "$path" "$lib/$name"
done
