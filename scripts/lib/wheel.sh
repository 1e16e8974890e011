# Sourced by the scripts that fetch NVIDIA's PyPI wheels into the cache
# (fetch-nvrtc.sh, fetch-nvidia-headers.sh): one pinned wheel, downloaded
# once. Needs `set -euo pipefail`, $PY (a python3) and `shopt -s nullglob`
# in the caller.

# fetch_wheel TAG NAME VERSION PREFIX DIR
#   Makes sure DIR holds PREFIX-VERSION-*.whl, downloading NAME==VERSION
#   with pip (no dependencies, binary only) if it does not, and prints the
#   wheel's path. TAG prefixes the messages (on stderr). Fails if pip
#   leaves no such wheel.
fetch_wheel() {
    local tag=$1 name=$2 version=$3 prefix=$4 dir=$5
    local found=("$dir/${prefix}-${version}-"*.whl)
    if [ ${#found[@]} -eq 0 ]; then
        echo "$tag: downloading ${name}==${version}" >&2
        "$PY" -m pip download --quiet --no-deps --only-binary=:all: \
            --dest "$dir" "${name}==${version}" >&2
        found=("$dir/${prefix}-${version}-"*.whl)
        if [ ${#found[@]} -eq 0 ]; then
            echo "$tag: pip left no ${prefix}-${version}-*.whl in $dir" >&2
            return 1
        fi
    fi
    printf '%s\n' "${found[0]}"
}
