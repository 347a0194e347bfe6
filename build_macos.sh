#!/usr/bin/env bash
# Build, verify and sign "MTP Chat.app" on an Apple Silicon Mac; optionally notarize it and
# wrap it in a DMG. One command; stops loudly at the first failing step. See --help.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
APP_NAME="MTP Chat"
MIN_MACOS="14.0"
REQS="packaging/requirements-macos.txt"

usage() {
    cat <<'EOF'
Usage: bash build_macos.sh [options]

Builds dist/MTP Chat.app (arm64, macOS 14+) from this checkout with PyInstaller, verifies it,
signs it, and archives it as dist/MTP-Chat-<version>-macos-arm64.zip. Needs an Apple Silicon
Mac with macOS 14 or later, the Xcode command line tools (xcode-select --install) and Python
3.11 or 3.12 for arm64 -- preferably the python.org installer: a Homebrew Python is built for
the Mac it was bottled for (e.g. macOS 15) and would raise the app's minimum macOS.

Steps (each one fails the build if it fails):
  1. platform check: arm64 macOS >= 14 (not under Rosetta), Python 3.11/3.12 arm64 whose
     deployment target is <= 14.0, codesign/ditto/hdiutil/iconutil/xcrun present; the
     embedded demo model resources/models/mtp-demo-qwen3_5 exists (no Git LFS pointers).
  2. a clean build venv (build/macos/venv, recreated every time).
  3. pinned wheels: packaging/requirements-macos.txt pins every package with hashes. They
     are downloaded with
        pip download --only-binary=:all: --platform macosx_14_0_arm64 --no-deps --require-hashes
     and installed from that folder only (pip install --no-index). Why: MLX's Metal wheel
     (mlx-metal) is published per macOS version (macosx_14_0 / 15_0 / 26_0) and a plain
     "pip install" on macOS 26 picks the Metal-4 metallib that fails on macOS 14/15.
     MACOSX_DEPLOYMENT_TARGET does not steer pip's wheel choice, so pinning the platform
     tag is the only reliable way; it is still exported (=14.0) for anything compiled.
     Then "pip check", and one Metal operation in the venv (mx.gpu) before freezing.
  4. the icon: packaging/make_icns.py turns packaging/icon/icon.png into an .icns (iconutil).
  5. PyInstaller with packaging/mtpchat.spec (one-dir + BUNDLE, arm64, no UPX); the spec
     itself refuses a bundle without a metallib beside every libmlx.
  6. verify the bundle: mlx.metallib beside each libmlx*.dylib, mlx_lm.models present, the
     demo model inside, Info.plist values, no Mach-O file needing macOS > 14.0, the
     executable is arm64.
  7. sign: ad-hoc by default (runs on this Mac only); with --sign, a Developer ID signature
     with hardened runtime (--options=runtime --timestamp) and packaging/entitlements.plist
     (allow-unsigned-executable-memory, disable-library-validation). PyInstaller signs every
     binary and then the bundle; then codesign --verify --deep --strict.
  8. self-test from inside the bundle: "dist/MTP Chat.app/Contents/MacOS/MTP Chat" --self-test
     (model load on Metal, a streamed reply, persistence, dashboard, model store) with
     MTPCHAT_HOME in a temp dir; then a start with HOME in a temp dir must write its log
     to ~/Library/Logs/MTPChat there; then codesign --verify again proves the app wrote
     nothing inside itself.
  9. --notarize PROFILE: xcrun notarytool submit --keychain-profile PROFILE --wait,
     xcrun stapler staple + validate, spctl -a -vvv (must say Notarized Developer ID).
 10. --dmg: hdiutil create -srcfolder (app + /Applications link) -format UDZO, signed with
     the same identity and notarized + stapled when --notarize is given; hdiutil verify.
 11. archive: ditto -c -k --keepParent (a plain zip would break Qt's framework symlinks).

Options:
  --sign IDENTITY     codesign identity, e.g. "Developer ID Application: Jane Doe (TEAMID)"
                      (default: ad-hoc "-"; list yours: security find-identity -v -p codesigning)
  --notarize PROFILE  notarize with a notarytool keychain profile, created once with
                      xcrun notarytool store-credentials PROFILE --apple-id ... --team-id ...
                      (needs --sign with a Developer ID Application identity)
  --dmg               also build dist/MTP-Chat-<version>-macos-arm64.dmg
  --python PATH       the Python to build with (default: python.org 3.12, then 3.11, then
                      python3.12 / python3.11 / python3 on PATH)
  --out DIR           output folder (default: dist)
  --offscreen-self-test
                      run the self-test with QT_QPA_PLATFORM=offscreen (headless CI Macs;
                      the default uses the real Cocoa platform plugin)
  --dry-run           print every step's commands without running them (the platform
                      check still runs first, so on Linux this stops there too)
  -h, --help          this text

Linux cannot build the .app; there, bash packaging/smoke_linux.sh builds the same spec
one-dir and runs the frozen app's self-test offscreen.
EOF
}

