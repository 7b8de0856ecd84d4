#!/usr/bin/env bash
# RFC 6455 conformance: run the Autobahn|Testsuite fuzzing client (`wstest -m fuzzingclient`)
# against a WebSocket echo URL and print one summary line on stdout:
#
#   autobahn: N passed (OK/NON-STRICT/INFORMATIONAL), M failed, K unimplemented
#
# Exits 0 only when no planned case failed; a planned case without a result (the server died,
# refused the connection, wstest was killed) counts as failed. Exits 2 when the suite cannot be
# set up or the arguments are wrong. tests/autobahn_conformance.rs runs it against
# `tether serve --echo`; benches/autobahn_perf.sh runs the 9.* cases with it.
#
# Usage: scripts/autobahn.sh [options] ws://HOST:PORT/PATH
#   --cases LIST      comma-separated case patterns to run            (default "*")
#   --exclude LIST    comma-separated case patterns to skip           (default "9.*,12.*,13.*":
#                     9.* are the large-message performance cases, 12.*/13.* permessage-deflate,
#                     ~20 min in all: tests/autobahn_conformance.rs runs a subset of them)
#   --full            run every case (--exclude '')
#   --out DIR         report directory (default: a new temporary one); DIR/index.html is the report
#   --agent NAME      the server's name in the report                 (default "server")
#   --timeout SECS    stop wstest after SECS                           (default 900)
#   --lenient-close   accept a case whose close behaviour is not OK    (default: strict)
#
# Set-up, on first use (about 30 s; kept in $AUTOBAHN_HOME, default ~/.cache/autobahn-testsuite):
# autobahntestsuite is Python 2.7 code and Debian 12 has no Python 2. The script takes
# python2.7 from Debian 11 (bullseye) on the mirror this machine's apt already uses, with a
# private apt state in a temporary directory (the system's apt configuration and packages are
# not touched), unpacks the .debs with `dpkg -x`, bootstraps pip from bullseye's wheels, and
# installs autobahntestsuite and its dependencies at pinned versions from PyPI. Nothing else is
# downloaded. Needs apt-get, dpkg, python3 (for the spec and the summary) and a C compiler
# (a few dependencies build small extensions).
set -euo pipefail

die() { echo "autobahn.sh: $*" >&2; exit 2; }

home="${AUTOBAHN_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/autobahn-testsuite}"
root="$home/root"
python2="$root/usr/bin/python2.7"
wstest="$root/usr/local/bin/wstest"
export LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

cases="*"
exclude="9.*,12.*,13.*"
out=""
agent="server"
timeout_s=900
strict_close=1
url=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cases) [ $# -ge 2 ] || die "--cases needs a value"; cases="$2"; shift ;;
    --exclude) [ $# -ge 2 ] || die "--exclude needs a value"; exclude="$2"; shift ;;
    --full) exclude="" ;;
    --out) [ $# -ge 2 ] || die "--out needs a value"; out="$2"; shift ;;
    --agent) [ $# -ge 2 ] || die "--agent needs a value"; agent="$2"; shift ;;
    --timeout) [ $# -ge 2 ] || die "--timeout needs a value"; timeout_s="$2"; shift ;;
    --lenient-close) strict_close=0 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    ws://* | wss://*) url="$1" ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done
[ -n "$url" ] || die "usage: $0 [options] ws://HOST:PORT/PATH"
for tool in python3 timeout; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is needed"
done

# Python 2.7 and the suite, pinned. autobahntestsuite's sdist carries no requirements, so every
# dependency is named here, at the versions its own pins resolved to (2026-11).
suite_packages=(
  autobahntestsuite==25.10.1 autobahn==0.10.9 Twisted==19.10.0 txaio==2.1.0 zope.interface==4.6.0
  attrs==21.4.0 Automat==22.10.0 constantly==15.1.0 hyperlink==21.0.0 incremental==16.10.1
  idna==2.10 six==1.16.0 enum34==1.1.10 ipaddress==1.0.23 typing==3.10.0.0
  cryptography==3.3.2 cffi==1.15.1 pycparser==2.21 pyOpenSSL==19.1.0 service-identity==18.1.0
  pyasn1==0.5.1 pyasn1-modules==0.3.0 PyHamcrest==1.10.1
  klein==17.10.0 Werkzeug==1.0.1 Jinja2==2.11.3 MarkupSafe==1.1.1
  unittest2==1.1.0 traceback2==1.4.0 linecache2==1.0.0 ujson==2.0.3 wsaccel==0.6.6
  setuptools==44.0.0
)
bullseye_debs=(
  python2.7 python2.7-minimal libpython2.7 libpython2.7-minimal libpython2.7-stdlib
  python2.7-dev libpython2.7-dev libssl1.1 libffi7 python-pip-whl
)

suite_ready() {
  [ -x "$wstest" ] && "$python2" -c 'import autobahntestsuite, autobahn, twisted' >/dev/null 2>&1
}

debian_mirror() {
  # The first http(s)://…/debian URI of the apt sources (one-line or deb822 format).
  cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null |
    grep -oE '(https?)://[^[:space:]]+/debian/?([[:space:]]|$)' | head -n 1 | tr -d '[:space:]' || true
}

