#!/usr/bin/env bash
# Checks that every C++ and CUDA source of DTP is formatted as .clang-format
# says, with clang-format 14 (Debian 12's: another version formats some
# constructs differently). Lists the files that differ and exits 1;
# --fix formats them in place instead.
#
# usage: tools/check-format.sh [--fix]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

fix=0
case "${1:-}" in
  "") ;;
  --fix) fix=1 ;;
  -h | --help) sed -n '2,7p' "$0"; exit 0 ;;
  *) echo "check-format: unknown argument '$1' (expected --fix or nothing)" >&2; exit 2 ;;
esac

formatter=""
for candidate in clang-format-14 clang-format; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" --version | grep -q 'version 14\.'; then
    formatter="$candidate"
    break
  fi
done
if [[ -z "$formatter" ]]; then
  found="$(command -v clang-format >/dev/null 2>&1 && clang-format --version || echo none)"
  echo "check-format: needs clang-format 14 (found: $found); on Debian 12 or Ubuntu: apt-get install clang-format-14" >&2
  exit 1
fi

# The sources: git's list where this is a clone, else the folders themselves.
folders=(runtime chapters puzzles reference drivers tests apps bench)
cd "$ROOT"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- "${folders[@]/%//*.h}" "${folders[@]/%//*.cpp}" \
                                       "${folders[@]/%//*.cu}" "${folders[@]/%//*.cuh}")
else
  mapfile -t files < <(find "${folders[@]}" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \))
fi
((${#files[@]})) || { echo "check-format: no sources found under ${folders[*]}" >&2; exit 1; }

if ((fix)); then
  "$formatter" -i --style=file "${files[@]}"
  echo "check-format: formatted ${#files[@]} files with $formatter"
  exit 0
fi

# One run over every file; its complaints name the files that differ.
status=0
report="$("$formatter" --style=file --dry-run --Werror "${files[@]}" 2>&1)" || status=$?
mapfile -t differ < <(grep -oE '^[^:]+:[0-9]+:[0-9]+: error' <<<"$report" | cut -d: -f1 | sort -u)
if ((status != 0 && ${#differ[@]} == 0)); then
  echo "check-format: $formatter failed without naming a file:" >&2
  echo "$report" >&2
  exit 1
fi
if ((${#differ[@]})); then
  echo "check-format: ${#differ[@]} of ${#files[@]} files are not formatted as .clang-format says:" >&2
  printf '  %s\n' "${differ[@]}" >&2
  echo "check-format: tools/check-format.sh --fix formats them (or $formatter -i FILE)" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted ($formatter)"
