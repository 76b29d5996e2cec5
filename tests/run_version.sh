#!/bin/sh
# muon's version is written in three places that must agree: muon.h's MUON_VERSION_MAJOR/MINOR/
# PATCH and MUON_VERSION_STRING, tools/muon.pc.in's Version, and a CHANGES.md heading.
set -u
get() { sed -n "s/^#define MUON_VERSION_$1 *\(.*\)$/\1/p" muon.h | tr -d '"'; }
v="$(get MAJOR).$(get MINOR).$(get PATCH)"
bad=0
[ "$(get STRING)" = "$v" ] || { echo "FAIL MUON_VERSION_STRING '$(get STRING)' is not MAJOR.MINOR.PATCH = $v"; bad=1; }
grep -qx "Version: $v" tools/muon.pc.in || { echo "FAIL tools/muon.pc.in does not say 'Version: $v'"; bad=1; }
grep -q "^## $v\b" CHANGES.md || { echo "FAIL CHANGES.md has no '## $v' heading"; bad=1; }
echo "version $v: $((1 - bad)) passed, $bad failed"
[ "$bad" -eq 0 ]
