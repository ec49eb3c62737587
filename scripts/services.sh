# Sourced by ./dev test. Installs (when missing) and starts what the integration
# tests need, and exports where each one is. Under CI=true an engine or server that
# cannot start fails the run; elsewhere it is reported and its tests skip.
#
#   Docker engine      SCRATCHBANK_DOCKER_URL     (images scratchbank-busybox:test, scratchbank-gnu:test)
#   Podman API socket  SCRATCHBANK_PODMAN_URL     (same images, localhost/...)
#   S3 (moto server)   SCRATCHBANK_S3_ENDPOINT
#   PostgreSQL         SCRATCHBANK_POSTGRES_URL
#   NATS (JetStream)   SCRATCHBANK_NATS_URL       (the runner's deliveries and leases)

# Each invocation's servers live in a state directory of their own (a `./dev bench` started
# while a `./dev test` runs must not remove the other's database or sockets: it did, and the
# test run's PostgreSQL was stopped mid-run); SB_STATE chooses one by hand.
SB_STATE=${SB_STATE:-$(mktemp -d /tmp/scratchbank-services.XXXXXX)}
SB_CACHE=${SB_CACHE:-/var/cache/scratchbank}
SB_PIDS=()
BUSYBOX_APPLETS="sh ash tar gzip gunzip zcat ps kill sleep ls cat mkdir rm rmdir mv cp find stat \
readlink dd head tail wc sed grep awk sort uniq cut tr env date touch chmod ln id true false \
printf echo test [ expr sha256sum md5sum xargs mktemp timeout seq sync df du nproc uname basename \
dirname realpath yes od hexdump cmp diff whoami su chown mkfifo tee"

sb_fail() {
    echo "services: $*" >&2
    if [ "${CI:-}" = "true" ]; then exit 1; fi
    return 1
}

sb_install() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v podman >/dev/null || missing+=(podman)
    [ -x /bin/busybox ] || missing+=(busybox-static)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v pigz >/dev/null || missing+=(pigz)
    [ -x /usr/lib/postgresql/15/bin/postgres ] || missing+=(postgresql)
    command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || missing+=(nats-server)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "services: installing ${missing[*]}" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" \
            >"$SB_STATE/apt.log" 2>&1 || sb_fail "apt-get install ${missing[*]} failed (see $SB_STATE/apt.log)"
    fi
}

sb_busybox_rootfs() {
    local dir="$SB_STATE/busybox-rootfs"
    rm -rf "$dir" && mkdir -p "$dir"/{bin,tmp,proc,sys,dev,etc,root,scratch-parent}
    cp /bin/busybox "$dir/bin/busybox"
    for applet in $BUSYBOX_APPLETS; do ln -sf busybox "$dir/bin/$applet"; done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$dir/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$dir/etc/group"
    chmod 1777 "$dir/tmp"
    # another invocation may be importing the cached tar: replace it whole, never rewrite it
    tar -C "$dir" -c . >"$SB_CACHE/busybox-rootfs.tar.$$" && mv "$SB_CACHE/busybox-rootfs.tar.$$" "$SB_CACHE/busybox-rootfs.tar"
}

sb_gnu_rootfs() {
    # one debootstrap for the GNU test image and the product image's base (scripts/image.sh)
    [ -s "$SB_CACHE/gnu-rootfs.tar" ] && return 0
    local dir="$SB_STATE/gnu-rootfs"
    rm -rf "$dir"
    debootstrap --variant=minbase --include=procps,python3,python3-venv,ca-certificates bookworm "$dir" >"$SB_STATE/debootstrap.log" 2>&1 \
        || { sb_fail "debootstrap failed (see $SB_STATE/debootstrap.log)"; return 1; }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -c . >"$SB_CACHE/gnu-rootfs.tar.$$" && mv "$SB_CACHE/gnu-rootfs.tar.$$" "$SB_CACHE/gnu-rootfs.tar"
    rm -rf "$dir"
}

sb_wait() {  # sb_wait SECONDS CMD...
    local n=$(( $1 * 5 )); shift
    for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
    return 1
}

sb_docker() {
    if ! docker info >/dev/null 2>&1; then
        dockerd >"$SB_STATE/dockerd.log" 2>&1 &
        sb_wait 60 docker info || { sb_fail "dockerd did not start (see $SB_STATE/dockerd.log)"; return 1; }
    fi
    for flavour in busybox gnu; do
        docker image inspect "scratchbank-$flavour:test" >/dev/null 2>&1 \
            || docker import "$SB_CACHE/$flavour-rootfs.tar" "scratchbank-$flavour:test" >/dev/null \
            || { sb_fail "docker import $flavour failed"; return 1; }
    done
    export SCRATCHBANK_DOCKER_URL=unix:///var/run/docker.sock
}

