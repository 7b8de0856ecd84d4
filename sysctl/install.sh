#!/bin/sh
# Installs tether's OS profile (docs/operations.md, OS profile):
#   sysctl/99-tether.conf        -> /etc/sysctl.d/99-tether.conf
#   (nf_conntrack_max, only where /proc/sys/net/netfilter/nf_conntrack_max exists)
#                                -> /etc/sysctl.d/99-tether-conntrack.conf
#   sysctl/limits.d/tether.conf  -> /etc/security/limits.d/tether.conf
#   systemd/tether.service       -> /etc/systemd/system/tether.service
#   systemd/tether.toml          -> /etc/tether/tether.toml (only if absent; never overwritten)
#   --bin PATH                   -> /usr/local/bin/tether
# and creates the `tether` system user if absent.
#
# Installing does not change the running kernel: the profile applies at next boot, or at once
# with --apply (sysctl --system, systemctl daemon-reload). The service is never enabled or
# started; that stays the operator's choice (systemctl enable --now tether).
#
# "At least" keys (fs.file-max, fs.nr_open, backlogs, tw buckets, conntrack) are never
# lowered: where the running kernel already has a higher value, the installed copy keeps that
# line commented out, so a distribution's larger default keeps winning.
#
# Usage: sysctl/install.sh [--dry-run] [--apply] [--root DIR] [--bin PATH]
#   --dry-run   print every action and the resulting settings; change nothing (safe in CI)
#   --apply     after installing, run `sysctl --system` and `systemctl daemon-reload`
#   --root DIR  install under DIR instead of / (staging, packaging, tests); implies no user
#               creation, no ownership changes and no --apply
#   --bin PATH  also install the tether binary at PATH as /usr/local/bin/tether
set -eu

usage() {
    sed -n '2,/^set -eu$/p' "$0" | sed -e '/^set -eu$/d' -e 's/^# \{0,1\}//'
}

DRY=0
APPLY=0
ROOT=/
BIN=
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) DRY=1 ;;
        --apply) APPLY=1 ;;
        --root) [ $# -ge 2 ] || { echo "install.sh: --root needs a directory" >&2; exit 2; }; ROOT=$2; shift ;;
        --root=*) ROOT=${1#--root=} ;;
        --bin) [ $# -ge 2 ] || { echo "install.sh: --bin needs a path" >&2; exit 2; }; BIN=$2; shift ;;
        --bin=*) BIN=${1#--bin=} ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
PROFILE=$HERE/99-tether.conf
LIMITS=$HERE/limits.d/tether.conf
UNIT=$REPO/systemd/tether.service
EXAMPLE=$REPO/systemd/tether.toml
for f in "$PROFILE" "$LIMITS" "$UNIT" "$EXAMPLE"; do
    [ -f "$f" ] || { echo "install.sh: missing $f" >&2; exit 1; }
done
[ -z "$BIN" ] || [ -f "$BIN" ] || { echo "install.sh: no binary at $BIN" >&2; exit 1; }

# Destination paths under ROOT, without a doubled slash for ROOT=/.
ROOT=${ROOT%/}
if [ -n "$ROOT" ] && [ "$APPLY" = 1 ]; then
    echo "install.sh: --apply changes the running system and cannot be combined with --root" >&2
    exit 2
fi
if [ -z "$ROOT" ] && [ "$DRY" = 0 ] && [ "$(id -u)" != 0 ]; then
    echo "install.sh: run as root (or use --dry-run, or --root DIR to stage)" >&2
    exit 1
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tether-install.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM

say() { printf '%s\n' "$*"; }

# The command line as a shell would read it back (arguments with spaces quoted).
show_cmd() {
    for a in "$@"; do
        case $a in
            *[[:space:]]*) printf "'%s' " "$a" ;;
            *) printf '%s ' "$a" ;;
        esac
    done
}

# Runs a command, or prints it under --dry-run.
run() {
    if [ "$DRY" = 1 ]; then
        say "would run: $(show_cmd "$@")"
    else
        say "+ $(show_cmd "$@")"
        "$@"
    fi
}

RAISE_ONLY=" fs.file-max fs.nr_open net.core.somaxconn net.ipv4.tcp_max_syn_backlog net.core.netdev_max_backlog net.ipv4.tcp_max_tw_buckets net.netfilter.nf_conntrack_max "