die() { printf '\nbuild_macos.sh: ERROR: %s\n' "$*" >&2; exit 1; }
step() { printf '\n==> %s\n' "$*"; }
SIGN_ID="-"; NOTARY_PROFILE=""; MAKE_DMG=0; PY=""; OUT="dist"; DRY_RUN=0; OFFSCREEN=0
# Print a command, then run it (unless --dry-run).
run() {
    printf '+'; printf ' %q' "$@"; printf '\n'
    [ "$DRY_RUN" = 1 ] || "$@"
}
# check DESCRIPTION FUNCTION [HELPER...]: run FUNCTION; in a dry run print the commands of
# FUNCTION and of the helper functions it calls instead.
check() {
    echo "+ check: $1"
    if [ "$DRY_RUN" = 1 ]; then
        local f
        for f in "${@:2}"; do
            [ "$f" = "$2" ] || echo "  (helper $f:)"
            declare -f "$f" | sed '1,2d;$d'
        done
    else
        "$2"
    fi
}

parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
            -h|--help) usage; exit 0 ;;
            --sign) [ $# -ge 2 ] || die "--sign needs an identity"; SIGN_ID="$2"; shift ;;
            --notarize) [ $# -ge 2 ] || die "--notarize needs a keychain profile"; NOTARY_PROFILE="$2"; shift ;;
            --dmg) MAKE_DMG=1 ;;
            --python) [ $# -ge 2 ] || die "--python needs a path"; PY="$2"; shift ;;
            --out) [ $# -ge 2 ] || die "--out needs a folder"; OUT="$2"; shift ;;
            --offscreen-self-test) OFFSCREEN=1 ;;
            --dry-run) DRY_RUN=1 ;;
            *) echo "build_macos.sh: unknown option: $1 (see --help)" >&2; exit 2 ;;
        esac
        shift
    done
    if [ -n "$NOTARY_PROFILE" ] && [ "$SIGN_ID" = "-" ]; then
        die "--notarize needs --sign \"Developer ID Application: ...\" (ad-hoc apps cannot be notarized)"
    fi
}

# ------------------------------------------------------------------------ 1. platform check
check_platform() {
    local os arch
    os="$(uname -s)"; arch="$(uname -m)"
    if [ "$os" = Darwin ] && [ "$(sysctl -in sysctl.proc_translated 2>/dev/null || echo 0)" = 1 ]; then
        die "this shell runs under Rosetta (x86_64 emulation); run it natively: arch -arm64 bash build_macos.sh"
    fi
    if [ "$os" != Darwin ] || [ "$arch" != arm64 ]; then
        die "build_macos.sh builds the macOS app and must run on an Apple Silicon Mac (arm64, macOS 14+); this is $os $arch. To check the Linux build use packaging/smoke_linux.sh"
    fi
    local ver major
    ver="$(sw_vers -productVersion)"; major="${ver%%.*}"
    [ "$major" -ge 14 ] || die "macOS $ver is too old: building needs macOS 14 or later"
    local tool
    for tool in codesign ditto hdiutil iconutil sips xcrun plutil lipo; do
        command -v "$tool" >/dev/null || die "$tool not found: install the Xcode command line tools (xcode-select --install)"
    done
    echo "platform: macOS $ver arm64"
}

