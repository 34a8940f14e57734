#!/usr/bin/env bash
# test_port_in_use.sh MXSERVE MODEL EXPECT_EXIT: holds a free port with a listening socket, then `mxserve serve
# --port` on it must answer one line naming the port, exit 1, before loading anything.
set -u
MX=$1 MODEL=$2 X=$3
fifo=$(mktemp -u)
mkfifo "$fifo"
trap 'rm -f "$fifo"; [ -n "${holder:-}" ] && kill "$holder" 2>/dev/null' EXIT
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
time.sleep(60)' >"$fifo" &
holder=$!
read -r port <"$fifo"
"$X" 1 "^error: port $port is in use on 127.0.0.1: stop the process holding it or pass --port N\n?$" \
  -- "$MX" serve --model "$MODEL" --port "$port"
