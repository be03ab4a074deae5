#!/usr/bin/env bash
# clang-format must leave every C file unchanged, and no banned function
# (sprintf, strcpy, strcat, atoi, strtok, gets) may appear (STYLE.md 36).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.c' '*.h')
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
