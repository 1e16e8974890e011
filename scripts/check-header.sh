#!/usr/bin/env bash
# Checks that include/hetccl.h is what cbindgen generates from
# collectives/src/api/ext/mod.rs with cbindgen.toml; exits non-zero on any
# difference. With --update, rewrites include/hetccl.h instead.
#
# Usage: scripts/check-header.sh [--update]
#
# The header holds hetccl's own C additions only (hetccl* names); NCCL's API
# is declared by NCCL's nccl.h, which the header includes. Rules for ext.rs:
#   - name every item hetccl* / HETCCL_* (checked here: any other declared
#     name fails the check, so no nccl* declaration can leak in);
#   - write functions out as `#[no_mangle] pub unsafe extern "C" fn hetcclX`,
#     not through the export! macro, which cbindgen cannot see through;
#   - use NCCL's types (ncclComm_t, ncclResult_t, ...) by name.
# When ext.rs does not exist, the header holds only the banner and guard.
#
# cbindgen is pinned ($CBINDGEN_VERSION): a `cbindgen` on PATH is used if it
# is that version, else it is installed once with `cargo install --locked`
# into ${HETCCL_CACHE:-$HOME/.cache/hetccl}/tools/.
#
# The generated header is also compiled with gcc (C and, if g++ exists, C++)
# against NVIDIA's real nccl.h from scripts/fetch-nvidia-headers.sh. Set
# HETCCL_HEADER_NO_CC=1 to skip that step.
set -euo pipefail

CBINDGEN_VERSION=0.29.4
SRC=collectives/src/api/ext/mod.rs
HEADER=include/hetccl.h

update=0
case "${1:-}" in
    "") ;;
    --update) update=1 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "check-header: unknown argument: $1" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cache="${HETCCL_CACHE:-$HOME/.cache/hetccl}"

# --- cbindgen, pinned ---
cbindgen=""
if command -v cbindgen >/dev/null && [ "$(cbindgen --version 2>/dev/null)" = "cbindgen $CBINDGEN_VERSION" ]; then
    cbindgen="$(command -v cbindgen)"
else
    tool_root="$cache/tools/cbindgen-$CBINDGEN_VERSION"
    cbindgen="$tool_root/bin/cbindgen"
    if [ ! -x "$cbindgen" ]; then
        echo "check-header: installing cbindgen $CBINDGEN_VERSION into $tool_root" >&2
        cargo install --quiet --locked --version "$CBINDGEN_VERSION" --root "$tool_root" cbindgen >&2
    fi
fi
[ "$("$cbindgen" --version)" = "cbindgen $CBINDGEN_VERSION" ] || {
    echo "check-header: $cbindgen is not cbindgen $CBINDGEN_VERSION" >&2
    exit 1
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# --- generate ---
input="$SRC"
if [ ! -e "$input" ]; then
    input="$tmp/ext.rs"
    : >"$input"
fi
"$cbindgen" --quiet --config cbindgen.toml --lang c --output "$tmp/hetccl.h" "$input"

# --- only hetccl names may be declared ---
python3 - "$tmp/hetccl.h" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
# Drop comments and string literals.
code = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
code = re.sub(r"//[^\n]*", "", code)
code = re.sub(r'"[^"\n]*"', '""', code)
names = set()
for line in code.splitlines():
    m = re.match(r"\s*#\s*define\s+(\w+)", line)
    if m and m.group(1) != "HETCCL_H":
        names.add(m.group(1))
    if line.lstrip().startswith("#"):
        continue
    # A function pointer "(*name)", else a function declaration "name(".
    m = re.search(r"\(\s*\*\s*(\w+)\s*\)", line)
    if m:
        names.add(m.group(1))
    else:
        for m in re.finditer(r"\b(\w+)\s*\(", line):
            if m.group(1) not in ("sizeof", "__attribute__"):
                names.add(m.group(1))
                break
    m = re.match(r"\s*(?:typedef\s+)?(?:struct|enum|union)\s+(\w+)", line)
    if m:
        names.add(m.group(1))
    m = re.match(r"\s*}?\s*(\w+)\s*;\s*$", line)          # "} name;" of a typedef
    if m and line.lstrip().startswith("}"):
        names.add(m.group(1))
    m = re.match(r"^typedef\b.*?\b(\w+)\s*;\s*$", line)   # "typedef T name;"
    if m:
        names.add(m.group(1))
    m = re.match(r"^\s+(\w+)\s*(?:=[^,]*)?,?\s*$", line)  # enumerators
    if m:
        names.add(m.group(1))
    m = re.match(r"^extern\b.*?\b(\w+)\s*(?:\[[^]]*\])?\s*;\s*$", line)  # globals
    if m:
        names.add(m.group(1))
bad = sorted(n for n in names if not re.match(r"(hetccl|HETCCL)", n))
if bad:
    sys.stderr.write("check-header: the generated header declares non-hetccl names: %s\n"
                     "check-header: only hetccl*/HETCCL_* items belong in include/hetccl.h\n"
                     % ", ".join(bad))
    sys.exit(1)
EOF

# --- it compiles against NVIDIA's nccl.h ---
if [ "${HETCCL_HEADER_NO_CC:-0}" != 1 ]; then
    env_file="$tmp/nv.env"
    bash "$root/scripts/fetch-nvidia-headers.sh" --env-file "$env_file" >/dev/null
    # shellcheck disable=SC1090
    . "$env_file"
    printf '#include "hetccl.h"\nint main(void) { return 0; }\n' >"$tmp/use.c"
    # shellcheck disable=SC2086
    gcc -std=gnu11 -Wall -Wextra -Werror -fsyntax-only -I "$tmp" $HETCCL_NVIDIA_CFLAGS "$tmp/use.c"
    if command -v g++ >/dev/null; then
        cp "$tmp/use.c" "$tmp/use.cpp"
        # shellcheck disable=SC2086
        g++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only -I "$tmp" $HETCCL_NVIDIA_CFLAGS "$tmp/use.cpp"
    fi
fi

# --- compare or update ---
if [ "$update" = 1 ]; then
    mkdir -p "$(dirname "$HEADER")"
    cp "$tmp/hetccl.h" "$HEADER"
    echo "check-header: wrote $HEADER" >&2
    exit 0
fi
if [ ! -e "$HEADER" ]; then
    echo "check-header: $HEADER is missing; run scripts/check-header.sh --update" >&2
    exit 1
fi
if ! diff -u "$HEADER" "$tmp/hetccl.h"; then
    echo "check-header: $HEADER is out of date with $SRC; run scripts/check-header.sh --update" >&2
    exit 1
fi
echo "check-header: $HEADER is up to date" >&2
