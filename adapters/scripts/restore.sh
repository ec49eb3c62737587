#!/bin/sh
# scratchbank restore (X2), in two phases so that a refusal changes nothing:
#
#   restore.sh stage  SCRATCH TOKEN COMPRESS(z|raw) NEED_BYTES [converse]
#       Read framed stdin ("data N\n" + N bytes ... "end COUNT MD5\n"; framed, so
#       it never waits for an EOF some transports cannot send), extract it into the
#       fresh directory PARENT/.scratchbank-staged.TOKEN (never into the scratch),
#       count and digest what was read (both checked against the end frame: the bank's
#       size and digest end to end, SECURITY.md), print "scratchbank-staged COUNT MD5", then the
#       staged tree: a line with the byte counts of the stats and of the names, one
#       "MODEHEX SIZE" line (stat's) or ":TYPE SIZE" line (GNU find's %y) per entry,
#       then the entries' names NUL-separated in the same order (a name may hold any
#       byte but NUL and '/', a newline too). With "converse", the line
#       "scratchbank-awaiting-verdict" ends the listing, and the same exec then
#       reads the host's verdict from stdin: "commit"
#       and the directory modes (framed, as commit reads them), or anything else (an
#       EOF too) to discard: exit 22.
#   restore.sh commit SCRATCH TOKEN   apply the directory modes read from framed stdin
#       ("OCTAL NAME" lines, deepest first, NAME escaped for printf %b, "." the root: the
#       stream carried every directory u+rwx, so that a non-root tar can fill a 0555
#       one), then move the staged tree into place
#   restore.sh discard SCRATCH TOKEN  remove it
#   restore.sh list SCRATCH           the scratch's tree, in the stage's format
#
#   exit 0 done; 22 discarded on the host's verdict; 20 the stream broke (short, or not the bytes sent); 21 tar refused
#   (the scratch cannot be created, a member cannot be recreated, the disk is full, the
#   staged tree cannot be listed by the sandbox's user, the scratch holds a mount point);
#   12 cannot list (the list op only).
#
#   The sandbox is hostile (issue 25): work files live in a directory made by mktemp -d,
#   the staged tree in a fresh mkdir'd one; every rename is mv -T (a link planted at its
#   destination is refused, never followed); leftovers are removed only when this user
#   owns them. The work files the verdict needs (the digest, the end frame, tar's messages) are written
#   in place over room taken before the extract (1<>), so a disk the bank fills still
#   tells a refusal (21) from a broken stream (20).
#
#   Every removal makes the tree writable first (chmod -R u+rwx: a non-root user owns
#   a 0555 directory but cannot empty it) and never runs over a mount point: commit
#   refuses by name, before anything moves, a scratch with a mount point inside it
#   (/proc/mounts; BusyBox has no rm --one-file-system). A commit reports success once
#   the new tree is in place; the old tree, no longer the scratch, is removed after the
#   exec ends, in the background (removing a large tree costs what extracting it did: the
#   resume does not wait for it); one a stopped sandbox left is removed by the next stage.
set -u
export LC_ALL=C
op=$1
scratch=$2
parent=$(dirname "$scratch")
staged="$parent/.scratchbank-staged.${3:-none}"

trace() { # $1 a stage's name: its end time to stderr, only when SCRATCHBANK_TRACE is set
    [ -n "${SCRATCHBANK_TRACE:-}" ] || return 0
    read -r up _ </proc/uptime && echo "scratchbank-trace $1 $up" >&2
}

walk_tree() { # $1 directory, $2 work directory; 1 when it cannot be walked
    # The entries' stats lines (no names in them) and their names NUL-separated, in the
    # same order. GNU find writes both in ONE walk (-fprintf, -fprint0): ":TYPE SIZE"
    # lines, TYPE find's %y letter. Elsewhere (BusyBox) one walk too: each name printed
    # NUL-ended to the names file as it is met, and stat's "MODEHEX SIZE" lines for the
    # same entries, batched in the same order, to the stats file (fd 3, by a shell per
    # batch: stat would otherwise share find's stdout). Not `xargs -0`: BusyBox 1.35's
    # splits names at its buffer boundaries.
    (
        cd "$1/." 2>/dev/null || exit 1
        if find . -maxdepth 0 -fprintf /dev/null '' 2>/dev/null; then
            find . -mindepth 1 -fprintf "$2/stats" ':%y %s\n' -fprint0 "$2/names" 2>/dev/null || exit 1
            exit 0
        fi
        # shellcheck disable=SC2016 # $@ is the batch's shell's
        find . -mindepth 1 -print0 -exec sh -c 'exec stat -c "%f %s" "$@" >&3' sh {} + \
            3>"$2/stats" >"$2/names" 2>/dev/null || exit 1
        trace stats
    )
}

