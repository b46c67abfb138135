#!/usr/bin/env bash
# Install (Debian packages) and start PostgreSQL and Redis on 127.0.0.1:5432 / :6379, for `make test`
# and CI on a machine that has neither. Starts nothing that already answers; installs nothing present.
# Needs root (or password-less sudo) only when something must be installed or started.
#   deploy/services.sh            PostgreSQL + Redis
#   deploy/services.sh chromium   ... and Debian's Chromium for the browser tests
#   deploy/services.sh promtool   ... and promtool (from Debian's prometheus package, without the server), so
#                                 tests/deploy/test_alerts.py also runs `promtool check rules` on the alerting rules
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi

want=()
command -v pg_ctlcluster >/dev/null 2>&1 && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || want+=(postgresql)
command -v redis-server >/dev/null 2>&1 || want+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || want+=(redis-tools)
if [ "${1:-}" = chromium ] && ! command -v chromium >/dev/null 2>&1; then want+=(chromium); fi

if [ ${#want[@]} -gt 0 ]; then
  echo "services: installing ${want[*]} (apt-get)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
fi

# promtool alone: the package's .deb is fetched and only /usr/bin/promtool taken out of it (no server, no service).
if [ "${1:-}" = promtool ] && ! command -v promtool >/dev/null 2>&1; then
  echo "services: installing promtool (from Debian's prometheus package)"
  tmp="$(mktemp -d)"
  $SUDO apt-get update -qq
  (cd "$tmp" && $SUDO apt-get download -qq prometheus && dpkg-deb --fsys-tarfile prometheus_*.deb \
    | tar -xf - -C "$tmp" ./usr/bin/promtool)
  $SUDO install -m 0755 "$tmp/usr/bin/promtool" /usr/local/bin/promtool
  $SUDO rm -rf "$tmp"
fi

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# PostgreSQL: the packaged cluster (made by the package's postinst; made here if it is missing).
if ! up 5432; then
  version="$(ls /usr/lib/postgresql | sort -V | tail -1)"
  if [ -z "$(ls /etc/postgresql/"$version" 2>/dev/null)" ]; then
    $SUDO pg_createcluster "$version" main >/dev/null
  fi
  cluster="$(ls /etc/postgresql/"$version" | head -1)"
  hba="/etc/postgresql/$version/$cluster/pg_hba.conf"
  # Development and CI connect as postgres over loopback without a password (postgres://postgres@127.0.0.1).
  if ! $SUDO grep -q '^# gpu-portal: loopback' "$hba"; then
    $SUDO sed -i '1i # gpu-portal: loopback connections of the postgres role, for tests and make run\nhost all postgres 127.0.0.1/32 trust\nhost all postgres ::1/128 trust' "$hba"
  fi
  $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" "$cluster" start
  for _ in $(seq 50); do up 5432 && break; sleep 0.2; done
  echo "services: PostgreSQL $version started on 127.0.0.1:5432"
else
  echo "services: PostgreSQL already answers on 127.0.0.1:5432"
fi

# Redis: a throw-away instance (no persistence).
if ! up 6379; then
  $SUDO mkdir -p /var/lib/redis /var/log/redis
  $SUDO redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/gpu-portal.log
  for _ in $(seq 50); do up 6379 && break; sleep 0.2; done
  echo "services: Redis started on 127.0.0.1:6379"
else
  echo "services: Redis already answers on 127.0.0.1:6379"
fi

up 5432 || { echo "services: PostgreSQL did not come up" >&2; exit 1; }
up 6379 || { echo "services: Redis did not come up" >&2; exit 1; }
