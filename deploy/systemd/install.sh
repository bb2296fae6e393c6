#!/usr/bin/env bash
# Installs Outpost as a hardened systemd service on this machine (run as root from a checkout):
#   sudo deploy/systemd/install.sh serve|gateway|worker [--no-start]
# Puts Outpost in its own venv at /opt/outpost (llama.cpp compiled for this host's CPU), the unit in
# /etc/systemd/system, settings in /etc/outpost/<role>.env (OUTPOST_<LONG_FLAG>=value) and secrets in
# /etc/outpost (root-only; systemd hands them to the service as credentials). Existing settings and
# secrets are kept. Environment: PREFIX (/opt/outpost), ETC (/etc/outpost), UNITDIR (/etc/systemd/system).
set -euo pipefail
role=${1:-}
start=yes
[ "${2:-}" = --no-start ] && start=no
case "$role" in serve | gateway | worker) ;; *) echo "usage: $0 serve|gateway|worker [--no-start]" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "install.sh: run as root (sudo)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
PREFIX=${PREFIX:-/opt/outpost}
ETC=${ETC:-/etc/outpost}
UNITDIR=${UNITDIR:-/etc/systemd/system}

if [ ! -x "$PREFIX/bin/outpost" ]; then
  python3 -m venv "$PREFIX"
  "$PREFIX/bin/pip" install -q "$repo"
fi

install -d -m 0755 "$ETC"
secret() { # name, content-generating command: create a root-only secret file unless it exists
  [ -e "$ETC/$1" ] || { (umask 077; "${@:2}" > "$ETC/$1"); echo "install.sh: wrote $ETC/$1" >&2; }
}
case "$role" in
  serve | gateway) secret api_keys python3 -c 'import secrets; print(secrets.token_hex(16))' ;;
esac
case "$role" in
  gateway | worker) secret broker_password printf '%s' "${OUTPOST_BROKER_PASSWORD:?set OUTPOST_BROKER_PASSWORD to the broker password once}" ;;
esac
if [ ! -e "$ETC/$role.env" ]; then
  {
    echo "# outpost $role settings: OUTPOST_<LONG_FLAG>=value (outpost $role --help lists them)"
    echo "OUTPOST_MODEL=${OUTPOST_MODEL:-smollm2:135m}"
    case "$role" in
      serve) echo "OUTPOST_HOST=0.0.0.0"; echo "OUTPOST_PORT=8080" ;;
      gateway) echo "OUTPOST_BROKER=${OUTPOST_BROKER:-amqp://outpost@127.0.0.1:5672/}"; echo "OUTPOST_HOST=0.0.0.0"; echo "OUTPOST_PORT=8080" ;;
      worker) echo "OUTPOST_BROKER=${OUTPOST_BROKER:-amqp://outpost@127.0.0.1:5672/}" ;;
    esac
  } > "$ETC/$role.env"
  echo "install.sh: wrote $ETC/$role.env" >&2
fi
sed "s|/opt/outpost/bin/outpost|$PREFIX/bin/outpost|; s|/etc/outpost/|$ETC/|g" \
  "$here/outpost-$role.service" > "$UNITDIR/outpost-$role.service"
echo "install.sh: installed $UNITDIR/outpost-$role.service" >&2
if [ "$start" = yes ]; then
  systemctl daemon-reload
  systemctl enable --now "outpost-$role.service"
  systemctl --no-pager status "outpost-$role.service" | head -5
fi
