#!/bin/sh
# Reports the line and branch coverage of muon's public headers from the gcov counters that
# `make coverage` left in DIR: an HTML page (DIR/html/index.html), then one closing line per
# header in a fixed form:
#   coverage muon.h lines 97.3% branches 86.1%
# Usage: tools/coverage.sh DIR header...
# Branches the compiler adds for C++ exceptions (the Gloo shim) and ones it proves unreachable
# are not counted. Lines between GCOVR_EXCL_START / GCOVR_EXCL_STOP (or marked GCOVR_EXCL_LINE)
# are left out, each with its reason beside the marker; their count is printed per header.
set -e
dir=$1; shift
command -v gcovr >/dev/null 2>&1 || { echo "coverage: gcovr not found (make coverage installs it)"; exit 1; }
mkdir -p "$dir/html"
# Objects compiled here but never run (the GPU-only links) have notes and no counters: gcov would
# fail on them, and their lines are not this machine's to cover.
find "$dir" -name '*.gcno' | while read -r f; do [ -f "${f%.gcno}.gcda" ] || rm -f "$f"; done
filters=""
for h in "$@"; do filters="$filters --filter $(printf '%s' "$h" | sed 's/\./\\./g')\$"; done
# No -j: parallel gcov runs would write the same muon.h##<hash>.gcov in the working directory.
# shellcheck disable=SC2086
gcovr --root . $filters --exclude-unreachable-branches --exclude-throw-branches \
      --html-details "$dir/html/index.html" --json-summary "$dir/summary.json" \
      --gcov-ignore-parse-errors "$dir" >"$dir/gcovr.log" 2>&1 || { cat "$dir/gcovr.log"; exit 1; }
echo "coverage: HTML report in $dir/html/index.html"

report() { # report WHAT HEADER: WHAT is detail or line
  excl=$(grep -c 'GCOVR_EXCL_LINE' "$2" || true)
  blocks=$(awk '/GCOVR_EXCL_START/{on=1; next} /GCOVR_EXCL_STOP/{on=0} on{n++} END{print n+0}' "$2")
  python3 -c '
import json, sys
summary, what, header, excluded = sys.argv[1:5]
for f in json.load(open(summary))["files"]:
    if f["filename"] == header:
        if what == "detail":
            print("  %s: %d of %d lines, %d of %d branches; %s lines excluded by a marker"
                  % (header, f["line_covered"], f["line_total"], f["branch_covered"],
                     f["branch_total"], excluded))
        else:
            print("coverage %s lines %.1f%% branches %.1f%%"
                  % (header, f["line_percent"], f["branch_percent"]))
        break
else:
    print("coverage %s: no counters (nothing that includes it ran)" % header)
' "$dir/summary.json" "$1" "$2" "$((excl + blocks))"
}
for h in "$@"; do report detail "$h"; done
for h in "$@"; do report line "$h"; done
