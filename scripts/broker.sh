#!/usr/bin/env bash
# A RabbitMQ broker for development and tests: Debian's rabbitmq-server on 127.0.0.1 only.
#
#   scripts/broker.sh start    # installs rabbitmq-server if missing, boots it, prints the URL
#   scripts/broker.sh status   # exit 0 when it answers
#   scripts/broker.sh url      # amqp://outpost@127.0.0.1:PORT/
#   scripts/broker.sh stop
#
# Everything the node writes (config, Mnesia data, logs, Erlang cookie, the `outpost` user's
# password) lives in one state folder, so several brokers can run side by side (tests do: free
# ports, a temp folder each). Every command is idempotent.
#
# Environment:
#   OUTPOST_BROKER_DIR        state folder (default ~/.cache/outpost/broker)
#   OUTPOST_BROKER_PORT       AMQP port (default 5672)
#   OUTPOST_BROKER_DIST_PORT  Erlang distribution port (default AMQP port + 20000, as RabbitMQ's)
#   OUTPOST_BROKER_EPMD_PORT  epmd port (default 4369)
#   OUTPOST_BROKER_MGMT_PORT  management HTTP API port (default 15672; 0 = plugin off)
#   OUTPOST_BROKER_USER       user created for clients (default outpost)
#   OUTPOST_BROKER_WAIT       seconds to wait for the boot (default 120)
set -euo pipefail

STATE=${OUTPOST_BROKER_DIR:-$HOME/.cache/outpost/broker}
PORT=${OUTPOST_BROKER_PORT:-5672}
DIST_PORT=${OUTPOST_BROKER_DIST_PORT:-$((PORT + 20000))}
EPMD_PORT=${OUTPOST_BROKER_EPMD_PORT:-4369}
MGMT_PORT=${OUTPOST_BROKER_MGMT_PORT:-15672}
USER_NAME=${OUTPOST_BROKER_USER:-outpost}
WAIT=${OUTPOST_BROKER_WAIT:-120}
# Debian's /usr/sbin wrappers `su` to the rabbitmq user and pin its home and log paths: call the
# real scripts so the node runs as the caller with this script's environment.
RMQ_BIN=/usr/lib/rabbitmq/bin
PASSWORD_FILE="$STATE/password"
if [ "$DIST_PORT" -gt 65535 ]; then
    echo "broker: distribution port $DIST_PORT is past 65535: set OUTPOST_BROKER_DIST_PORT" >&2
    exit 2
fi

log() { echo "broker: $*" >&2; }

install_if_missing() {
    [ -x "$RMQ_BIN/rabbitmq-server" ] && return 0
    log "rabbitmq-server is not installed; installing Debian's package"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    # The package's own service start is refused where policy-rc.d says so (containers); ours
    # never depends on it.
    if ! $sudo apt-get install -y -q -o DPkg::Lock::Timeout=600 rabbitmq-server >&2; then
        $sudo apt-get update -q -o DPkg::Lock::Timeout=600 >&2
        $sudo apt-get install -y -q -o DPkg::Lock::Timeout=600 rabbitmq-server >&2
    fi
}

setup_env() {
    mkdir -p "$STATE/home" "$STATE/mnesia" "$STATE/log"
    chmod 700 "$STATE"
    # The Erlang cookie lives in $HOME; a private home keeps it out of the user's.
    export HOME="$STATE/home"
    export RABBITMQ_NODENAME=rabbit@localhost
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT=$PORT
    export RABBITMQ_DIST_PORT=$DIST_PORT
    export ERL_EPMD_ADDRESS=127.0.0.1
    export ERL_EPMD_PORT=$EPMD_PORT
    local loopback="-kernel inet_dist_use_interface {127,0,0,1}"
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="$loopback"
    # CLI tools must not start an epmd of their own (a `status` would leave one behind).
    export RABBITMQ_CTL_ERL_ARGS="$loopback -start_epmd false"
    # CLI tools take any free port instead of the fixed 35672-35682 range that concurrent
    # brokers would contend for.
    export RABBITMQ_CTL_DIST_PORT_MIN=0 RABBITMQ_CTL_DIST_PORT_MAX=0
    export RABBITMQ_CONF_ENV_FILE="$STATE/rabbitmq-env.conf"
    export RABBITMQ_CONFIG_FILE="$STATE/rabbitmq.conf"
    export RABBITMQ_ADVANCED_CONFIG_FILE="$STATE/advanced.config"
    export RABBITMQ_ENABLED_PLUGINS_FILE="$STATE/enabled_plugins"
    export RABBITMQ_MNESIA_BASE="$STATE/mnesia"
    export RABBITMQ_LOG_BASE="$STATE/log"
    export RABBITMQ_PID_FILE="$STATE/rabbit.pid"
    export ERL_CRASH_DUMP="$STATE/log/erl_crash.dump" # not the caller's working directory
}