print_tree() { # $1 work directory: "STATS_BYTES NAMES_BYTES", then both
    echo "$(wc -c <"$1/stats" | tr -d ' ') $(wc -c <"$1/names" | tr -d ' ')"
    cat "$1/stats" "$1/names"
}

remove_tree() { # $1: gone afterwards (0), or still there (1); never follows a link in it
    [ -e "$1" ] || [ -L "$1" ] || return 0
    [ -L "$1" ] || chmod -R u+rwx "$1" 2>/dev/null
    rm -rf "$1" 2>/dev/null
    [ ! -e "$1" ] && [ ! -L "$1" ]
}

real_dir() { # $1's physical path, or nothing when it is not a directory
    (cd "$1/." 2>/dev/null && pwd -P)
}

mount_inside() { # the first mount point strictly inside directory $1 (nothing: none)
    [ -L "$1" ] && return 0 # a link is replaced by name: nothing under it is removed
    real=$(real_dir "$1") || return 0
    [ -n "$real" ] || return 0
    awk -v p="${real%/}/" 'index($2, p) == 1 { print $2; exit }' /proc/mounts 2>/dev/null
}

is_mount_point() { # $1 is a directory whose filesystem is not its parent's
    [ -d "$1" ] && [ ! -L "$1" ] || return 1
    real=$(real_dir "$1") || return 1
    [ "$(stat -c %d "$1/." 2>/dev/null)" != "$(stat -c %d "$1/.." 2>/dev/null)" ] && return 0
    awk -v p="$real" '$2 == p { found = 1 } END { exit !found }' /proc/mounts 2>/dev/null
}

free_bytes() { # free bytes of the filesystem holding $1 (nothing when unknown)
    # KiB from awk, bytes from the shell: awk may print a large product as 7.01e+10
    kib=$(df -Pk "$1" 2>/dev/null | awk 'NR == 2 { print $4 }')
    case $kib in '' | *[!0-9]*) return 0 ;; esac
    echo $((kib * 1024))
}

fits() { # $1 bytes needed, $2 a path on the filesystem asked
    free=$(free_bytes "$2")
    if [ -n "$free" ] && [ "$1" -gt "$free" ]; then
        echo "scratchbank: $2 has $free bytes free, the bank needs $1" >&2
        return 1
    fi
}

reserve() { # $1: a file of 256 spaces, so that writing it in place (1<>) needs no new room
    printf '%256s\n' "" >"$1"
}

unframe() { # stdin: frames; stdout: the payload; "COUNT MD5 RECEIVED" to $1 (reserved: in place)
    # RECEIVED adds up the frames read whole: dd reads each to its full size unless the
    # stream ends first, and a stream that ends inside a frame has no end frame after it
    # (a frame lost, cut or repeated on the way shows as a missing end frame or a count
    # that is not the end frame's). A byte changed on the way keeps the count: the digest
    # of what was read (md5sum on a tee of the payload) catches it. MD5, not SHA-256: the
    # sandbox that sums is the one the bytes go to (it could print any sum), so the sum guards the way in,
    # not against the sandbox, and BusyBox's sha256sum (no SHA-NI before 1.36) was the
    # stream's slowest reader: 1.4 cpu-s a 197 MB stream, md5sum 0.44 (ADR 0003).
    got=0
    while IFS= read -r frame; do
        case $frame in
        "data "*)
            n=${frame#data }
            case $n in '' | *[!0-9]*) return 1 ;; esac
            dd bs="$n" count=1 iflag=fullblock 2>/dev/null || return 1
            got=$((got + n))
            ;;
        "end "*)
            printf '%s %s\n' "${frame#end }" "$got" 1<>"$1"
            return 0
            ;;
        *) return 1 ;;
        esac
    done
    return 1
}

