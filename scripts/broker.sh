#!/usr/bin/env bash
# A RabbitMQ broker for development and tests: Debian's rabbitmq-server on 127.0.0.1 only.
#
#   scripts/broker.sh start    # installs rabbitmq-server if missing, boots it, prints the URL
#   scripts/broker.sh status   # exit 0 when it answers
#   scripts/broker.sh url      # amqp://outpost@127.0.0.1:PORT/
#   scripts/broker.sh stop
#
# A three-node cluster on loopback (`start --nodes 3`): nodes rabbit@localhost, rabbit2@localhost
# and rabbit3@localhost, node k on each port + k - 1 (AMQP, distribution, management, TLS), node 1
# in the state folder as alone, node k in STATE/nodeK; one Erlang cookie and one `outpost` user.
# Nodes 2 and 3 join node 1 at their first boot. `start` prints the nodes' URLs comma-separated
# (what --broker takes); `stop`, `status` and `url` act on every node. Quorum queues are replicated
# on all three (RabbitMQ's default group size is the cluster's nodes). `start` boots only the nodes
# that are down, so it also brings back one node that was stopped or killed.
#
# TLS (opt-in): with OUTPOST_BROKER_TLS_PORT set, the node also listens for amqps:// there, and
# `start` prints the amqps:// URL and the CA file clients verify it with. Without certificate
# paths the script makes a private CA and, signed by it, a server certificate for
# 127.0.0.1/localhost and a client certificate (for mutual TLS), once, in the state folder.
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
#   OUTPOST_BROKER_ERL_ARGS   extra flags for the node's Erlang VM, e.g. "+S 2:2" to cap its
#                             scheduler threads on a machine it shares with engines
#   OUTPOST_BROKER_LISTEN     more addresses the AMQP listener binds besides 127.0.0.1, space-
#                             separated (e.g. the host side of a veth pair in a test's network
#                             namespace; default none)
#   OUTPOST_BROKER_TLS_PORT   amqps:// port (default unset: no TLS listener)
#   OUTPOST_BROKER_TLS_CA, OUTPOST_BROKER_TLS_CERT, OUTPOST_BROKER_TLS_KEY
#                             PEM CA bundle, server certificate and key (default: generated in
#                             STATE/tls; give all three or none)
#   OUTPOST_BROKER_TLS_CLIENT_CERTS
#                             off (default: none asked for), verify (a client's certificate is
#                             verified when it sends one) or require (mutual TLS)
#   OUTPOST_BROKER_MGMT_TLS_PORT
#                             management API over https with TLS on (default 15671; 0 = off)
set -euo pipefail

NODES=""
if [ "${2:-}" = --nodes ]; then
    NODES=${3:-}
    case "$NODES" in 1 | 2 | 3 | 4 | 5) ;; *)
        echo "broker: --nodes takes 1 to 5" >&2
        exit 2
        ;;
    esac
fi
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
TLS_PORT=${OUTPOST_BROKER_TLS_PORT:-}
[ "$TLS_PORT" = 0 ] && TLS_PORT=""
TLS_DIR="$STATE/tls"
TLS_CA=${OUTPOST_BROKER_TLS_CA:-$TLS_DIR/ca.pem}
TLS_CERT=${OUTPOST_BROKER_TLS_CERT:-$TLS_DIR/server.pem}
TLS_KEY=${OUTPOST_BROKER_TLS_KEY:-$TLS_DIR/server.key}
TLS_CLIENT_CERTS=${OUTPOST_BROKER_TLS_CLIENT_CERTS:-off}
MGMT_TLS_PORT=${OUTPOST_BROKER_MGMT_TLS_PORT:-15671}
[ -n "$TLS_PORT" ] && [ "$MGMT_PORT" != 0 ] || MGMT_TLS_PORT=0
case "$TLS_CLIENT_CERTS" in
off | verify | require) ;;
*)
    echo "broker: OUTPOST_BROKER_TLS_CLIENT_CERTS must be off, verify or require" >&2
    exit 2
    ;;
esac
if [ "$DIST_PORT" -gt 65535 ]; then
    echo "broker: distribution port $DIST_PORT is past 65535: set OUTPOST_BROKER_DIST_PORT" >&2
    exit 2
fi

log() { echo "broker: $*" >&2; }

BASE_PORT=$PORT BASE_DIST_PORT=$DIST_PORT BASE_MGMT_PORT=$MGMT_PORT BASE_TLS_PORT=$TLS_PORT
BASE_MGMT_TLS_PORT=$MGMT_TLS_PORT
[ -n "$NODES" ] || NODES=$(cat "$STATE/nodes" 2>/dev/null || echo 1)
NODE=1 NODE_NAME=rabbit NODE_DIR=$STATE