write_config() {
    : >"$RABBITMQ_CONF_ENV_FILE" # not /etc/rabbitmq/rabbitmq-env.conf
    {
        echo "listeners.tcp.1 = 127.0.0.1:$PORT"
        echo "loopback_users.guest = true"
        # Long generations hold their message unacked: well past any request timeout.
        echo "consumer_timeout = 86400000"
        if [ "$MGMT_PORT" != 0 ]; then
            echo "management.tcp.ip = 127.0.0.1"
            echo "management.tcp.port = $MGMT_PORT"
        fi
    } >"$RABBITMQ_CONFIG_FILE"
    echo "[]." >"$RABBITMQ_ADVANCED_CONFIG_FILE"
    if [ "$MGMT_PORT" != 0 ]; then
        echo "[rabbitmq_management]." >"$RABBITMQ_ENABLED_PLUGINS_FILE"
    else
        echo "[]." >"$RABBITMQ_ENABLED_PLUGINS_FILE"
    fi
}

ctl() { "$RMQ_BIN/rabbitmqctl" "$@"; }

running() {
    epmd -port "$EPMD_PORT" -names 2>/dev/null | grep -q '^name rabbit ' && ctl -q status >/dev/null 2>&1
}

ensure_epmd() {
    # Remember whether epmd was ours, so `stop` kills only an epmd this script started.
    if epmd -port "$EPMD_PORT" -names >/dev/null 2>&1; then
        return 0
    fi
    epmd -address 127.0.0.1 -port "$EPMD_PORT" -daemon
    touch "$STATE/epmd.ours"
}

ensure_user() {
    if [ ! -s "$PASSWORD_FILE" ]; then
        (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=\n' >"$PASSWORD_FILE")
    fi
    chmod 600 "$PASSWORD_FILE"
    local password
    password=$(cat "$PASSWORD_FILE")
    # The password goes through stdin, never argv (ps would show it).
    if ctl -q list_users | awk '{print $1}' | grep -qx "$USER_NAME"; then
        printf '%s\n' "$password" | ctl -q change_password "$USER_NAME" >/dev/null
    else
        printf '%s\n' "$password" | ctl -q add_user "$USER_NAME" >/dev/null
    fi
    ctl -q set_user_tags "$USER_NAME" administrator >/dev/null
    ctl -q set_permissions -p / "$USER_NAME" '.*' '.*' '.*' >/dev/null
}

print_url() {
    echo "amqp://$USER_NAME@127.0.0.1:$PORT/"
}

cmd_start() {
    install_if_missing
    setup_env
    local booted=0
    if ! running; then
        booted=1
        write_config
        ensure_epmd
        log "starting rabbitmq-server on 127.0.0.1:$PORT (state in $STATE)"
        "$RMQ_BIN/rabbitmq-server" -detached >>"$STATE/log/startup.log" 2>&1
        # await_startup fails at once while the node is not yet registered with epmd: poll it.
        local deadline=$((SECONDS + WAIT))
        until ctl -q await_startup --timeout 10 >/dev/null 2>&1; do
            if [ "$SECONDS" -ge "$deadline" ]; then
                log "the broker did not start within $WAIT s; its logs are in $STATE/log"
                tail -n 30 "$STATE/log/startup.log" "$STATE"/log/*.log >&2 || true
                exit 1
            fi
            sleep 0.5
        done
    fi
    # A running broker whose password file exists already has the user (ctl calls are slow).
    if [ "$booted" = 1 ] || [ ! -s "$PASSWORD_FILE" ]; then
        ensure_user
    fi
    print_url
    echo "password file: $PASSWORD_FILE"
    if [ "$MGMT_PORT" != 0 ]; then
        echo "management: http://127.0.0.1:$MGMT_PORT/"
    fi
}

cmd_stop() {
    setup_env
    if running; then
        ctl -q stop "$RABBITMQ_PID_FILE" >/dev/null 2>&1 || ctl -q stop >/dev/null 2>&1 || true
    fi
    if [ -f "$STATE/epmd.ours" ]; then
        # epmd refuses to die while a node is registered; ours unregisters as its VM exits.
        local tries=0
        until epmd -port "$EPMD_PORT" -kill >/dev/null 2>&1; do
            if ! epmd -port "$EPMD_PORT" -names >/dev/null 2>&1; then
                break # already gone
            fi
            tries=$((tries + 1))
            if [ "$tries" -ge 40 ]; then
                log "epmd on port $EPMD_PORT still has nodes registered; leaving it running"
                return 0
            fi
            sleep 0.25
        done
        rm -f "$STATE/epmd.ours"
    fi
}

cmd_status() {
    setup_env
    if running; then
        echo "running: $(print_url)"
    else
        echo "stopped"
        return 1
    fi
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
url) print_url ;;
*)
    echo "usage: $0 start|stop|status|url" >&2
    exit 2
    ;;
esac