pick_python() {
    if [ -z "$PY" ]; then
        local c
        for c in /Library/Frameworks/Python.framework/Versions/3.12/bin/python3.12 \
                 /Library/Frameworks/Python.framework/Versions/3.11/bin/python3.11 \
                 python3.12 python3.11 python3; do
            if command -v "$c" >/dev/null 2>&1; then PY="$(command -v "$c")"; break; fi
        done
    fi
    [ -n "$PY" ] || die "no Python found: install Python 3.12 for macOS from python.org or pass --python"
    local info
    info="$("$PY" -c 'import platform, sys, sysconfig
t = sysconfig.get_config_var("MACOSX_DEPLOYMENT_TARGET") or "0"
ok = [int(x) for x in t.split(".")[:2]] <= [int(x) for x in sys.argv[1].split(".")[:2]]
print("%d.%d" % sys.version_info[:2], platform.machine(), t, "ok" if ok else "too-new")' "$MIN_MACOS")" \
        || die "$PY does not run"
    read -r PYVER PYARCH PYTARGET PYTARGET_OK <<<"$info"
    case "$PYVER" in 3.11|3.12) ;; *) die "$PY is Python $PYVER; the build needs Python 3.11 or 3.12 (pass --python)" ;; esac
    [ "$PYARCH" = arm64 ] || die "$PY runs as $PYARCH; it must run natively as arm64"
    [ "$PYTARGET_OK" = ok ] || die "$PY was built for macOS $PYTARGET (newer than $MIN_MACOS), so the app would not start on macOS $MIN_MACOS; use the python.org installer"
    echo "python: $PY (Python $PYVER $PYARCH, deployment target $PYTARGET)"
}

check_demo_model() {
    local model="$ROOT/resources/models/mtp-demo-qwen3_5"
    if [ ! -f "$model/config.json" ]; then
        local msg="the embedded demo model is missing ($model); build it first (python -m engine train-demo)"
        [ "$DRY_RUN" = 1 ] || die "$msg"
        echo "WARNING: $msg -- a real build stops here"; return 0
    fi
    local f
    while IFS= read -r -d '' f; do
        if [ "$(head -c 40 "$f")" = "version https://git-lfs.github.com/spec/" ]; then
            die "$f is a Git LFS pointer; run: git lfs pull"
        fi
    done < <(find "$model" -name '*.safetensors' -print0)
}

# ------------------------------------------------------------------ 2-3. venv and wheels
make_venv() {
    run rm -rf "$VENV" "$WHEELS"
    run "$PY" -m venv "$VENV"
    run mkdir -p "$WHEELS"
    run "$VPY" -m pip download --disable-pip-version-check --only-binary=:all: \
        --platform macosx_14_0_arm64 --no-deps --require-hashes -r "$REQS" -d "$WHEELS"
    run "$VPY" -m pip install --disable-pip-version-check --no-index --find-links "$WHEELS" \
        --no-deps --require-hashes -r "$REQS"
    run "$VPY" -m pip check
    run "$VPY" -c 'import mlx.core as mx; x = mx.ones((256, 256), stream=mx.gpu); mx.eval(x @ x); print("mlx", mx.__version__, "Metal OK on", mx.default_device())'
}

# -------------------------------------------------------------------------- 6. verify
verify_metallibs() {
    local lib n=0
    while IFS= read -r -d '' lib; do
        n=$((n + 1))
        [ -e "$(dirname "$lib")/mlx.metallib" ] || die "no mlx.metallib beside ${lib#"$APP/"}"
        echo "  metallib OK beside ${lib#"$APP/"}"
    done < <(find "$APP" -name 'libmlx*.dylib' -print0)
    [ "$n" -gt 0 ] || die "no libmlx*.dylib in the bundle"
}

