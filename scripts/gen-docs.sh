#!/usr/bin/env bash
# Copy the dialect and pass docs generated from ODS into docs/generated.
#   scripts/gen-docs.sh [BUILD_DIR]          refresh the committed copies
#   scripts/gen-docs.sh --check [BUILD_DIR]  fail if they are out of date
set -euo pipefail
check=0
if [[ "${1:-}" == "--check" ]]; then check=1; shift; fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
src=$build/docs
dst=$root/docs/generated
if [[ ! -d "$src" ]]; then
  echo "gen-docs: $src does not exist; build the project first" >&2
  exit 1
fi
if (( check )); then
  if ! diff -ru "$dst" "$src"; then
    echo "gen-docs: docs/generated is out of date; run scripts/gen-docs.sh" >&2
    exit 1
  fi
  echo "gen-docs: docs/generated is up to date"
else
  rm -rf "$dst"
  mkdir -p "$dst"
  cp -r "$src"/. "$dst"/
  echo "gen-docs: refreshed $dst"
fi
