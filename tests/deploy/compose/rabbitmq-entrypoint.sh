#!/bin/sh
# The stand-in's entrypoint: the ports the test picked (host networking, loopback only), then the
# command, as the official image's entrypoint runs it. Debian's /usr/sbin wrappers run the node as
# the rabbitmq user, as the official image does.
set -eu
{
    echo "listeners.tcp.1 = 127.0.0.1:${RABBITMQ_NODE_PORT:-5672}"
    echo "management.tcp.ip = 127.0.0.1"
    echo "management.tcp.port = ${RABBITMQ_MANAGEMENT_PORT:-15672}"
    # Long generations hold their message unacked (as scripts/broker.sh sets it).
    echo "consumer_timeout = 86400000"
} >/etc/rabbitmq/conf.d/10-standin.conf
exec "$@"