gunzips() { # this sandbox inflates a gzip stream (GNU tar runs gzip -d; BusyBox has its own)
    printf '\037\213\010\000\000\000\000\000\000\377\003\000\000\000\000\000\000\000\000\000' |
        gzip -dc >/dev/null 2>&1
}

stage() {
    compress=$4
    need=${5:-0}
    converse=${6:-}
    trace start
    # Before anything is read or made: a gzipped stream into a sandbox without a gunzip
    # is a stream it cannot take (20), and the host sends it again plain (restore.py).
    if [ "$compress" = z ] && ! gunzips; then
        echo "scratchbank: no gunzip in this sandbox: send the stream plain" >&2
        exit 20
    fi
    mkdir -p "$parent" 2>/dev/null || { echo "scratchbank: cannot create $parent" >&2; exit 21; }
    remove_leftovers
    fits "$need" "$parent" || exit 21
    # A scratch that is its own filesystem (a volume, a tmpfs, an emptyDir) is filled by
    # commit: the bank must fit there too (its old tree's room is not counted).
    if is_mount_point "$scratch"; then fits "$need" "$scratch" || exit 21; fi
    mkdir "$staged" 2>/dev/null || { echo "scratchbank: cannot create $staged" >&2; exit 21; }
    work=$(mktemp -d "${TMPDIR:-/tmp}/.sb-restore.XXXXXX" 2>/dev/null) || {
        remove_tree "$staged"
        echo "scratchbank: cannot create a work directory" >&2
        exit 21
    }
    trap 'rm -rf "$work"' EXIT
    trace setup
    { reserve "$work/sum" && reserve "$work/end" && reserve "$work/err" && mkfifo "$work/sum.fifo"; } 2>/dev/null || {
        remove_tree "$staged"
        echo "scratchbank: cannot make the work files (a full disk?)" >&2
        exit 21
    }
    md5sum <"$work/sum.fifo" 1<>"$work/sum" &
    sumpid=$!
    if [ "$compress" = z ]; then flags=xzf; else flags=xf; fi
    # After tar stops (refused, or done), drain the rest so that the end frame is read
    # and the digest covers the whole stream either way: a refusal is then told apart from
    # a stream that broke. tar's messages go over a reserved file in place (their head at
    # least: the disk may be full by then).
    unframe "$work/end" | tee "$work/sum.fifo" | {
        tar "$flags" - -C "$staged" -o 2<>"$work/err"
        status=$?
        cat >/dev/null
        exit "$status"
    }
    rc=$?
    wait "$sumpid"
    trace extract
    read -r digest _ <"$work/sum" 2>/dev/null || digest=""
    read -r count sum got _ <"$work/end" 2>/dev/null || count=""
    if [ -z "$count" ] || [ "$count" != "${got:-}" ] || [ "$digest" != "$sum" ]; then
        if [ -z "$count" ]; then
            why="no end frame"
        elif [ "$count" != "${got:-}" ]; then
            why="received $got bytes of the $count sent"
        else
            why="got md5 $digest, want $sum"
        fi
        echo "scratchbank: stream broke: $why" >&2
        remove_tree "$staged"
        exit 20
    fi
    if [ "$rc" != 0 ]; then
        cat "$work/err" >&2
        remove_tree "$staged"
        exit 21
    fi
    if ! walk_tree "$staged" "$work"; then
        # The sandbox's own user cannot read what it extracted (a mode-0 directory, as
        # non-root): the sandbox refuses the bank (X4), it is not a broken stream.
        echo "scratchbank: the sandbox's user cannot list the restored tree (an unreadable directory?)" >&2
        remove_tree "$staged"
        exit 21
    fi
    trace walk
    echo "scratchbank-staged $got $digest"
    print_tree "$work"
    trace print
    [ "$converse" = converse ] || exit 0
    # The listing's end, by the shell's own printf: a flood from a replaced binary comes
    # before it, so the host refuses it before it answers.
    printf 'scratchbank-awaiting-verdict\n'
    # One exec: the host compares the listing with the bank's manifest and answers on
    # stdin: "commit" (then the directory modes, framed) or anything else to discard.
    rm -rf "$work"
    trap - EXIT
    IFS= read -r verdict || verdict=""
    trace verdict
    if [ "$verdict" = commit ]; then commit; fi
    remove_tree "$staged"
    exit 22
}

