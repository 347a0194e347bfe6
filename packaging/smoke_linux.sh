#!/usr/bin/env bash
# Build packaging/mtpchat.spec one-dir on Linux and prove the frozen app runs: the Linux
# stand-in for the macOS .app (catches missing hidden imports and data files early; cannot
# catch Metal, rpath, signing or Cocoa problems). Exits non-zero on any failure.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: bash packaging/smoke_linux.sh [--work DIR] [--keep] [--skip-build] [--no-self-test]
                                     [--model DIR]

Builds the PyInstaller spec (packaging/mtpchat.spec) into a one-dir app and runs it frozen,
offscreen (QT_QPA_PLATFORM=offscreen), with a throw-away home:
  1. pyinstaller --clean (installs pyinstaller>=6.10 with pip if missing)
  2. checks the tree (metallib rule, mlx_lm models, resources, no torch/WebEngine)
  3. mtpchat --version          (version matches the project)
  4. mtpchat --quit-after 1     (the window opens and closes)
  5. mtpchat --self-test        (the app's own end-to-end check: model load, streamed reply,
                                 persistence, dashboard, model store)
  6. run 4 again without MTPCHAT_HOME, HOME pointing at a temp dir: the log must land in
     the platformdirs location under that HOME, and nothing may be written inside the build
Prints the build time and size.

Options:
  --work DIR      where build/ and dist/ go (default: build/smoke-linux, git-ignored)
  --keep          keep the temp homes (their paths are printed)
  --skip-build    reuse an existing build in --work
  --no-self-test  skip step 5
  --model DIR     self-test with this model folder instead of the embedded demo model
Environment: PYTHON (default: python3).
EOF
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="$ROOT/build/smoke-linux"
KEEP=0; BUILD=1; SELFTEST=1; MODEL_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --work) WORK="$(mkdir -p "$2" && cd "$2" && pwd)"; shift ;;
        --keep) KEEP=1 ;;
        --skip-build) BUILD=0 ;;
        --no-self-test) SELFTEST=0 ;;
        --model) MODEL_ARGS=(--model "$(cd "$2" && pwd)"); shift ;;
        *) echo "smoke_linux.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

PY="${PYTHON:-python3}"
DIST="$WORK/dist"
APPDIR="$DIST/mtpchat"
EXE="$APPDIR/mtpchat"
step() { printf '\n==> %s\n' "$*"; }
fail() { echo "smoke_linux.sh: FAILED: $*" >&2; exit 1; }
# Run the frozen app with a time limit; fail on a non-zero exit or any Python traceback.
run_app() {
    local limit="$1"; shift
    local log="$TMP/run-$RANDOM.log" rc=0
    timeout "$limit" "$EXE" "$@" 2>&1 | tee "$log" || rc=$?   # pipefail: the app's status
    [ "$rc" = 0 ] || fail "mtpchat $* exited $rc"
    if grep -q "^Traceback" "$log"; then fail "mtpchat $* printed a Python traceback (see above)"; fi
}

[ "$(uname -s)" = Linux ] || fail "this is the Linux smoke build; on a Mac use build_macos.sh"
cd "$ROOT"
VERSION="$("$PY" packaging/mtpchat_bundle.py version)"

if [ "$BUILD" = 1 ]; then
    if ! "$PY" -m PyInstaller --version >/dev/null 2>&1; then
        step "installing pyinstaller"
        "$PY" -m pip install -q 'pyinstaller>=6.10'
    fi
    step "building MTP Chat $VERSION with PyInstaller $("$PY" -m PyInstaller --version) into $WORK"
    [ ! -d "$DIST" ] || chmod -R u+w "$DIST"   # a killed earlier run may have left it read-only
    rm -rf "$DIST" "$WORK/build"
    t0=$(date +%s)
    "$PY" -m PyInstaller --noconfirm --clean --log-level WARN \
        --distpath "$DIST" --workpath "$WORK/build" packaging/mtpchat.spec
    t1=$(date +%s)
    echo "build time: $((t1 - t0)) s"
fi
[ -x "$EXE" ] || fail "no frozen executable at $EXE"
echo "build size: $(du -sh "$APPDIR" | cut -f1) ($(find "$APPDIR" -type f | wc -l) files) in $APPDIR"

step "checking the frozen tree"
"$PY" packaging/mtpchat_bundle.py verify "$APPDIR"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/mtpchat-smoke.XXXXXX")"
cleanup() { if [ "$KEEP" = 1 ]; then echo "kept $TMP"; else rm -rf "$TMP"; fi; }
trap cleanup EXIT
STAMP="$TMP/stamp"; touch "$STAMP"; sleep 1
export QT_QPA_PLATFORM=offscreen HF_HUB_OFFLINE=1 MTPCHAT_HOME="$TMP/home"
unset MTPCHAT_RESOURCES   # the frozen app must find its own bundled resources
chmod -R a-w "$APPDIR"    # the app must never write inside itself (root ignores this; see below)
trap 'chmod -R u+w "$APPDIR"; cleanup' EXIT

step "mtpchat --version"
out="$("$EXE" --version)" || fail "--version exited $?"
echo "$out"
case "$out" in *"$VERSION"*) ;; *) fail "--version printed '$out', expected $VERSION" ;; esac

step "mtpchat --quit-after 1"
run_app 300 --quit-after 1
[ -s "$MTPCHAT_HOME/logs/mtpchat.log" ] || fail "no log written under MTPCHAT_HOME"
[ -f "$MTPCHAT_HOME/logs/crash.log" ] || fail "the frozen launcher did not set up logs/crash.log"

if [ "$SELFTEST" = 1 ]; then
    step "mtpchat --self-test"
    t0=$(date +%s)
    run_app 900 --self-test "${MODEL_ARGS[@]}"
    echo "self-test time: $(($(date +%s) - t0)) s"
    loaded="$(grep -o "loaded /[^ ]* in" "$MTPCHAT_HOME/logs/mtpchat.log" | tail -1 || true)"
    echo "model ${loaded:-load not found in the log}"
    if [ ${#MODEL_ARGS[@]} = 0 ]; then
        case "$loaded" in
            *"$APPDIR/_internal/resources/models/"*) echo "the embedded demo model was used from inside the build (read-only)" ;;
            "") ;;
            *) fail "the self-test did not load the embedded model from the build" ;;
        esac
    fi
fi

step "platformdirs locations (no MTPCHAT_HOME, HOME=$TMP/user)"
mkdir -p "$TMP/user"
(
    unset MTPCHAT_HOME XDG_DATA_HOME XDG_CONFIG_HOME XDG_STATE_HOME XDG_CACHE_HOME
    export HOME="$TMP/user"
    run_app 300 --quit-after 1
)
log="$(find "$TMP/user" -name mtpchat.log -print -quit)"
[ -n "$log" ] || fail "no mtpchat.log under the platformdirs home $TMP/user"
echo "log written to ${log#"$TMP/user"/} (under HOME)"

written="$(find "$APPDIR" -newer "$STAMP" -print | head -20)"
[ -z "$written" ] || fail "the app wrote inside its own folder:
$written"
echo "nothing written inside $APPDIR"

step "smoke test passed: MTP Chat $VERSION frozen on $(uname -m) Linux"
