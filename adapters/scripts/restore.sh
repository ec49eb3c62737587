#!/bin/sh
# scratchbank restore (X2), in two phases so that a refusal changes nothing:
#
#   restore.sh stage  SCRATCH TOKEN COMPRESS(z|raw) NEED_BYTES
#       Read framed stdin ("data N\n" + N bytes ... "end COUNT SHA256\n"; framed, so
#       it never waits for an EOF some transports cannot send), extract it into the
#       fresh directory PARENT/.scratchbank-staged.TOKEN (never into the scratch),
#       digest what was read, and print "scratchbank-staged COUNT SHA256", then the
#       staged tree: a line with the byte count of the stats, one "MODEHEX SIZE" line
#       per entry, then the entries' names NUL-separated in the same order (a name may
#       hold any byte but NUL and '/', a newline too).
#   restore.sh commit SCRATCH TOKEN   move the staged tree into place
#   restore.sh discard SCRATCH TOKEN  remove it
#   restore.sh list SCRATCH           the scratch's tree, in the stage's format
#
#   exit 0 done; 20 the stream broke (short, or not the bytes sent); 21 tar refused
#   (the scratch cannot be created, a member cannot be recreated, the disk is full);
#   12 cannot list.
set -u
export LC_ALL=C
op=$1
scratch=$2
parent=$(dirname "$scratch")
staged="$parent/.scratchbank-staged.${3:-none}"

list_tree() { # $1 directory, $2 work directory
    # Two walks of a tree nobody else writes (a fresh staging directory): stat's lines
    # (no names in them) and the names NUL-separated, in the same order. Not `xargs -0`:
    # BusyBox 1.35's splits names at its buffer boundaries.
    cd "$1/." 2>/dev/null || exit 12
    find . -mindepth 1 -exec stat -c '%f %s' {} + >"$2/stats" 2>/dev/null || exit 12
    find . -mindepth 1 -print0 >"$2/names" 2>/dev/null || exit 12
    wc -c <"$2/stats" | tr -d ' '
    cat "$2/stats" "$2/names"
}

unframe() { # stdin: frames; stdout: the payload; the end frame goes to $1
    while IFS= read -r frame; do
        case $frame in
        "data "*) dd bs="${frame#data }" count=1 iflag=fullblock 2>/dev/null || return 1 ;;
        "end "*)
            printf '%s\n' "${frame#end }" >"$1"
            return 0
            ;;
        *) return 1 ;;
        esac
    done
    return 1
}

stage() {
    compress=$4
    need=${5:-0}
    mkdir -p "$parent" 2>/dev/null || { echo "scratchbank: cannot create $parent" >&2; exit 21; }
    free=$(df -Pk "$parent" 2>/dev/null | awk 'NR == 2 { print $4 }')
    if [ -n "$free" ] && [ "$need" -gt $((free * 1024)) ]; then
        echo "scratchbank: $parent has $((free * 1024)) bytes free, the bank needs $need" >&2
        exit 21
    fi
    mkdir "$staged" 2>/dev/null || { echo "scratchbank: cannot create $staged" >&2; exit 21; }
    work=$(mktemp -d "${TMPDIR:-/tmp}/.sb-restore.XXXXXX" 2>/dev/null) || {
        rm -rf "$staged"
        echo "scratchbank: cannot create a work directory" >&2
        exit 21
    }
    trap 'rm -rf "$work"' EXIT
    mkfifo "$work/sum.fifo" || { rm -rf "$staged"; echo "scratchbank: cannot make a fifo" >&2; exit 21; }
    sha256sum <"$work/sum.fifo" >"$work/sum" &
    sumpid=$!
    if [ "$compress" = z ]; then flags=xzf; else flags=xf; fi
    # After tar stops (refused, or done), drain the rest so the digest covers the whole
    # stream: a refusal is then told apart from a stream that broke.
    unframe "$work/end" | tee "$work/sum.fifo" | {
        tar "$flags" - -C "$staged" -o 2>"$work/err"
        status=$?
        cat >/dev/null
        exit "$status"
    }
    rc=$?
    wait "$sumpid"
    read -r got _ <"$work/sum" 2>/dev/null || got=""
    read -r count want <"$work/end" 2>/dev/null || want="(no end frame)"
    if [ "$got" != "$want" ]; then
        echo "scratchbank: stream broke: got sha256 $got, want $want" >&2
        rm -rf "$staged"
        exit 20
    fi
    if [ "$rc" != 0 ]; then
        cat "$work/err" >&2
        rm -rf "$staged"
        exit 21
    fi
    echo "scratchbank-staged $count $got"
    list_tree "$staged" "$work"
}

commit() {
    [ -d "$staged" ] && [ ! -L "$staged" ] || { echo "scratchbank: nothing staged at $staged" >&2; exit 21; }
    if [ -e "$scratch" ] || [ -L "$scratch" ]; then
        if ! mv "$scratch" "$staged.old" 2>/dev/null; then
            # A mount point cannot be renamed: empty it and move the entries in.
            find "$scratch" -mindepth 1 -maxdepth 1 -exec rm -rf {} + 2>/dev/null
            for entry in "$staged"/* "$staged"/.[!.]* "$staged"/..?*; do
                [ -e "$entry" ] || [ -L "$entry" ] || continue
                mv "$entry" "$scratch"/ || exit 21
            done
            rm -rf "$staged"
            exit 0
        fi
    fi
    mv "$staged" "$scratch" || { mv "$staged.old" "$scratch" 2>/dev/null; exit 21; }
    rm -rf "$staged.old"
}

case $op in
stage) stage "$@" ;;
commit) commit ;;
discard) rm -rf "$staged" ;;
list)
    work=$(mktemp -d "${TMPDIR:-/tmp}/.sb-list.XXXXXX" 2>/dev/null) || exit 12
    trap 'rm -rf "$work"' EXIT
    list_tree "$scratch" "$work"
    ;;
*) exit 2 ;;
esac
