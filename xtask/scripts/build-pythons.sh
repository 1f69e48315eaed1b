#!/usr/bin/env bash
# build-pythons.sh - build CPython test interpreters for profiler testing.
#
# Driven by `cargo xtask setup --interpreters` (and `cargo xtask test`), which
# asks for VARIANTS="3.13t 3.13t-static" and installs the build deps itself
# (SKIP_APT_INSTALL=1). Ported from the team's verified recipe; can still be run
# by hand. Waits (does not fail) when another build holds $WORK/.lock.
#
# Fetches the pristine CPython source (Debian's python3.X .orig.tar.xz) from
# Debian trixie/sid with `apt-get source --download-only`, using a PRIVATE apt
# state dir (deb-src lines only; the system's apt sources/lists are untouched),
# then configures/builds/installs each variant with CPython's default flags
# (no PGO/LTO, no forced frame pointers, tests not run).
#
# Variants (name -> prefix $PREFIX_ROOT/<name>):
#   3.14          python3.14 source, --enable-shared        (libpython3.14.so.1.0)
#   3.14t         python3.14 source, --enable-shared --disable-gil (libpython3.14t.so.1.0)
#   3.14t-static  python3.14 source, --disable-gil, no libpython .so (static)
#   3.13t         python3.13 source, --enable-shared --disable-gil (libpython3.13t.so.1.0)
#   3.13t-static  python3.13 source, --disable-gil, interpreter linked statically
# Shared builds get an absolute rpath to <prefix>/lib, so no LD_LIBRARY_PATH is needed.
#
# Idempotent: a variant whose prefix contains the marker file
# .pyebpf-build-complete is skipped; downloaded tarballs are reused. Each variant
# runs in its own subshell; failures are summarised at the end (exit 1).
# Source lookup: tarball already in $SRCDIR (Debian orig, or an upstream
# Python-X.Y.Z.tar.xz dropped there by hand) -> else every version in the private
# deb-src index, newest first, until one downloads. (Observed 2026-11-30: the Debian mirror reachable
# here answers 404 for all python3.14 source files and for
# python3.13 3.13.18-1; python3.13 3.13.15-1 downloads.)
# Per-variant logs and timings: $WORK/logs/ (timings.tsv).
# Env knobs: VARIANTS="3.13t" (subset), JOBS=N, PYEBPF_TEST_CACHE (default
#   /var/cache/pyebpf-test), WORK=$CACHE/work, PREFIX_ROOT=$CACHE/pythons, PY314_DEBVER / PY313_DEBVER (pin a Debian
#   version, e.g. 3.14.10-1), FORCE=1 (rebuild even if marker present),
#   SKIP_APT_INSTALL=1 (don't install build deps), KEYRING (for the deb-src index), MIRROR.
set -euo pipefail

CACHE=${PYEBPF_TEST_CACHE:-/var/cache/pyebpf-test}
WORK=${WORK:-$CACHE/work}
PREFIX_ROOT=${PREFIX_ROOT:-$CACHE/pythons}
JOBS=${JOBS:-$(nproc)}
VARIANTS=${VARIANTS:-"3.13t 3.13t-static"}
APTDIR=$WORK/apt
SRCDIR=$WORK/src
BUILDROOT=$WORK/build
LOGDIR=$WORK/logs
TIMINGS=$LOGDIR/timings.tsv
MARKER=.pyebpf-build-complete
KEYRING=${KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
# The Debian mirror this machine already uses (first URIs: line of its deb822 sources, else sources.list).
MIRROR=${MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null)}
MIRROR=${MIRROR:-$(awk '/^deb /{for(i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null)}
[[ -n $MIRROR ]] || { echo "no Debian mirror found in /etc/apt; set MIRROR=" >&2; exit 1; }

log() { printf '[%(%F %T)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# variant -> "srcpkg|configure args"
variant_spec() {
  case "$1" in
    3.14)         echo "python3.14|--enable-shared" ;;
    3.14t)        echo "python3.14|--enable-shared --disable-gil" ;;
    3.14t-static) echo "python3.14|--disable-gil" ;;
    3.13t)        echo "python3.13|--enable-shared --disable-gil" ;;
    3.13t-static) echo "python3.13|--disable-gil" ;;
    *) die "unknown variant $1" ;;
  esac
}

mkdir -p "$WORK" "$SRCDIR" "$BUILDROOT" "$LOGDIR" "$PREFIX_ROOT"
exec 9>"$WORK/.lock"
if ! flock -n 9; then
  log "another build holds $WORK/.lock - waiting for it (variants it finishes are then skipped)"
  flock 9
fi