# select_node K: the ports, name and folder of node K (node 1: exactly the single node's).
select_node() {
    local k=$1 off=$(($1 - 1))
    NODE=$k
    PORT=$((BASE_PORT + off))
    DIST_PORT=$((BASE_DIST_PORT + off))
    [ "$BASE_MGMT_PORT" = 0 ] && MGMT_PORT=0 || MGMT_PORT=$((BASE_MGMT_PORT + off))
    [ -z "$BASE_TLS_PORT" ] && TLS_PORT="" || TLS_PORT=$((BASE_TLS_PORT + off))
    [ "$BASE_MGMT_TLS_PORT" = 0 ] && MGMT_TLS_PORT=0 || MGMT_TLS_PORT=$((BASE_MGMT_TLS_PORT + off))
    if [ "$k" = 1 ]; then
        NODE_NAME=rabbit NODE_DIR=$STATE
    else
        NODE_NAME=rabbit$k NODE_DIR=$STATE/node$k
    fi
}

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
    mkdir -p "$STATE/home" "$NODE_DIR/mnesia" "$NODE_DIR/log"
    chmod 700 "$STATE"
    # The Erlang cookie lives in $HOME; a private home keeps it out of the user's (one for all nodes).
    export HOME="$STATE/home"
    export RABBITMQ_NODENAME=$NODE_NAME@localhost
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT=$PORT
    export RABBITMQ_DIST_PORT=$DIST_PORT
    export ERL_EPMD_ADDRESS=127.0.0.1
    export ERL_EPMD_PORT=$EPMD_PORT
    local loopback="-kernel inet_dist_use_interface {127,0,0,1}"
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="$loopback ${OUTPOST_BROKER_ERL_ARGS:-}"
    # CLI tools must not start an epmd of their own (a `status` would leave one behind).
    export RABBITMQ_CTL_ERL_ARGS="$loopback -start_epmd false"
    # CLI tools take any free port instead of the fixed 35672-35682 range that concurrent
    # brokers would contend for.
    export RABBITMQ_CTL_DIST_PORT_MIN=0 RABBITMQ_CTL_DIST_PORT_MAX=0
    export RABBITMQ_CONF_ENV_FILE="$NODE_DIR/rabbitmq-env.conf"
    export RABBITMQ_CONFIG_FILE="$NODE_DIR/rabbitmq.conf"
    export RABBITMQ_ADVANCED_CONFIG_FILE="$NODE_DIR/advanced.config"
    export RABBITMQ_ENABLED_PLUGINS_FILE="$NODE_DIR/enabled_plugins"
    export RABBITMQ_MNESIA_BASE="$NODE_DIR/mnesia"
    export RABBITMQ_LOG_BASE="$NODE_DIR/log"
    export RABBITMQ_PID_FILE="$NODE_DIR/rabbit.pid"
    export ERL_CRASH_DUMP="$NODE_DIR/log/erl_crash.dump" # not the caller's working directory
}

write_config() {
    : >"$RABBITMQ_CONF_ENV_FILE" # not /etc/rabbitmq/rabbitmq-env.conf
    {
        echo "listeners.tcp.1 = 127.0.0.1:$PORT"
        local addr n=1
        for addr in ${OUTPOST_BROKER_LISTEN:-}; do
            n=$((n + 1))
            echo "listeners.tcp.$n = $addr:$PORT"
        done
        echo "loopback_users.guest = true"
        # Long generations hold their message unacked: well past any request timeout.
        echo "consumer_timeout = 86400000"
        if [ -n "$TLS_PORT" ]; then
            echo "listeners.ssl.default = 127.0.0.1:$TLS_PORT"
            echo "ssl_options.cacertfile = $TLS_CA"
            echo "ssl_options.certfile = $TLS_CERT"
            echo "ssl_options.keyfile = $TLS_KEY"
            if [ "$TLS_CLIENT_CERTS" = off ]; then
                echo "ssl_options.verify = verify_none"
                echo "ssl_options.fail_if_no_peer_cert = false"
            else
                echo "ssl_options.verify = verify_peer"
                echo "ssl_options.fail_if_no_peer_cert = $([ "$TLS_CLIENT_CERTS" = require ] && echo true || echo false)"
            fi
        fi
        if [ "$MGMT_PORT" != 0 ]; then
            echo "management.tcp.ip = 127.0.0.1"
            echo "management.tcp.port = $MGMT_PORT"
        fi
        if [ "$MGMT_TLS_PORT" != 0 ]; then
            echo "management.ssl.ip = 127.0.0.1"
            echo "management.ssl.port = $MGMT_TLS_PORT"
            echo "management.ssl.cacertfile = $TLS_CA"
            echo "management.ssl.certfile = $TLS_CERT"
            echo "management.ssl.keyfile = $TLS_KEY"
        fi
    } >"$RABBITMQ_CONFIG_FILE"
    echo "[]." >"$RABBITMQ_ADVANCED_CONFIG_FILE"
    if [ "$MGMT_PORT" != 0 ]; then
        echo "[rabbitmq_management]." >"$RABBITMQ_ENABLED_PLUGINS_FILE"
    else
        echo "[]." >"$RABBITMQ_ENABLED_PLUGINS_FILE"
    fi
}