is_number() {
    case $1 in ''|*[!0-9]*) return 1 ;; *) return 0 ;; esac
}

# Copies a sysctl file from stdin to stdout, commenting out "at least" keys whose running value
# is already higher.
raise_only() {
    while IFS= read -r line || [ -n "$line" ]; do
        case $line in
            ''|'#'*|';'*) say "$line"; continue ;;
        esac
        key=$(say "$line" | sed 's/[[:space:]]*=.*//')
        val=$(say "$line" | sed 's/^[^=]*=[[:space:]]*//')
        case $RAISE_ONLY in
            *" $key "*) ;;
            *) say "$line"; continue ;;
        esac
        cur=$(cat "/proc/sys/$(say "$key" | tr . /)" 2>/dev/null || true)
        if is_number "$cur" && is_number "$val" && [ "$cur" -gt "$val" ]; then
            say "# install.sh kept the running value $cur (higher than the profile's $val):"
            say "# $line"
            say "keeping $key = $cur (profile: $val)" >&2
        else
            say "$line"
        fi
    done
}

# Installs SRC as DEST with MODE (creating parent directories), or says so under --dry-run.
put() {
    src=$1 dest=$ROOT$2 mode=$3
    run mkdir -p "$(dirname "$dest")"
    run install -m "$mode" "$src" "$dest"
}

# Prints the settings lines of a sysctl file (dry-run summary).
settings() {
    grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*;' -e '^[[:space:]]*$' "$1" | sed 's/^/    /' || true
}

# 1. Kernel profile, with raise-only keys filtered against the running kernel.
raise_only <"$PROFILE" >"$TMP/99-tether.conf"
put "$TMP/99-tether.conf" /etc/sysctl.d/99-tether.conf 0644
[ "$DRY" = 0 ] || settings "$TMP/99-tether.conf"

if [ -e /proc/sys/net/netfilter/nf_conntrack_max ]; then
    {
        say "# tether: conntrack table for 1,000,000 connections; see /etc/sysctl.d/99-tether.conf."
        sed -n 's/^#@conntrack //p' "$PROFILE"
    } | raise_only >"$TMP/99-tether-conntrack.conf"
    put "$TMP/99-tether-conntrack.conf" /etc/sysctl.d/99-tether-conntrack.conf 0644
    [ "$DRY" = 0 ] || settings "$TMP/99-tether-conntrack.conf"
else
    say "nf_conntrack not loaded: skipping net.netfilter.nf_conntrack_max"
fi

# 2. PAM limits for login sessions (services get LimitNOFILE from the unit).
put "$LIMITS" /etc/security/limits.d/tether.conf 0644

# 3. The service user: no login, no home, owns nothing but its process.
if [ -n "$ROOT" ]; then
    say "staging under $ROOT: not creating the tether user"
elif getent passwd tether >/dev/null 2>&1; then
    say "user tether exists"
else
    nologin=/usr/sbin/nologin
    [ -x "$nologin" ] || nologin=/sbin/nologin
    [ -x "$nologin" ] || nologin=/bin/false
    run useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell "$nologin" --comment "tether WebSocket server" tether
fi

# 4. Unit and binary.
put "$UNIT" /etc/systemd/system/tether.service 0644
[ -z "$BIN" ] || put "$BIN" /usr/local/bin/tether 0755

# 5. Config: never overwrite an operator's file. Readable by the service user only (a Redis URL
#    may carry a password).
if [ -e "$ROOT/etc/tether/tether.toml" ]; then
    say "keeping existing $ROOT/etc/tether/tether.toml"
else
    put "$EXAMPLE" /etc/tether/tether.toml 0640
    [ -n "$ROOT" ] || run chown root:tether /etc/tether/tether.toml
fi

# 6. Apply only when asked.
if [ "$APPLY" = 1 ]; then
    run sysctl --system
    if [ -d /run/systemd/system ]; then
        run systemctl daemon-reload
    else
        say "systemd is not running: skipping daemon-reload"
    fi
    say "next: systemctl enable --now tether; tether check-limits --config /etc/tether/tether.toml"
else
    say "installed, not applied: run 'sysctl --system' (or reboot) and 'systemctl daemon-reload'"
    say "then: systemctl enable --now tether; check with: tether check-limits --config /etc/tether/tether.toml"
fi