# ---------------------------------------------------------------- build deps
install_build_deps() {
  [[ ${SKIP_APT_INSTALL:-0} == 1 ]] && return 0
  # Only install what is missing, from the system's (bookworm) apt config.
  # libmpdec-dev does not exist in bookworm -> CPython's bundled libmpdec is used.
  # tk-dev is optional (tkinter) and not required.
  local want=(build-essential pkg-config xz-utils libssl-dev libffi-dev zlib1g-dev
              libbz2-dev liblzma-dev libsqlite3-dev libreadline-dev libncurses-dev
              uuid-dev libgdbm-dev libgdbm-compat-dev libzstd-dev libexpat1-dev)
  local missing=() p
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || { log "build deps: all present"; return 0; }
  log "installing build deps: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${missing[@]}" \
    || { apt-get update && apt-get install -y --no-install-recommends "${missing[@]}"; }
}

# ----------------------------------------------------------- private apt dir
APT_OPTS=(
  -o "Dir::Etc::SourceList=$APTDIR/etc/sources.list"
  -o "Dir::Etc::SourceParts=$APTDIR/etc/sources.list.d"
  -o "Dir::Etc::Preferences=$APTDIR/etc/preferences"
  -o "Dir::Etc::PreferencesParts=$APTDIR/etc/preferences.d"
  -o "Dir::State::Lists=$APTDIR/lists"
  -o "Dir::Cache=$APTDIR/cache"
  -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
  -o "APT::Get::List-Cleanup=0"
  -o "APT::Sandbox::User=root"
)
setup_private_apt() {
  mkdir -p "$APTDIR"/etc/{sources.list.d,preferences.d} "$APTDIR"/lists/partial "$APTDIR"/cache/archives/partial
  cat >"$APTDIR/etc/sources.list" <<EOF
deb-src [signed-by=$KEYRING] $MIRROR trixie main
deb-src [signed-by=$KEYRING] $MIRROR sid main
EOF
  if ! compgen -G "$APTDIR/lists/*_source_Sources*" >/dev/null || [[ ${APT_UPDATE:-0} == 1 ]]; then
    log "apt-get update (private state dir $APTDIR, deb-src trixie+sid)"
    apt-get "${APT_OPTS[@]}" update >"$LOGDIR/apt-update.log" 2>&1 \
      || { cat "$LOGDIR/apt-update.log" >&2; die "private apt-get update failed"; }
  fi
}
APT_READY=0

