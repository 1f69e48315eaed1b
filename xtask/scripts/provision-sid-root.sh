#!/usr/bin/env bash
# provision-sid-root.sh - a Debian sid root filesystem holding Debian's CPython
# 3.14 and 3.15 binaries, for profiler tests that look at a "containerised"
# interpreter from the host (chroot / unshare+pivot_root into $ROOT). The same
# script makes the Debian 11 root of the 3.9 tests: SUITE=bullseye VERSIONS=3.9
# VERIFY=0 ROOT=$CACHE/roots/bullseye (logs and timings are named after $SUITE).
#
# Driven by `cargo xtask setup --interpreters` (and `cargo xtask test`); ported
# from the team's verified recipe; can still be run by hand. Waits (does not
# fail) when another run holds its lock. NO_HOST_APT=1 (xtask --no-apt): never
# apt-get install on the host, fail instead.
#
# Why a root fs: Debian's python3.14/3.15 sid binaries need glibc >= 2.38
# (bookworm has 2.36), and this mirror answers 404 for their source packages.
#
# Steps (each skipped when already done; any failure -> message + exit 1):
#   1. host: apt-get install debootstrap (bookworm) if missing.
#   2. debootstrap --variant=minbase $SUITE $ROOT $MIRROR, unless $ROOT is already
#      a complete debootstrapped root. A partial root (debootstrap/ dir left
#      behind, or empty dir) is removed and redone; anything else is refused.
#      The signature check uses the host's debian-archive-keyring (bookworm
#      2023.3+deb12u2 has the bookworm + trixie automatic keys that sign sid);
#      override with KEYRING=/path/to/keyring.gpg.
#   3. inside the root: apt.conf.d/99pyebpf-no-valid-until
#      (Acquire::Check-Valid-Until "false"; Acquire::Languages "none") - the mirror reachable here serves a
#      frozen sid snapshot whose InRelease Valid-Until date has passed, so apt in
#      the chroot otherwise refuses it ("Release file ... is expired").
#   4. chroot apt-get install --no-install-recommends python3.X (+ python3.X-dbg,
#      which carries /usr/lib/debug/.build-id/*.debug for /usr/bin/python3.X)
#      for X in $VERSIONS; then apt-get clean (KEEP_DEBS=1 keeps the .debs).
#   5. test scripts into $ROOT/opt/pyebpf/ (busy_loop.py; busy.py from $WORK if present)
#      and the host-side reader $WORK/read-debug-offsets.py.
#   6. verify (VERIFY=0 skips): each interpreter starts in the chroot; ELF facts
#      (static/shared libpython, _PyRuntime in .dynsym/.symtab, .PyRuntime
#      section, build-id, debug file, frame pointers), and _Py_DebugOffsets
#      cookie/version/free_threaded read from a running interpreter via
#      /proc/PID/mem by a host python3.
# Output: table on stdout; $LOGDIR/sid-verify.txt (same table + details);
#   ${ROOT}.provisioned (key=value summary, next to the root, not inside it);
#   timings appended to $LOGDIR/${SUITE}-root-timings.tsv.
# Env knobs: PYEBPF_TEST_CACHE (default /var/cache/pyebpf-test), ROOT=$CACHE/roots/sid,
#   SUITE=sid MIRROR=(the system's Debian mirror)
#   VERSIONS="3.14 3.15" WITH_DBG=1 KEEP_DEBS=0 VERIFY=1 APT_UPDATE=0 (force apt-get
#   update in the root) WORK=$CACHE/work HOST_PY=/usr/bin/python3 KEYRING=...
set -euo pipefail

