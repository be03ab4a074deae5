#!/usr/bin/env bash
# clang-format must leave every C file unchanged, and no banned function
# (sprintf, strcpy, strcat, atoi, strtok, gets) may appear (STYLE.md 36).
set -euo pipefail
cd "$(dirname "$0")/.."
# The list first, checked: a failing git (not a work tree) inside the
# process substitution would pass unseen, with no file checked.
list="$(git ls-files -co --exclude-standard -- '*.c' '*.h')" ||
  { echo "check-style: git ls-files failed (run it in the repository's work tree)" >&2; exit 2; }
mapfile -t files <<<"$list"
if [ -z "$list" ] || [ ${#files[@]} -eq 0 ]; then
  echo "check-style: no C files found" >&2; exit 2
fi
bad=0
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if ! clang-format --dry-run --Werror "$f" 2>/dev/null; then
    echo "check-style: $f is not clang-formatted (run: clang-format -i $f)"; bad=1
  fi
done
if grep -nE '\b(sprintf|vsprintf|strcpy|strcat|atoi|atol|strtok|gets)\s*\(' "${files[@]}" \
     | grep -vE '^\S+:[0-9]+:\s*(/\*|\*)'; then
  echo "check-style: banned functions above"; bad=1
fi
[ $bad -eq 0 ] && echo "check-style: ${#files[@]} files ok"
exit $bad
