#!/usr/bin/env bash
# Builds the fuzz targets and runs one under afl-fuzz for SECONDS (default
# 600), niced, then prints what it did. Findings go to out/TARGET/default/
# (crashes/, hangs/, queue/); a previous out/TARGET is moved aside to
# out/TARGET.<time> unless RESUME=1, which continues from its queue.
# Exits 1 when the run saved a crash or a hang. See README.md.
#
#   fuzz/run.sh decode_read_report 480
set -euo pipefail
cd "$(dirname "$0")"

target=${1:?usage: fuzz/run.sh TARGET [SECONDS]   (targets: $(ls corpus | tr '\n' ' '))}
seconds=${2:-600}
[ -d "corpus/$target" ] || { echo "unknown target $target: no corpus/$target" >&2; exit 2; }

nice -n 10 cargo afl build --release --bin "$target"

out=out/$target
input=corpus/$target
if [ -d "$out" ]; then
  if [ "${RESUME:-0}" = 1 ]; then
    input=-
  else
    mv "$out" "$out.$(date +%Y%m%d-%H%M%S)"
  fi
fi
mkdir -p out

# -t: a hang is an input that takes over 200 ms (one takes microseconds);
# -m: no more than 512 MiB of memory; the targets' own allocation guard
# (src/lib.rs) is far stricter. AFL_NO_AFFINITY: do not pin a core that
# others are using.
status=0
AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_NO_AFFINITY=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
  nice -n 10 cargo afl fuzz -i "$input" -o "$out" -V "$seconds" -t 200 -m 512 \
  "target/release/$target" >"out/$target.log" 2>&1 || status=$?

stats=$out/default/fuzzer_stats
if [ ! -f "$stats" ]; then
  echo "afl-fuzz exited $status without stats; see fuzz/out/$target.log:" >&2
  tail -n 30 "out/$target.log" >&2
  exit 1
fi
stat() { awk -F' *: *' -v k="$1" '$1 == k { print $2 }' "$stats"; }
echo "target:    $target"
echo "run time:  $(stat run_time) s"
echo "execs:     $(stat execs_done) ($(stat execs_per_sec)/s)"
echo "paths:     $(stat corpus_count) (bitmap $(stat bitmap_cvg), stability $(stat stability))"
echo "crashes:   $(stat saved_crashes)"
echo "hangs:     $(stat saved_hangs)"
found=$(find "$out/default/crashes" "$out/default/hangs" -type f -name 'id:*' 2>/dev/null | sort || true)
if [ -n "$found" ]; then
  echo "findings, $(echo "$found" | wc -l) (reproduce: fuzz/target/release/$target < FILE):"
  echo "$found" | head -n 10 | sed 's/^/  fuzz\//'
  exit 1
fi