CACHE=${PYEBPF_TEST_CACHE:-/var/cache/pyebpf-test}
ROOT=${ROOT:-$CACHE/roots/sid}
SUITE=${SUITE:-sid}
# The Debian mirror this machine already uses (first URIs: line of its deb822 sources, else sources.list).
MIRROR=${MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null)}
MIRROR=${MIRROR:-$(awk '/^deb /{for(i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null)}
[[ -n $MIRROR ]] || { echo "no Debian mirror found in /etc/apt; set MIRROR=" >&2; exit 1; }
VERSIONS=${VERSIONS:-"3.14 3.15"}
WITH_DBG=${WITH_DBG:-1}
KEEP_DEBS=${KEEP_DEBS:-0}
VERIFY=${VERIFY:-1}
WORK=${WORK:-$CACHE/work}
LOGDIR=$WORK/logs
HOST_PY=${HOST_PY:-/usr/bin/python3}
KEYRING=${KEYRING:-}
TIMINGS=$LOGDIR/${SUITE}-root-timings.tsv
STATE=${ROOT%/}.provisioned
READER=$WORK/read-debug-offsets.py

log() { printf '[%(%F %T)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
ROOT=${ROOT%/}
[[ $ROOT == /?*/?* ]] || die "ROOT=$ROOT: need an absolute path at least two levels deep"
((EUID == 0)) || die "must run as root (debootstrap, chroot)"
mkdir -p "$WORK" "$LOGDIR" "$(dirname "$ROOT")"
exec 9>"$WORK/.provision-sid-root.lock"
if ! flock -n 9; then
  log "another provision-sid-root.sh holds $WORK/.provision-sid-root.lock - waiting for it"
  flock 9
fi

T_START=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}'; }
declare -A TIME=()

# PIDs of test interpreters started here; killed (by PID) on exit.
STARTED=()
cleanup() { local p; for p in "${STARTED[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

for t in readelf objdump awk flock chroot; do
  command -v "$t" >/dev/null || die "host tool '$t' missing (apt-get install binutils util-linux coreutils)"
done
[[ -x $HOST_PY ]] || die "HOST_PY=$HOST_PY not executable (needed for the debug-offsets reader)"

# ------------------------------------------------------------ 1. debootstrap
host_install() {   # host (bookworm) packages, only if missing
  [[ ${NO_HOST_APT:-0} == 1 ]] && die "host packages missing: $* (NO_HOST_APT=1: install them yourself)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "$@" >"$LOGDIR/host-apt-install.log" 2>&1 \
    || { apt-get update >>"$LOGDIR/host-apt-install.log" 2>&1 \
         && apt-get install -y --no-install-recommends "$@" >>"$LOGDIR/host-apt-install.log" 2>&1; } \
    || { tail -n 20 "$LOGDIR/host-apt-install.log" >&2; die "host apt-get install $* failed (log $LOGDIR/host-apt-install.log)"; }
}
t0=$(date +%s.%N)
if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap on the host"
  host_install debootstrap
fi
[[ -f /usr/share/debootstrap/scripts/$SUITE ]] || die "debootstrap has no script for suite '$SUITE'"
TIME[host_deps]=$(since "$t0")

root_complete() {
  [[ -d $ROOT && ! -e $ROOT/debootstrap && -x $ROOT/usr/bin/apt-get && -f $ROOT/var/lib/dpkg/status ]] || return 1
  chroot "$ROOT" dpkg-query -W -f='${Status}' base-files 2>/dev/null | grep -q 'install ok installed'
}
mounts_under_root() { awk -v R="$ROOT" '$2 == R || index($2, R "/") == 1 {print $2}' /proc/self/mounts; }

t0=$(date +%s.%N)
if root_complete; then
  log "root $ROOT: already debootstrapped - skipping debootstrap"
  TIME[debootstrap]=skipped
else
  if [[ -e $ROOT ]]; then
    [[ -z $(mounts_under_root) ]] || die "$ROOT is incomplete but has mounts under it: $(mounts_under_root | tr '\n' ' ') - unmount first"
    if [[ -d $ROOT/debootstrap ]] || [[ -d $ROOT && -z $(ls -A "$ROOT") ]]; then
      log "root $ROOT: partial/empty (left by an interrupted debootstrap) - removing it"
      rm -rf --one-file-system "$ROOT"
    else
      die "$ROOT exists but is not a complete debootstrapped root (no usr/bin/apt-get, var/lib/dpkg/status or base-files); remove it by hand or set ROOT="
    fi
  fi
  DB_LOG=$LOGDIR/${SUITE}-debootstrap.log
  log "debootstrap --variant=minbase $SUITE $ROOT $MIRROR (log $DB_LOG)"
  if ! debootstrap --variant=minbase ${KEYRING:+--keyring="$KEYRING"} "$SUITE" "$ROOT" "$MIRROR" >"$DB_LOG" 2>&1; then
    tail -n 15 "$DB_LOG" >&2
    if grep -qiE 'signed by unknown key|invalid release signature|NO_PUBKEY|EXPKEYSIG|not signed|gpgv' "$DB_LOG"; then
      die "debootstrap: Release signature check failed. Fix: update the host keyring (apt-get install --only-upgrade debian-archive-keyring from bookworm/bookworm-updates) or pass KEYRING=<keyring holding the current Debian archive keys>"
    fi
    die "debootstrap failed (log $DB_LOG); $ROOT left as is - a rerun removes it if debootstrap/ is still inside"
  fi
  root_complete || die "debootstrap reported success but $ROOT does not look complete"
  TIME[debootstrap]=$(since "$t0")
  log "debootstrap done in ${TIME[debootstrap]}s"
fi

# ------------------------------------------------- 2. apt config in the root
APTCONF=$ROOT/etc/apt/apt.conf.d/99pyebpf-no-valid-until
want_conf='// written by provision-sid-root.sh: the mirror reachable here serves a frozen
// sid snapshot whose InRelease Valid-Until has passed; without this apt says
// "Release file ... is expired" and ignores the index.
Acquire::Check-Valid-Until "false";
// no Translation-* indexes (saves ~38 MB in var/lib/apt/lists)
Acquire::Languages "none";'
if [[ ! -f $APTCONF || $(cat "$APTCONF") != "$want_conf" ]]; then
  printf '%s\n' "$want_conf" >"$APTCONF"; log "wrote $APTCONF"
fi

# ---------------------------------------------------- 3. python packages
PKGS=()
for v in $VERSIONS; do
  PKGS+=("python$v")
  if [[ $WITH_DBG == 1 ]]; then PKGS+=("python$v-dbg"); fi
done
missing=()
for p in "${PKGS[@]}"; do
  chroot "$ROOT" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
in_root_apt() { chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 apt-get "$@"; }
t0=$(date +%s.%N)
if ((${#missing[@]} == 0)); then
  log "packages already installed in root: ${PKGS[*]}"
  TIME[apt_install]=skipped
else
  AL=$LOGDIR/${SUITE}-apt.log; : >"$AL"
  apt_update() {
    log "chroot apt-get update"
    in_root_apt update >>"$AL" 2>&1 || { tail -n 15 "$AL" >&2; die "apt-get update in $ROOT failed (log $AL)"; }
    grep -q 'is expired' "$AL" && die "apt in $ROOT still reports an expired Release file - check $APTCONF"
    return 0
  }
  if [[ ${APT_UPDATE:-0} == 1 ]] || ! compgen -G "$ROOT/var/lib/apt/lists/*_Packages*" >/dev/null; then apt_update; fi
  log "chroot apt-get install --no-install-recommends ${missing[*]} (log $AL)"
  if ! in_root_apt install -y --no-install-recommends "${missing[@]}" >>"$AL" 2>&1; then
    log "install failed - apt-get update and retry once"
    apt_update
    in_root_apt install -y --no-install-recommends "${missing[@]}" >>"$AL" 2>&1 \
      || { tail -n 20 "$AL" >&2; die "apt-get install ${missing[*]} in $ROOT failed (log $AL)"; }
  fi
  grep -E '^(Need to get|After this operation|Fetched)' "$AL" >&2 || true
  if [[ $KEEP_DEBS != 1 ]]; then in_root_apt clean >>"$AL" 2>&1 || die "apt-get clean in $ROOT failed"; fi
  TIME[apt_install]=$(since "$t0")
  log "packages installed in ${TIME[apt_install]}s"
fi

# ----------------------------------------------------------- 4. test files
install_if_changed() {   # install_if_changed SRCFILE DEST
  if ! cmp -s "$1" "$2" 2>/dev/null; then install -D -m 0644 "$1" "$2"; log "installed $2"; fi
}
tmpd=$(mktemp -d); trap 'cleanup; rm -rf "$tmpd"' EXIT
cat >"$tmpd/busy_loop.py" <<'EOF'
# busy_loop.py [SECONDS] [THREADS] - CPU-bound loop with a recognisable stack
# (main -> outer -> middle -> leaf), optionally in extra threads, for profiler tests.
import sys, threading, time
def leaf(n):
    x = 0
    for i in range(n): x += i
    return x
def middle(n): return leaf(n)
def outer(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end: middle(200_000)
def main():
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    nthreads = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    ths = [threading.Thread(target=outer, args=(secs,), name=f"worker{i}") for i in range(nthreads)]
    for t in ths: t.start()
    outer(secs)
    for t in ths: t.join()
if __name__ == "__main__":
    main()
EOF
install_if_changed "$tmpd/busy_loop.py" "$ROOT/opt/pyebpf/busy_loop.py"
[[ -f $WORK/busy.py ]] && install_if_changed "$WORK/busy.py" "$ROOT/opt/pyebpf/busy.py"

cat >"$tmpd/read-debug-offsets.py" <<'EOF'
#!/usr/bin/env python3
"""read-debug-offsets.py PID [PID...] - read _Py_DebugOffsets header of a running CPython (>=3.13)
from the host: locate the .PyRuntime ELF section of /proc/PID/exe, map its file offset to a
virtual address via /proc/PID/maps, read /proc/PID/mem.  Prints one JSON object per PID.
Layout (3.14/3.15): char cookie[8]; u64 version; u64 free_threaded;
                    struct { u64 size, finalizing, interpreters_head; } runtime_state."""
import json, os, struct, sys

def sections(f):
    f.seek(0); eh = f.read(64)
    assert eh[:4] == b'\x7fELF' and eh[4] == 2 and eh[5] == 1, 'need ELF64 LE'
    e_type, = struct.unpack_from('<H', eh, 16)
    shoff, = struct.unpack_from('<Q', eh, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', eh, 0x3a)
    f.seek(shoff); raw = f.read(shentsize * shnum)
    shdrs = [struct.unpack_from('<IIQQQQIIQQ', raw, i * shentsize) for i in range(shnum)]
    strtab = shdrs[shstrndx]; f.seek(strtab[4]); names = f.read(strtab[5])
    out = {}
    for name, typ, flags, addr, off, size, *_ in shdrs:
        out[names[name:names.index(b'\0', name)].decode()] = (addr, off, size)
    return e_type, out

def main(pid):
    exe = f'/proc/{pid}/exe'
    res = {'pid': pid, 'exe_link': os.readlink(exe)}
    st = os.stat(exe)
    with open(exe, 'rb') as f:
        e_type, secs = sections(f)
    res['elf_type'] = {2: 'EXEC', 3: 'DYN'}.get(e_type, e_type)
    if '.PyRuntime' not in secs:
        res['error'] = 'no .PyRuntime section'; return res
    addr, off, size = secs['.PyRuntime']
    res['section'] = {'sh_addr': hex(addr), 'sh_offset': hex(off), 'size': hex(size)}
    vaddr = None
    with open(f'/proc/{pid}/maps') as m:
        for line in m:
            p = line.split()
            if len(p) < 6: continue
            lo, hi = (int(x, 16) for x in p[0].split('-'))
            moff = int(p[2], 16); inode = int(p[4])
            if inode != st.st_ino: continue
            if moff <= off < moff + (hi - lo):
                vaddr = lo + (off - moff); res['map'] = line.strip(); break
    if vaddr is None:
        res['error'] = 'no mapping of the executable covers .PyRuntime'; return res
    res['vaddr'] = hex(vaddr)
    with open(f'/proc/{pid}/mem', 'rb') as mem:
        mem.seek(vaddr); b = mem.read(48)
    cookie, ver, ft, rs_size, rs_fin, rs_head = struct.unpack('<8sQQQQQ', b)
    res['cookie'] = cookie.decode('latin1')
    res['version_hex'] = hex(ver)
    rl = {0xA: 'a', 0xB: 'b', 0xC: 'rc', 0xF: ''}.get((ver >> 4) & 0xF, '?')
    res['version'] = f'{ver >> 24}.{(ver >> 16) & 0xff}.{(ver >> 8) & 0xff}{rl}{"" if rl == "" else ver & 0xf}'
    res['free_threaded'] = ft
    res['runtime_state'] = {'size': hex(rs_size), 'finalizing': rs_fin, 'interpreters_head': rs_head}
    return res

if __name__ == '__main__':
    rc = 0
    if sys.argv[1:] == ['--short']:   # JSON lines on stdin -> cookie/version_hex/ft=N
        for line in sys.stdin:
            d = json.loads(line)
            if d.get('cookie') != 'xdebugpy': rc = 1
            print(f"{d['cookie']}/{d['version_hex']}/ft={d['free_threaded']}" if 'cookie' in d else 'ERROR:' + d.get('error', '?'))
        sys.exit(rc)
    for a in sys.argv[1:]:
        try: r = main(int(a))
        except Exception as e: r = {'pid': int(a), 'error': f'{type(e).__name__}: {e}'}
        if 'error' in r or r.get('cookie') != 'xdebugpy': rc = 1
        print(json.dumps(r))
    sys.exit(rc)
EOF
if ! cmp -s "$tmpd/read-debug-offsets.py" "$READER" 2>/dev/null; then
  install -m 0755 "$tmpd/read-debug-offsets.py" "$READER"; log "installed $READER"
fi

# ----------------------------------------------------------------- 5. verify
VT=$LOGDIR/${SUITE}-verify.txt
fails=()
if [[ $VERIFY == 1 ]]; then
  t0=$(date +%s.%N)
  {
    echo "# provision-sid-root.sh verify $(date -Is) ROOT=$ROOT"
    printf '%-5s %-8s %-20s %-7s %-16s %-10s %-10s %-8s %-6s %-38s %s\n' \
      ver version path libpy _PyRuntime PyRtSect buildid dbgfile fp debug_offsets "fp detail"
  } >"$VT.new"
  details=()
  for v in $VERSIONS; do
    rel=/usr/bin/python$v; B=$ROOT$rel
    [[ -x $B ]] || { fails+=("$v: $rel missing"); continue; }
    full=$(chroot "$ROOT" "python$v" -c 'import sys; print(sys.version)' 2>&1) \
      || { fails+=("$v: chroot $ROOT python$v does not start: $full"); continue; }
    ver=${full%% *}
    # libpython linkage
    if readelf -d "$B" | grep -q 'NEEDED.*libpython'; then libpy=shared; else libpy=static; fi
    lddout=$(chroot "$ROOT" ldd "$rel" 2>&1 | grep -c libpython || true)
    [[ $libpy == static && $lddout != 0 ]] && fails+=("$v: readelf says static but ldd shows libpython")
    # _PyRuntime symbol
    dyn=$(readelf --dyn-syms -W "$B" | awk '$8=="_PyRuntime"{print $2}')
    hassymtab=$(readelf -S -W "$B" | grep -c ' \.symtab ' || true)
    sym="${dyn:+dynsym}"; ((hassymtab)) && sym="${sym:+$sym+}symtab"; [[ -z $sym ]] && sym=none
    ((hassymtab)) || sym="$sym(stripped)"
    sect=$(readelf -S -W "$B" | awk '{for (i = 1; i <= NF; i++) if ($i == ".PyRuntime") {print $(i+2); exit}}'); [[ -n $sect ]] && sect=$(printf '0x%x' "0x$sect") || sect=none
    bid=$(readelf -n "$B" | awk '/Build ID/{print $3}')
    dbg=none; D=
    if [[ -n $bid ]]; then
      D=$ROOT/usr/lib/debug/.build-id/${bid:0:2}/${bid:2}.debug; [[ -f $D ]] && dbg=yes || D=
    fi
    # frame pointers: prologue of _PyEval_EvalFrameDefault, eh_frame CFA rules, CU producers
    efd=$(readelf --dyn-syms -W "$B" | awk '$8=="_PyEval_EvalFrameDefault"{print $2}')
    prol=$(objdump -d --no-show-raw-insn --start-address=0x"$efd" --stop-address=$((0x$efd + 16)) "$B" \
           | awk -F'\t' 'NF>=2 && $1 ~ /^ *[0-9a-f]+:/ && k < 4 {gsub(/ +/," ",$2); printf "%s; ", $2; k++}')
    if [[ $prol == *"push %rbp; mov %rsp,%rbp"* ]]; then efp=yes; else efp=no; fi
    fdes=$(readelf --debug-dump=frames "$B" 2>/dev/null | awk '/ FDE /{n++; if (c) r++; c=0} /def_cfa_register: r6/{c=1} END{if (c) r++; printf "%d/%d", r, n}')
    cfl=$(chroot "$ROOT" "python$v" -c 'import sysconfig; print(sysconfig.get_config_var("CFLAGS"))')
    [[ $cfl == *-fno-omit-frame-pointer* ]] && cflfp=yes || cflfp=no
    prodfp=n/a; cold=n/a
    if [[ -n $D ]]; then
      prodfp=$(readelf -z -p .debug_str "$D" 2>/dev/null | grep -E 'GNU C[0-9]+ .*-O[0-9s]' \
               | awk '/-fno-omit-frame-pointer/{y++} {n++} END{printf "%d/%d", y, n}')
      cold=$(readelf -s -W "$D" 2>/dev/null | awk '$8=="_PyEval_EvalFrameDefault.cold"{print "0x" $2 "+" $3}')
    fi
    # overall verdict: CFLAGS carry -fno-omit-frame-pointer, or >50% of FDEs use rbp as CFA
    r=${fdes%/*}; n=${fdes#*/}
    if [[ $cflfp == yes ]] || ((n > 0 && r * 2 > n)); then fp=yes; else fp=no; fi
    [[ $efp == yes && $fp == no ]] && fp="no*"   # eval loop itself keeps an rbp frame
    # debug offsets from a running interpreter
    chroot "$ROOT" "python$v" /opt/pyebpf/busy_loop.py 30 >/dev/null 2>&1 & pid=$!; STARTED+=("$pid")
    dbo=""; for _ in $(seq 50); do
      if [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == *python$v ]]; then
        dbo=$("$HOST_PY" "$READER" "$pid" 2>&1) && break; fi
      sleep 0.1
    done
    kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
    offs=$("$HOST_PY" "$READER" --short <<<"$dbo" 2>&1) || offs="ERROR:$offs"
    [[ $offs == xdebugpy/* ]] || fails+=("$v: debug offsets: $offs")
    printf '%-5s %-8s %-20s %-7s %-16s %-10s %-10s %-8s %-6s %-38s %s\n' "$v" "$ver" "$rel" "$libpy" "$sym" "$sect" \
      "$([[ -n $bid ]] && echo "${bid:0:8}.." || echo none)" "$dbg" "$fp" "$offs" \
      "EvalFrame-prologue-rbp=$efp eh_frame-rbp-CFA=$fdes CFLAGS-fno-omit-fp=$cflfp dbg-CU-fno-omit-fp=$prodfp" >>"$VT.new"
    details+=("$v: sys.version=$full" "$v: build-id=${bid:-none} debugfile=${D#$ROOT}" \
              "$v: _PyRuntime dynsym=${dyn:-none} .PyRuntime sh_addr=$sect" \
              "$v: _PyEval_EvalFrameDefault=0x$efd prologue: $prol" \
              "$v: _PyEval_EvalFrameDefault.cold (from debug symtab)=${cold:-none}" \
              "$v: sysconfig CFLAGS=$cfl" "$v: debug-offsets=$dbo")
  done
  { echo; printf '%s\n' "${details[@]}"; echo "fp: yes = built with frame pointers (CFLAGS or >50% FDEs rbp-based); no* = binary omits them but _PyEval_EvalFrameDefault keeps an rbp frame"; } >>"$VT.new"
  mv "$VT.new" "$VT"
  TIME[verify]=$(since "$t0")
  cat "$VT"
fi

rootsize=$(du -sxh "$ROOT" | cut -f1)
TIME[total]=$(since "$T_START")
printf '%s\tdebootstrap=%s\tapt_install=%s\tverify=%s\ttotal=%ss\troot_size=%s\n' "$(date -Is)" \
  "${TIME[debootstrap]}" "${TIME[apt_install]}" "${TIME[verify]:-skipped}" "${TIME[total]}" "$rootsize" >>"$TIMINGS"
if ((${#fails[@]})); then
  printf '  FAIL %s\n' "${fails[@]}" >&2
  die "verification failed (${#fails[@]} problem(s)); see $VT"
fi
{
  echo "root=$ROOT"; echo "suite=$SUITE"; echo "mirror=$MIRROR"; echo "packages=${PKGS[*]}"
  for v in $VERSIONS; do echo "python$v=$(chroot "$ROOT" dpkg-query -W -f='${Version}' "python$v")"; done
  echo "root_size=$rootsize"; echo "last_run=$(date -Is)"
  echo "timings: debootstrap=${TIME[debootstrap]} apt_install=${TIME[apt_install]} verify=${TIME[verify]:-skipped} total=${TIME[total]}s"
} >"$STATE"
log "OK: $ROOT ready (size $rootsize, total ${TIME[total]}s; summary $STATE)"