apply_modes() { # $1: "OCTAL ESCAPED-NAME" lines, deepest first
    while IFS=' ' read -r mode esc; do
        if [ "$esc" = . ]; then
            target=$staged
        else
            name=$(printf '%bX' "$esc")
            target="$staged/${name%X}"
        fi
        [ -d "$target" ] && [ ! -L "$target" ] || { echo "scratchbank: $esc is not a staged directory" >&2; return 1; }
        chmod "$mode" "$target" || return 1
    done <"$1"
}

commit() {
    [ -d "$staged" ] && [ ! -L "$staged" ] || { echo "scratchbank: nothing staged at $staged" >&2; exit 21; }
    work=$(mktemp -d "${TMPDIR:-/tmp}/.sb-commit.XXXXXX" 2>/dev/null) || { echo "scratchbank: cannot create a work directory" >&2; exit 21; }
    trap 'rm -rf "$work"' EXIT
    unframe "$work/end" >"$work/modes" || { echo "scratchbank: the directory modes did not arrive whole" >&2; exit 21; }
    apply_modes "$work/modes" || exit 21
    inside=$(mount_inside "$scratch")
    if [ -n "$inside" ]; then
        echo "scratchbank: $scratch has a mount point inside ($inside): its old tree cannot be replaced without deleting what is mounted there" >&2
        exit 21
    fi
    if is_mount_point "$scratch"; then
        commit_into_mount_point
        exit 0
    fi
    if [ -e "$scratch" ] || [ -L "$scratch" ]; then
        mv -T "$scratch" "$staged.old" 2>/dev/null || { echo "scratchbank: cannot move $scratch aside" >&2; exit 21; }
    fi
    mv -T "$staged" "$scratch" || { mv -T "$staged.old" "$scratch" 2>/dev/null; exit 21; }
    remove_later "$staged.old"
    trace commit
    exit 0
}

remove_later() { # $1 is no longer the scratch: removed after this exec ends, detached
    # from its streams (the exec's output ends now; an engine waits for it). Removing a
    # large tree costs as much as extracting it: the resume does not wait for that. A
    # tree a removal left behind (the sandbox stopped first) goes at the next stage.
    [ -e "$1" ] || [ -L "$1" ] || return 0
    (remove_tree "$1" || echo "scratchbank: note: the old scratch stays at $1" >&2) \
        </dev/null >/dev/null 2>&1 &
}

remove_leftovers() { # old scratches earlier commits left beside the scratch
    for old in "$parent"/.scratchbank-staged.*.old; do
        [ -e "$old" ] || [ -L "$old" ] || continue
        [ -O "$old" ] || continue # planted by another user: not ours to remove
        remove_later "$old"
    done
}

commit_into_mount_point() {
    # A mount point cannot be renamed: empty it and move the entries in, once the new
    # tree is known to fit (the old tree's room counted).
    used=$(du -sk "$scratch" 2>/dev/null | awk '{ print $1 }')
    want=$(du -sk "$staged" 2>/dev/null | awk '{ print $1 }')
    fits "$(((${want:-0} - ${used:-0}) * 1024))" "$scratch" || exit 21
    chmod u+rwx "$staged" || exit 21 # its entries move out (the root's banked mode is not kept here)
    for entry in "$scratch"/* "$scratch"/.[!.]* "$scratch"/..?*; do
        [ -e "$entry" ] || [ -L "$entry" ] || continue
        remove_tree "$entry" || { echo "scratchbank: cannot empty $scratch ($entry stays)" >&2; exit 21; }
    done
    for entry in "$staged"/* "$staged"/.[!.]* "$staged"/..?*; do
        [ -e "$entry" ] || [ -L "$entry" ] || continue
        mv -T "$entry" "$scratch/${entry##*/}" || exit 21
    done
    remove_tree "$staged" || echo "scratchbank: note: restored; $staged stays" >&2
}

case $op in
stage) stage "$@" ;;
commit) commit ;;
discard) remove_tree "$staged" ;;
list)
    work=$(mktemp -d "${TMPDIR:-/tmp}/.sb-list.XXXXXX" 2>/dev/null) || exit 12
    trap 'rm -rf "$work"' EXIT
    walk_tree "$scratch" "$work" || exit 12
    print_tree "$work"
    ;;
*) exit 2 ;;
esac