sb_podman() {
    cat >"$SB_STATE/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
CONF
    export CONTAINERS_CONF="$SB_STATE/containers.conf"
    for flavour in busybox gnu; do
        podman image exists "localhost/scratchbank-$flavour:test" \
            || podman import -q "$SB_CACHE/$flavour-rootfs.tar" "localhost/scratchbank-$flavour:test" >/dev/null \
            || { sb_fail "podman import $flavour failed"; return 1; }
    done
    local sock="$SB_STATE/podman.sock"
    rm -f "$sock"
    podman system service --time=0 "unix://$sock" >"$SB_STATE/podman.log" 2>&1 &
    SB_PIDS+=($!)
    sb_wait 30 curl -sf --unix-socket "$sock" http://d/_ping \
        || { sb_fail "podman service did not start (see $SB_STATE/podman.log)"; return 1; }
    export SCRATCHBANK_PODMAN_URL="unix://$sock"
}

sb_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

sb_s3() {
    local port; port=$(sb_free_port)
    local moto="${VENV:-.venv}/bin/moto_server"
    [ -x "$moto" ] || { sb_fail "moto_server missing from the venv"; return 1; }
    "$moto" -H 127.0.0.1 -p "$port" >"$SB_STATE/moto.log" 2>&1 &
    SB_PIDS+=($!)
    sb_wait 30 curl -sf "http://127.0.0.1:$port/" || { sb_fail "moto server did not start"; return 1; }
    export SCRATCHBANK_S3_ENDPOINT="http://127.0.0.1:$port"
}

sb_postgres() {
    local bin=/usr/lib/postgresql/15/bin dir="$SB_STATE/pg" port; port=$(sb_free_port)
    rm -rf "$dir" && mkdir -p "$dir" && chown postgres "$dir"
    su postgres -c "$bin/initdb -D $dir/data -U postgres --auth=trust" >"$SB_STATE/pg-init.log" 2>&1 \
        || { sb_fail "initdb failed (see $SB_STATE/pg-init.log)"; return 1; }
    su postgres -c "$bin/pg_ctl -D $dir/data -o '-k $dir -p $port -c listen_addresses=127.0.0.1 -c max_connections=600' -l $dir/log -w start" \
        >"$SB_STATE/pg-start.log" 2>&1 || { sb_fail "postgres did not start (see $dir/log)"; return 1; }
    SB_PG_DIR="$dir"
    export SCRATCHBANK_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/postgres"
}

sb_nats() {
    local bin port dir="$SB_STATE/nats"; port=$(sb_free_port)
    bin=$(command -v nats-server || echo /usr/sbin/nats-server)
    [ -x "$bin" ] || { sb_fail "nats-server missing (apt-get install nats-server)"; return 1; }
    rm -rf "$dir" && mkdir -p "$dir"
    "$bin" -js -a 127.0.0.1 -p "$port" -sd "$dir" >"$SB_STATE/nats.log" 2>&1 &
    SB_PIDS+=($!)
    sb_wait 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" \
        || { sb_fail "nats-server did not start (see $SB_STATE/nats.log)"; return 1; }
    export SCRATCHBANK_NATS_URL="nats://127.0.0.1:$port"
}

start_services() {
    mkdir -p "$SB_STATE" "$SB_CACHE"
    chmod 755 "$SB_STATE"  # mktemp -d makes it 0700: the postgres user must reach its pg/
    sb_install || true
    sb_busybox_rootfs
    sb_gnu_rootfs || true
    sb_docker || true
    sb_podman || true
    sb_s3 || true
    sb_postgres || true
    sb_nats || true
    echo "services: docker=${SCRATCHBANK_DOCKER_URL:-none} podman=${SCRATCHBANK_PODMAN_URL:-none}" \
         "s3=${SCRATCHBANK_S3_ENDPOINT:-none} postgres=${SCRATCHBANK_POSTGRES_URL:-none}" \
         "nats=${SCRATCHBANK_NATS_URL:-none}" >&2
}

stop_services() {
    for pid in "${SB_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    if [ -n "${SB_PG_DIR:-}" ]; then
        su postgres -c "/usr/lib/postgresql/15/bin/pg_ctl -D $SB_PG_DIR/data -m fast stop" >/dev/null 2>&1 || true
        rm -rf "$SB_PG_DIR/data"  # ~40 MB a run; the logs stay in $SB_STATE
    fi
}