verify_bundle() {
    verify_metallibs
    "$VPY" packaging/mtpchat_bundle.py verify "$APP" --mac || die "bundle check failed"
    [ -f "$APP/Contents/Resources/mlx_lm/models/qwen3_5.py" ] || die "mlx_lm.models missing from the bundle"
    [ -f "$APP/Contents/Resources/resources/models/mtp-demo-qwen3_5/config.json" ] || die "demo model missing from the bundle"
    local plist="$APP/Contents/Info.plist" v
    v="$(plutil -extract LSMinimumSystemVersion raw "$plist")"; [ "$v" = "$MIN_MACOS" ] || die "LSMinimumSystemVersion is $v"
    v="$(plutil -extract CFBundleShortVersionString raw "$plist")"; [ "$v" = "$VERSION" ] || die "bundle version is $v, not $VERSION"
    v="$(plutil -extract CFBundleIdentifier raw "$plist")"; echo "  bundle id $v, version $VERSION, minimum macOS $MIN_MACOS"
    v="$(lipo -archs "$APP/Contents/MacOS/$APP_NAME")"
    case " $v " in *" arm64 "*) ;; *) die "the executable is not arm64 ($v)" ;; esac
    "$VPY" packaging/mtpchat_bundle.py minos "$APP" --max "$MIN_MACOS" \
        || die "some binaries need a macOS newer than $MIN_MACOS (see above)"
}

verify_signature() {
    codesign --verify --deep --strict --verbose=2 "$APP" || die "codesign --verify failed"
    # (outputs captured first: "cmd | grep -q" can fail with SIGPIPE under pipefail)
    local ent info
    ent="$(codesign -d --entitlements - "$APP" 2>/dev/null)" || die "cannot read the entitlements"
    case "$ent" in *allow-unsigned-executable-memory*) ;; *) die "the app is not signed with packaging/entitlements.plist" ;; esac
    info="$(codesign -dv "$APP" 2>&1)" || die "codesign -dv failed"
    echo "$info" | sed -nE 's/^(Identifier|Authority|TeamIdentifier|Timestamp)=/  &/p'
    if [ "$SIGN_ID" != "-" ]; then
        case "$info" in *"flags="*runtime*) ;; *) die "hardened runtime is not enabled" ;; esac
        case "$info" in *"Timestamp="*) ;; *) die "the signature has no secure timestamp" ;; esac
    fi
}

# -------------------------------------------------------------------------- 8. self-test
self_test() {
    local tmp rc
    tmp="$(mktemp -d /tmp/mtpchat-selftest.XXXXXX)"
    echo "  temp home: $tmp"
    local qpa=cocoa; [ "$OFFSCREEN" = 1 ] && qpa=offscreen   # (the self-test would pick offscreen)
    env QT_QPA_PLATFORM="$qpa" MTPCHAT_HOME="$tmp/home" HF_HUB_OFFLINE=1 \
        "$APP/Contents/MacOS/$APP_NAME" --self-test && rc=0 || rc=$?
    [ "$rc" = 0 ] || die "the self-test failed inside the bundle (exit $rc); log: $tmp/home/logs/mtpchat.log"
    env -u MTPCHAT_HOME QT_QPA_PLATFORM="$qpa" HOME="$tmp/user" \
        "$APP/Contents/MacOS/$APP_NAME" --quit-after 2 || die "the app did not start/quit cleanly with default locations"
    [ -s "$tmp/user/Library/Logs/MTPChat/mtpchat.log" ] \
        || die "no log in ~/Library/Logs/MTPChat (platformdirs) for HOME=$tmp/user"
    codesign --verify --deep --strict "$APP" || die "the app changed its own bundle while running"
    rm -rf "$tmp"
}

# ------------------------------------------------------------------ 9-10. notarize and DMG
notarize() {  # $1: the .zip or .dmg to submit
    local out status id
    out="$(xcrun notarytool submit "$1" --keychain-profile "$NOTARY_PROFILE" --wait --output-format json)" \
        || die "notarytool submit failed: $out"
    status="$(printf '%s' "$out" | "$VPY" -c 'import json,sys; print(json.load(sys.stdin).get("status"))')"
    id="$(printf '%s' "$out" | "$VPY" -c 'import json,sys; print(json.load(sys.stdin).get("id"))')"
    if [ "$status" != Accepted ]; then
        xcrun notarytool log "$id" --keychain-profile "$NOTARY_PROFILE" >&2 || true
        die "notarization of $1 ended with status $status (submission $id)"
    fi
    echo "  notarized: $1 (submission $id)"
}