# Prints the path of the source tarball for source package $1 (e.g. python3.14).
# Order: an already-downloaded Debian orig tarball in $SRCDIR, or an upstream
# Python-X.Y.Z.tar.{xz,gz} placed in $SRCDIR by hand; otherwise `apt-get source
# --download-only` of each version the private index knows, newest first (or
# only the pinned one), until one downloads (the mirror may lack some files).
find_local_tarball() {
  local pkg=$1 pin=$2 series=${1#python}
  { compgen -G "$SRCDIR/${pkg}_${pin:+${pin%-*}.}*orig.tar.*" || true
    [[ -z $pin ]] && { compgen -G "$SRCDIR/Python-${series}.*.tar.[xg]z" || true; }
  } | grep -v '\.asc$' | sort -V | tail -n1
}
orig_tarball() {
  local pkg=$1 pin=${2:-} tb v versions
  tb=$(find_local_tarball "$pkg" "$pin")
  if [[ -z $tb ]]; then
    if ((APT_READY == 0)); then setup_private_apt; APT_READY=1; fi
    if [[ -n $pin ]]; then versions=$pin; else
      versions=$(apt-cache "${APT_OPTS[@]}" showsrc "$pkg" 2>/dev/null \
        | awk -v P="$pkg" '/^Package: /{p=$2} /^Version: /{if (p==P) print $2}' | sort -V -r -u)
    fi
    [[ -n $versions ]] || { log "no source versions of $pkg in the private apt index"; return 1; }
    for v in $versions; do
      log "apt-get source --download-only $pkg=$v"
      local alog=$LOGDIR/apt-source-$pkg=$v.log
      if (cd "$SRCDIR" && apt-get "${APT_OPTS[@]}" source --download-only "$pkg=$v") >"$alog" 2>&1; then
        tb=$(find_local_tarball "$pkg" "$v"); [[ -n $tb ]] && break
      fi
      log "  $pkg=$v: download failed: $(grep -m1 -E '^E: ' "$alog" || tail -n1 "$alog")"
      rm -f "$SRCDIR/${pkg}_${v%-*}.orig.tar."* "$SRCDIR/${pkg}_${v}."*   # drop partial downloads
    done
    [[ -n $tb ]] || { log "no downloadable source for $pkg (tried: $(echo $versions))"; return 1; }
  fi
  echo "$tb"
}

# ------------------------------------------------------------------- builds
build_variant() {
  local name=$1 spec pkg cfg pin prefix tb bdir top t0 t1 t2 t3 rc
  spec=$(variant_spec "$name"); pkg=${spec%%|*}; cfg=${spec#*|}
  prefix=$PREFIX_ROOT/$name
  if [[ -f $prefix/$MARKER && ${FORCE:-0} != 1 ]]; then
    log "$name: already installed ($prefix/$MARKER) - skipping"; return 0
  fi
  case $pkg in python3.14) pin=${PY314_DEBVER:-};; python3.13) pin=${PY313_DEBVER:-};; esac
  tb=$(orig_tarball "$pkg" "$pin")
  top=$(tar -tf "$tb" | head -n1 | cut -d/ -f1 || true)   # || true: SIGPIPE under pipefail
  [[ $top == Python-* ]] || die "$tb: unexpected top dir '$top'"
  bdir=$BUILDROOT/$name
  log "$name: fresh unpack of $(basename "$tb") -> $bdir/$top"
  rm -rf "$bdir"; mkdir -p "$bdir"; tar -xf "$tb" -C "$bdir"
  rm -rf "$prefix"   # no marker -> partial/old install; start clean
  local ldflags=""
  [[ $cfg == *--enable-shared* ]] && ldflags="-Wl,-rpath,$prefix/lib"
  local L=$LOGDIR/$name
  cd "$bdir/$top"
  t0=$(date +%s)
  log "$name: configure --prefix=$prefix $cfg ${ldflags:+LDFLAGS=$ldflags}"
  # shellcheck disable=SC2086
  ./configure --prefix="$prefix" $cfg ${ldflags:+LDFLAGS="$ldflags"} >"$L.configure.log" 2>&1 \
    || die "$name: configure failed, see $L.configure.log"
  t1=$(date +%s)
  log "$name: make -j$JOBS"
  make -j"$JOBS" >"$L.make.log" 2>&1 || die "$name: make failed, see $L.make.log"
  t2=$(date +%s)
  log "$name: make install"
  make install >"$L.install.log" 2>&1 || die "$name: make install failed, see $L.install.log"
  t3=$(date +%s)
  local py
  py=$(ls "$prefix"/bin/python3.[0-9]* 2>/dev/null | grep -E 'python3\.[0-9]+t?$' | sort | tail -n1)  # prefer python3.Xt
  [[ -x $py ]] || die "$name: no interpreter found in $prefix/bin"
  env -u LD_LIBRARY_PATH "$py" -c 'import sys; print(sys.version)' >"$L.smoke.log" 2>&1 \
    || die "$name: installed interpreter does not start (see $L.smoke.log)"
  # optional modules that could not be built (informational)
  grep -A3 -E '^Checked [0-9]+ modules|necessary bits to build|Following modules (built successfully but were removed|failed)' \
    "$L.make.log" >"$L.modules.log" 2>/dev/null || true
  printf '%s\t%s\t%s\tconfigure=%ss\tmake=%ss\tinstall=%ss\ttotal=%ss\tjobs=%s\n' \
    "$name" "$top" "$(basename "$tb")" $((t1-t0)) $((t2-t1)) $((t3-t2)) $((t3-t0)) "$JOBS" | tee -a "$TIMINGS" >&2
  {
    echo "variant=$name"; echo "source=$(basename "$tb")"; echo "srcdir=$bdir/$top"
    echo "configure_args=--prefix=$prefix $cfg${ldflags:+ LDFLAGS=$ldflags}"
    echo "interpreter=$py"; echo "version=$(head -n1 "$L.smoke.log")"
    echo "seconds_configure=$((t1-t0)) seconds_make=$((t2-t1)) seconds_install=$((t3-t2)) seconds_total=$((t3-t0)) jobs=$JOBS"
    echo "built=$(date -Is)"
  } >"$prefix/$MARKER"
  log "$name: done in $((t3-t0))s -> $py"
}

install_build_deps
failed=()
for v in $VARIANTS; do
  # each variant in its own errexit subshell, so one failure doesn't stop the rest
  set +e; ( set -e; build_variant "$v" ); rc=$?; set -e
  ((rc == 0)) || { log "$v: FAILED (rc=$rc)"; failed+=("$v"); }
done
for v in $VARIANTS; do
  if [[ -f $PREFIX_ROOT/$v/$MARKER ]]; then
    printf '%-14s %s\n' "$v" "$(grep -E '^version=' "$PREFIX_ROOT/$v/$MARKER" | cut -d= -f2-)"
  else
    printf '%-14s %s\n' "$v" "NOT BUILT"
  fi
done
((${#failed[@]} == 0)) || die "failed variants: ${failed[*]} (logs in $LOGDIR)"
log "all requested variants present under $PREFIX_ROOT"
