#!/bin/sh
# usage: unreachable_peer.sh EXPECT DISTRAIN
# worker/1 of a two-worker cluster whose worker/0 never starts: exit 1 within the connect
# deadline, one line naming worker/0 and its address.
set -u
expect=$1
distrain=$2
ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')
set -- $ports
export DIST_CLUSTER_TOKEN=unreachable-peer-test-token
export TF_CONFIG="{\"cluster\":{\"worker\":[\"127.0.0.1:$1\",\"127.0.0.1:$2\"]},\"task\":{\"type\":\"worker\",\"index\":1}}"
exec "$expect" 1 "worker/0 at 127.0.0.1:$1" "$distrain" --strategy multi_worker --quiet \
    --connect-timeout 2
