# Sourced by scripts/run and scripts/test: create .venv with a Python >= 3.11 and install
# the project into it (editable) with the given extras.
install_venv() {
    local spec="$1" python=""
    for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
        if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            python="$candidate"
            break
        fi
    done
    if [ -z "$python" ]; then
        echo "need Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2
        exit 2
    fi
    if [ ! -x .venv/bin/python ]; then
        echo "== creating .venv with $python"
        "$python" -m venv .venv
    fi
    echo "== installing $spec into .venv"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip 2>&1 | { grep -v '^WARNING: Location' || true; }
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec" 2>&1 | { grep -v '^WARNING: Location' || true; }
    .venv/bin/python -c 'import dynamod' || { echo "installing $spec failed" >&2; exit 1; }
}
