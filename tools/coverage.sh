#!/bin/sh
# Reports the line and branch coverage of muon's public headers from the gcov counters that
# `make coverage` left in DIR: an HTML page (DIR/html/index.html), then one closing line per
# header in a fixed form:
#   coverage muon.h lines 97.3% branches 86.1%
# Usage: tools/coverage.sh DIR header...
# Branches the compiler adds for C++ exceptions (the Gloo shim) and ones it proves unreachable
# are not counted. Lines count every build. Branches count the C builds: gcov numbers a line's
# branches per compiled object, and g++ lowers the same C into other branches than gcc, so merging
# the *_cxx builds (the C tests recompiled as C++) line by line would pair unrelated branches and
# leave those of a build that never ran a line uncovered beside the ones that did. The C++ builds'
# own branch figure is printed in the detail line. Lines between GCOVR_EXCL_START / GCOVR_EXCL_STOP (or marked GCOVR_EXCL_LINE)
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

# The same counters split by language: hide one side's notes and counters (renamed), summarise,
# put them back.
split_summary() { # split_summary OUT KEEP: KEEP is cxx (only *_cxx objects) or c (all others)
  if [ "$2" = c ]; then hide=$(find "$dir" -name '*_cxx*.gc*'); else hide=$(find "$dir" -name '*.gc[dn][ao]' ! -name '*_cxx*'); fi
  for f in $hide; do mv "$f" "$f.hidden"; done
  # shellcheck disable=SC2086
  rc=0
  gcovr --root . $filters --exclude-unreachable-branches --exclude-throw-branches \
        --json-summary "$1" --gcov-ignore-parse-errors "$dir" >>"$dir/gcovr.log" 2>&1 || rc=$?
  for f in $hide; do mv "$f.hidden" "$f"; done
  [ $rc -eq 0 ] || { cat "$dir/gcovr.log"; exit 1; }
}
split_summary "$dir/summary_c.json" c
split_summary "$dir/summary_cxx.json" cxx

report() { # report WHAT HEADER: WHAT is detail or line
  excl=$(grep -c 'GCOVR_EXCL_LINE' "$2" || true)
  blocks=$(awk '/GCOVR_EXCL_START/{on=1; next} /GCOVR_EXCL_STOP/{on=0} on{n++} END{print n+0}' "$2")
  python3 -c '
import json, sys
d, what, header, excluded = sys.argv[1:5]
def get(name):
    for f in json.load(open(d + "/" + name))["files"]:
        if f["filename"] == header:
            return f
all_, c, cxx = get("summary.json"), get("summary_c.json"), get("summary_cxx.json")
if not all_:
    print("coverage %s: no counters (nothing that includes it ran)" % header)
    sys.exit(0)
br = c or all_
pct = lambda a, b: 100.0 * a / b if b else 100.0
if what == "detail":
    print("  %s: %d of %d lines (every build); %d of %d branches (the C builds)%s; %s lines excluded by a marker"
          % (header, all_["line_covered"], all_["line_total"], br["branch_covered"], br["branch_total"],
             "; the C++ builds alone %d of %d" % (cxx["branch_covered"], cxx["branch_total"]) if cxx and cxx["branch_total"] else "",
             excluded))
else:
    print("coverage %s lines %.1f%% branches %.1f%%"
          % (header, pct(all_["line_covered"], all_["line_total"]), pct(br["branch_covered"], br["branch_total"])))
' "$dir" "$1" "$2" "$((excl + blocks))"
}
for h in "$@"; do report detail "$h"; done
for h in "$@"; do report line "$h"; done