# The generated CA signs a server certificate valid for the loopback names clients use and a
# client certificate for mutual TLS; EC keys (fast to make, fine for Erlang's ssl and OpenSSL).
write_openssl_config() {
    cat >"$TLS_DIR/openssl.cnf" <<'CONF'
[req]
distinguished_name = dn
prompt = no
[dn]
CN = outpost
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
CONF
}

# sign NAME CN: TLS_DIR/NAME.key and NAME.pem, signed by the generated CA with section [NAME].
sign() {
    local name=$1 cn=$2
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$TLS_DIR/$name.key" 2>/dev/null
    openssl req -new -config "$TLS_DIR/openssl.cnf" -key "$TLS_DIR/$name.key" -subj "/CN=$cn" \
        -out "$TLS_DIR/$name.csr"
    openssl x509 -req -in "$TLS_DIR/$name.csr" -CA "$TLS_DIR/ca.pem" -CAkey "$TLS_DIR/ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -days 825 -extfile "$TLS_DIR/openssl.cnf" \
        -extensions "$name" -out "$TLS_DIR/$name.pem" 2>/dev/null
    rm -f "$TLS_DIR/$name.csr"
}

ensure_certs() {
    local given=0
    for v in OUTPOST_BROKER_TLS_CA OUTPOST_BROKER_TLS_CERT OUTPOST_BROKER_TLS_KEY; do
        [ -n "${!v:-}" ] && given=$((given + 1))
    done
    if [ "$given" = 3 ]; then
        return 0
    elif [ "$given" != 0 ]; then
        log "give all of OUTPOST_BROKER_TLS_CA, _CERT and _KEY, or none (then they are generated)"
        exit 2
    fi
    [ -s "$TLS_DIR/ca.pem" ] && [ -s "$TLS_DIR/server.pem" ] && [ -s "$TLS_DIR/client.pem" ] && return 0
    log "generating a private CA, a server certificate for 127.0.0.1/localhost and a client certificate in $TLS_DIR"
    mkdir -p "$TLS_DIR"
    (
        umask 077
        write_openssl_config
        openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$TLS_DIR/ca.key" 2>/dev/null
        openssl req -x509 -new -config "$TLS_DIR/openssl.cnf" -extensions ca -key "$TLS_DIR/ca.key" \
            -subj "/CN=outpost development broker CA" -days 3650 -out "$TLS_DIR/ca.pem"
        sign server localhost
        sign client outpost-client
    )
    chmod 644 "$TLS_DIR/ca.pem" "$TLS_DIR/server.pem" "$TLS_DIR/client.pem"
}

ctl() { "$RMQ_BIN/rabbitmqctl" "$@"; }

running() {
    epmd -port "$EPMD_PORT" -names 2>/dev/null | grep -q "^name $NODE_NAME " && ctl -q status >/dev/null 2>&1
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
    local k urls=""
    for k in $(seq 1 "$NODES"); do
        urls="$urls${urls:+,}amqp://$USER_NAME@127.0.0.1:$((BASE_PORT + k - 1))/"
    done
    echo "$urls"
}

print_tls() {
    [ -n "$TLS_PORT" ] || return 0
    local k urls=""
    for k in $(seq 1 "$NODES"); do
        urls="$urls${urls:+,}amqps://$USER_NAME@127.0.0.1:$((BASE_TLS_PORT + k - 1))/"
    done
    echo "$urls"
    echo "CA file: $TLS_CA"
    if [ -z "${OUTPOST_BROKER_TLS_CA:-}" ]; then
        echo "client certificate: $TLS_DIR/client.pem key: $TLS_DIR/client.key"
    fi
}

