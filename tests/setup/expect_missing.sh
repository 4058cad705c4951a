#!/bin/sh
# Usage: expect_missing.sh PKG... -- CHECK_COMMAND...
# Proves that scripts/check_setup_packages.py can fail: runs CHECK_COMMAND once per PKG with
# PKG dropped from setup.sh's list (--without PKG), and passes only when every run exits 1
# and names PKG on a "missing PKG: ..." line. (ctest's PASS_REGULAR_EXPRESSION alone would
# ignore the exit status.)
set -u
pkgs=""
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do pkgs="$pkgs $1"; shift; done
[ "$#" -gt 1 ] || { echo "usage: $0 PKG... -- CHECK_COMMAND..." >&2; exit 2; }
shift
status=0
for pkg in $pkgs; do
  echo "== without $pkg"
  out=$("$@" --without "$pkg" 2>&1)
  rc=$?
  printf '%s\n' "$out"
  if [ "$rc" -ne 1 ] || ! printf '%s\n' "$out" | grep -qF "missing $pkg: "; then
    echo "expect_missing: without $pkg the check exited $rc; expected 1 and 'missing $pkg: ...'"
    status=1
  fi
done
exit "$status"