set_up() {
  command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 ||
    die "setting up needs apt-get and dpkg (a Debian machine)"
  command -v cc >/dev/null 2>&1 || die "setting up needs a C compiler (apt-get install gcc)"
  local started=$SECONDS mirror apt_dir
  mirror="$(debian_mirror)"
  [ -n "$mirror" ] || die "no Debian mirror in /etc/apt/sources.list{,.d/}"
  echo "autobahn.sh: setting up $home: python2.7 from ${mirror%/} bullseye, the suite from PyPI" >&2
  apt_dir="$(mktemp -d -t autobahn-apt.XXXXXX)"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror%/} bullseye main" \
    >"$apt_dir/sources.list"
  local apt=(apt-get -qq
    -o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache::Archives=$apt_dir/archives"
    -o "APT::Sandbox::User=root")
  "${apt[@]}" update >&2 || die "apt-get update of bullseye from $mirror failed"
  (cd "$apt_dir/archives" && "${apt[@]}" download "${bullseye_debs[@]}" >&2) ||
    die "apt-get download of python2.7 from bullseye failed"
  rm -rf "$root"
  mkdir -p "$root"
  local deb
  for deb in "$apt_dir"/archives/*.deb; do dpkg -x "$deb" "$root"; done
  rm -rf "$apt_dir"
  # Debian's pip is debundled: start an upstream pip from the wheels python-pip-whl ships.
  local wheels
  wheels="$(printf '%s:' "$root"/usr/share/python-wheels/*.whl)"
  PYTHONPATH="$wheels" "$python2" -m pip install -q --no-python-version-warning \
    --no-warn-script-location --ignore-installed pip==20.3.4 setuptools==44.1.1 wheel==0.37.1 >&2 ||
    die "bootstrapping pip for python2.7 failed"
  CFLAGS="-I$root/usr/include -I$root/usr/include/python2.7" \
    "$python2" -m pip install -q --no-python-version-warning --no-warn-script-location \
    "${suite_packages[@]}" >&2 || die "installing autobahntestsuite from PyPI failed"
  suite_ready || die "autobahntestsuite installed but wstest does not start"
  echo "autobahn.sh: set up in $((SECONDS - started)) s" >&2
}

# Two runs at once on a fresh machine (the test binary runs its suites in parallel) must not
# install into $home together: the first takes the lock and sets up, the other waits for it and
# then finds the suite ready.
if ! suite_ready; then
  mkdir -p "$home"
  exec 9>"$home/.setup.lock"
  flock -w 900 9 || die "waited 900 s for another run's set-up ($home/.setup.lock)"
  suite_ready || set_up
  flock -u 9
  exec 9>&-
fi

[ -n "$out" ] || out="$(mktemp -d -t autobahn-report.XXXXXX)"
mkdir -p "$out"
# A previous report in the same directory is replaced; nothing else there is removed.
rm -f "$out"/index.json "$out"/index.html "$out"/*_case_*.json "$out"/*_case_*.html \
  "$out"/spec.json "$out"/wstest.log

python3 - "$out" "$url" "$agent" "$cases" "$exclude" >"$out/spec.json" <<'PY'
import json, sys
out, url, agent, cases, exclude = sys.argv[1:]
names = lambda s: [x.strip() for x in s.split(",") if x.strip()]
json.dump({"outdir": out, "servers": [{"agent": agent, "url": url}],
           "cases": names(cases) or ["*"], "exclude-cases": names(exclude),
           "exclude-agent-cases": {}}, sys.stdout, indent=2)
PY

started=$SECONDS
rc=0
(cd "$out" && timeout "$timeout_s" "$wstest" -m fuzzingclient -s "$out/spec.json") \
  >"$out/wstest.log" 2>&1 || rc=$?
took=$((SECONDS - started))
[ "$rc" -eq 0 ] || echo "autobahn.sh: wstest exited $rc after $took s (log: $out/wstest.log)" >&2

# The verdict: every case wstest planned (its log names them) must have a passing result.
python3 - "$out" "$agent" "$strict_close" "$took" <<'PY'
import json, os, re, sys
out, agent, strict_close, took = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
try:
    with open(os.path.join(out, "index.json")) as f:
        results = json.load(f).get(agent, {})
except (OSError, ValueError):
    results = {}
    print("autobahn: no readable %s/index.json (wstest stopped early?)" % out, file=sys.stderr)
with open(os.path.join(out, "wstest.log"), errors="replace") as f:
    log = f.read()
listed = re.search(r"Cases = \[(.*?)\]", log, re.S)
planned = re.findall(r"'([0-9.]+)'", listed.group(1)) if listed else sorted(results)
passed = failed = unimplemented = 0
bad = []
for case in planned:
    r = results.get(case)
    if r is None:
        failed += 1
        bad.append(case + ":NOT-RUN")
        continue
    behaviour, close = r.get("behavior"), r.get("behaviorClose")
    if behaviour == "UNIMPLEMENTED":
        unimplemented += 1
    elif behaviour in ("OK", "NON-STRICT", "INFORMATIONAL") and (
            not strict_close or close in ("OK", "INFORMATIONAL")):
        passed += 1
    else:
        failed += 1
        bad.append("%s:%s/%s" % (case, behaviour, close))
if not planned:
    failed += 1
    refused = re.search(r"Connection to .* failed.*", log)
    bad.append("no case ran" + (" (%s)" % refused.group(0) if refused else " (server unreachable?)"))
if bad:
    more = " ..." if len(bad) > 40 else ""
    print("autobahn: failing cases: %s%s" % (" ".join(bad[:40]), more), file=sys.stderr)
print("autobahn: %d cases in %s s; report %s/index.html" % (len(planned), took, out), file=sys.stderr)
sys.stderr.flush()
print("autobahn: %d passed (OK/NON-STRICT/INFORMATIONAL), %d failed, %d unimplemented"
      % (passed, failed, unimplemented))
sys.exit(1 if failed else 0)
PY