# boot_node: start the selected node's VM unless it runs (not waiting for it); 1 if it was started.
boot_node() {
    setup_env
    running && return 1
    [ -z "$TLS_PORT" ] || ensure_certs
    write_config
    ensure_epmd
    rm -f "$ERL_CRASH_DUMP" # a dump seen while awaiting this boot is then this boot's
    log "starting rabbitmq-server $NODE_NAME@localhost on 127.0.0.1:$PORT (state in $NODE_DIR)"
    "$RMQ_BIN/rabbitmq-server" -detached >>"$NODE_DIR/log/startup.log" 2>&1
    return 0
}

await_node() {
    setup_env
    # await_startup fails at once while the node is not yet registered with epmd: poll it.
    local deadline=$((SECONDS + WAIT))
    until ctl -q await_startup --timeout 10 >/dev/null 2>&1; do
        # A VM that failed to boot (a port taken, say) writes its dump and exits: say so now.
        if [ -s "$ERL_CRASH_DUMP" ] && ! running; then
            log "$NODE_NAME@localhost failed to boot: $(grep -m1 '^Slogan' "$ERL_CRASH_DUMP" || true)"
            tail -n 30 "$NODE_DIR/log/startup.log" "$NODE_DIR"/log/*.log >&2 || true
            exit 1
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "the broker did not start within $WAIT s; its logs are in $NODE_DIR/log"
            tail -n 30 "$NODE_DIR/log/startup.log" "$NODE_DIR"/log/*.log >&2 || true
            exit 1
        fi
        sleep 0.5
    done
}

# join_node: the selected node (2..N) joins node 1's cluster, once.
join_node() {
    setup_env
    ctl -q cluster_status --formatter json 2>/dev/null | grep -q '"rabbit@localhost"' && return 0
    log "$NODE_NAME@localhost joins rabbit@localhost"
    ctl -q stop_app >/dev/null
    ctl -q join_cluster rabbit@localhost >/dev/null
    ctl -q start_app >/dev/null
}

cmd_start() {
    install_if_missing
    [ -s "$STATE/nodes" ] && [ "$(cat "$STATE/nodes")" != "$NODES" ] && [ -d "$STATE/mnesia" ] && {
        log "$STATE holds a $(cat "$STATE/nodes")-node broker: stop it and start it with that --nodes"
        exit 2
    }
    mkdir -p "$STATE"
    echo "$NODES" >"$STATE/nodes"
    local booted=0 k
    # Every VM first, then the waits: a clustered node waits at boot for the peers it knew.
    for k in $(seq 1 "$NODES"); do
        select_node "$k"
        if boot_node; then booted=1; fi
    done
    for k in $(seq 1 "$NODES"); do
        select_node "$k"
        await_node
    done
    for k in $(seq 2 "$NODES"); do
        select_node "$k"
        join_node
    done
    select_node 1
    setup_env
    # The config is written at boot only: never print an amqps:// URL the node does not serve.
    if [ -n "$TLS_PORT" ] && ! grep -qx "listeners.ssl.default = 127.0.0.1:$TLS_PORT" "$RABBITMQ_CONFIG_FILE"; then
        log "the running broker has no TLS listener on $TLS_PORT: stop it, then start it with TLS"
        exit 1
    fi
    # A running broker whose password file exists already has the user (ctl calls are slow).
    if [ "$booted" = 1 ] || [ ! -s "$PASSWORD_FILE" ]; then
        ensure_user
    fi
    print_url
    echo "password file: $PASSWORD_FILE"
    print_tls
    if [ "$MGMT_PORT" != 0 ]; then
        echo "management: http://127.0.0.1:$MGMT_PORT/"
    fi
    if [ "$MGMT_TLS_PORT" != 0 ]; then
        echo "management (TLS): https://127.0.0.1:$MGMT_TLS_PORT/"
    fi
}

cmd_stop() {
    local k
    for k in $(seq "$NODES" -1 1); do # node 1 last: it is the one the others joined
        select_node "$k"
        setup_env
        if running; then
            ctl -q stop "$RABBITMQ_PID_FILE" >/dev/null 2>&1 || ctl -q stop >/dev/null 2>&1 || true
        fi
    done
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
    local k
    for k in $(seq 1 "$NODES"); do
        select_node "$k"
        setup_env
        if ! running; then
            echo "stopped"
            return 1
        fi
    done
    echo "running: $(print_url)"
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
url) print_url ;;
*)
    echo "usage: $0 start|stop|status|url [--nodes N]" >&2
    exit 2
    ;;
esac
