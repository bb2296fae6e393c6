#!/bin/sh
# The stand-in's entrypoint, as the official image's runs the command. Under host networking
# (compose.test.yaml sets RABBITMQ_NODE_IP_ADDRESS) the node listens on loopback only, on the ports the
# test picked; on a compose network (compose.cluster.test.yaml) on RabbitMQ's defaults, as the official
# image does. Debian's /usr/sbin wrappers run the node as the rabbitmq user, as the official image does.
set -eu
{
    if [ -n "${RABBITMQ_NODE_IP_ADDRESS:-}" ]; then
        echo "listeners.tcp.1 = ${RABBITMQ_NODE_IP_ADDRESS}:${RABBITMQ_NODE_PORT:-5672}"
        echo "management.tcp.ip = ${RABBITMQ_NODE_IP_ADDRESS}"
        echo "management.tcp.port = ${RABBITMQ_MANAGEMENT_PORT:-15672}"
    fi
    # Long generations hold their message unacked (as scripts/broker.sh sets it).
    echo "consumer_timeout = 86400000"
} >/etc/rabbitmq/conf.d/10-standin.conf
exec "$@"
