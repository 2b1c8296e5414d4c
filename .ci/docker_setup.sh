#!/usr/bin/env bash
# Start a private Docker engine for the sandbox tests and build the minimal local image.
#
#   eval "$(.ci/docker_setup.sh)"        # start (idempotent); exports DOCKER_HOST
#   .ci/docker_setup.sh stop             # stop the engine started here
#
# stdout carries only the `export DOCKER_HOST=...` line (nothing when the engine cannot start);
# progress and reasons go to stderr. Never fails the caller: if Docker cannot start, the docker tests
# skip and print why. No image is pulled (there is no registry access): the image is a `docker import`
# of an almost empty root filesystem, and the sandbox bind-mounts the host's /usr read-only.
set -u
DIR="${AGENTRL_DOCKER_DIR:-/tmp/agentrl-docker}"
SOCK="$DIR/docker.sock"
IMAGE="${AGENTRL_DOCKER_IMAGE:-agentrl-sandbox:local}"
say() { echo "docker_setup: $*" >&2; }

if [ "${1:-}" = "stop" ]; then
  if [ -f "$DIR/dockerd.pid" ]; then
    pid="$(cat "$DIR/dockerd.pid")"
    DOCKER_HOST="unix://$SOCK" docker ps -aq --filter label=agentrl.sandbox 2>/dev/null \
      | xargs -r env DOCKER_HOST="unix://$SOCK" docker rm -f >/dev/null 2>&1
    kill "$pid" 2>/dev/null && for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null
    rm -f "$DIR/dockerd.pid"
    say "stopped dockerd (pid $pid)"
  fi
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  say "installing docker.io with apt-get"
  # keep the package's init script from starting a system-wide daemon
  policy=/usr/sbin/policy-rc.d
  created_policy=0
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created_policy=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io >"$DIR.apt.log" 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io >"$DIR.apt.log" 2>&1; }
  [ "$created_policy" = 1 ] && rm -f "$policy"
  if ! command -v dockerd >/dev/null 2>&1; then
    say "could not install docker.io (see $DIR.apt.log); docker tests will skip"
    exit 0
  fi
fi

mkdir -p "$DIR"
if ! DOCKER_HOST="unix://$SOCK" docker info >/dev/null 2>&1; then
  say "starting dockerd on $SOCK"
  rm -f "$SOCK"
  # no bridge, no iptables: containers get network_mode=none anyway, and we must not touch the host's firewall
  nohup dockerd --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
    --data-root "$DIR/data" --exec-root "$DIR/x" -H "unix://$SOCK" --pidfile "$DIR/dockerd.pid" \
    >"$DIR/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 150); do
    DOCKER_HOST="unix://$SOCK" docker info >/dev/null 2>&1 && break
    sleep 0.2
  done
  if ! DOCKER_HOST="unix://$SOCK" docker info >/dev/null 2>&1; then
    say "dockerd did not start; last log lines:"
    tail -5 "$DIR/dockerd.log" >&2
    exit 0
  fi
fi
export DOCKER_HOST="unix://$SOCK"

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "building $IMAGE (docker import of a minimal root filesystem)"
  root="$(mktemp -d)"
  mkdir -p "$root"/{usr,tmp,scratch,proc,dev,sys,etc,opt/agentrl}
  for l in bin lib lib64 sbin; do [ -L "/$l" ] && ln -s "$(readlink "/$l")" "$root/$l"; done
  echo 'nobody:x:65534:65534:nobody:/scratch:/usr/sbin/nologin' > "$root/etc/passwd"
  echo 'nogroup:x:65534:' > "$root/etc/group"
  chmod 1777 "$root/tmp" "$root/scratch"
  tar -C "$root" -c . | docker import --change 'WORKDIR /scratch' - "$IMAGE" >/dev/null \
    || say "docker import failed"
  rm -rf "$root"
fi
echo "$DOCKER_HOST" > "$DIR/docker_host"
echo "export DOCKER_HOST=$DOCKER_HOST"