notarize_app() {
    local zip="$WORK/notarize-app.zip"
    ditto -c -k --keepParent "$APP" "$zip"
    notarize "$zip"
    xcrun stapler staple "$APP"
    xcrun stapler validate "$APP"
    local verdict
    verdict="$(spctl -a -vvv -t exec "$APP" 2>&1)" || die "spctl rejects the app: $verdict"
    echo "$verdict"
    case "$verdict" in *"Notarized Developer ID"*) ;; *) die "spctl does not see a notarized app" ;; esac
}

make_dmg() {
    local stage="$WORK/dmg"
    rm -rf "$stage" "$DMG"; mkdir -p "$stage"
    ditto "$APP" "$stage/$APP_NAME.app"
    ln -s /Applications "$stage/Applications"
    hdiutil create -volname "$APP_NAME $VERSION" -srcfolder "$stage" -ov -format UDZO "$DMG"
    if [ "$SIGN_ID" != "-" ]; then
        codesign --force --sign "$SIGN_ID" --timestamp "$DMG"
    fi
    if [ -n "$NOTARY_PROFILE" ]; then
        notarize "$DMG"
        xcrun stapler staple "$DMG"
        spctl -a -vvv -t open --context context:primary-signature "$DMG" || die "spctl rejects the DMG"
    fi
    hdiutil verify "$DMG"
}

main() {
    parse_args "$@"
    cd "$ROOT"
    step "1. platform check"
    check_platform
    pick_python
    check_demo_model
    VERSION="$("$PY" packaging/mtpchat_bundle.py version)" || die "cannot read the project version"
    WORK="$ROOT/build/macos"; VENV="$WORK/venv"; WHEELS="$WORK/wheels"; VPY="$VENV/bin/python"
    APP="$OUT/$APP_NAME.app"; BASE="MTP-Chat-$VERSION-macos-arm64"
    ZIP="$OUT/$BASE.zip"; DMG="$OUT/$BASE.dmg"
    [ "$DRY_RUN" = 1 ] && echo "(dry run: printing the steps only)"
    local t0=$SECONDS
    export MACOSX_DEPLOYMENT_TARGET="$MIN_MACOS"

    step "2-3. clean build venv + pinned macosx_14_0_arm64 wheels"
    make_venv
    step "4. icon"
    run mkdir -p "$WORK"
    run "$VPY" packaging/make_icns.py --backend iconutil --out "$WORK/MTPChat.icns"
    step "5. PyInstaller ($( [ "$SIGN_ID" = - ] && echo ad-hoc || echo "$SIGN_ID"))"
    run rm -rf "$APP" "$OUT/$APP_NAME"
    run env MTPCHAT_ICNS="$WORK/MTPChat.icns" MTPCHAT_ENTITLEMENTS="$ROOT/packaging/entitlements.plist" \
        MTPCHAT_CODESIGN_IDENTITY="$( [ "$SIGN_ID" = - ] || echo "$SIGN_ID")" \
        "$VPY" -m PyInstaller --noconfirm --clean --distpath "$OUT" --workpath "$WORK/pyinstaller" \
        packaging/mtpchat.spec
    step "6. verify the bundle"
    check "metallib beside every libmlx, mlx_lm.models, demo model, Info.plist, minimum macOS" verify_bundle verify_metallibs
    step "7. signature"
    check "codesign --verify --deep --strict, entitlements, hardened runtime" verify_signature
    step "8. self-test inside the bundle"
    check "\"$APP/Contents/MacOS/$APP_NAME\" --self-test; platformdirs; bundle untouched" self_test
    if [ -n "$NOTARY_PROFILE" ]; then
        step "9. notarize (profile $NOTARY_PROFILE)"
        check "notarytool submit --wait, stapler staple, spctl -a -vvv" notarize_app notarize
    fi
    if [ "$MAKE_DMG" = 1 ]; then
        step "10. DMG"
        check "hdiutil create -format UDZO $DMG (signed/notarized as requested)" make_dmg notarize
    fi
    step "11. archive"
    run rm -f "$ZIP"
    run ditto -c -k --keepParent "$APP" "$ZIP"
    [ "$DRY_RUN" = 1 ] && { echo "dry run done"; return 0; }
    step "done in $((SECONDS - t0)) s"
    du -sh "$APP" "$ZIP"
    if [ "$MAKE_DMG" = 1 ]; then du -sh "$DMG"; fi
}

main "$@"
