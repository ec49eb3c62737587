#!/bin/sh
# scratchbank restore (X2): read exactly SIZE bytes of a tar stream from stdin (never
# waiting for EOF), check their SHA-256, extract them into a fresh empty directory
# beside the scratch, then move it into place.
#
#   restore.sh SCRATCH SIZE SHA256 COMPRESS(z|raw)
#   exit 0 restored; 20 the stream broke (short, or not the bytes sent); 21 tar refused
#   (the scratch cannot be created, a member cannot be recreated, the disk is full).
set -u
export LC_ALL=C
scratch=$1
size=$2
want=$3
compress=${4:-raw}

parent=$(dirname "$scratch")
mkdir -p "$parent" 2>/dev/null || { echo "scratchbank: cannot create $parent" >&2; exit 21; }
new=$(mktemp -d "$parent/.scratchbank-restore.XXXXXX" 2>/dev/null) ||
    { echo "scratchbank: cannot create a directory in $parent" >&2; exit 21; }
work=$(mktemp -d "${TMPDIR:-/tmp}/.sb-restore.XXXXXX" 2>/dev/null) || work=$new.work
mkdir -p "$work" 2>/dev/null
fifo=$work/sum.fifo
mkfifo "$fifo" || { rm -rf "$new" "$work"; echo "scratchbank: cannot make a fifo" >&2; exit 21; }

cleanup() { rm -rf "$new" "$work"; }
sha256sum <"$fifo" >"$work/sum" &
sumpid=$!
if [ "$compress" = z ]; then flags=xzf; else flags=xf; fi
# After tar stops (refused, or done), drain the rest so the digest covers the whole
# stream: a refusal is then told apart from a stream that broke.
head -c "$size" | tee "$fifo" | {
    tar "$flags" - -C "$new" -o 2>"$work/err"
    status=$?
    cat >/dev/null
    exit "$status"
}
rc=$?
wait "$sumpid"
read -r got _ <"$work/sum" 2>/dev/null || got=""
if [ "$got" != "$want" ]; then
    echo "scratchbank: stream broke: got sha256 $got, want $want" >&2
    cleanup
    exit 20
fi
if [ "$rc" != 0 ]; then
    cat "$work/err" >&2
    cleanup
    exit 21
fi
if [ -e "$scratch" ] || [ -L "$scratch" ]; then
    if ! mv "$scratch" "$new.old" 2>/dev/null; then
        # A mount point cannot be renamed: empty it and move the entries in.
        find "$scratch" -mindepth 1 -maxdepth 1 -exec rm -rf {} + 2>/dev/null
        for entry in "$new"/* "$new"/.[!.]* "$new"/..?*; do
            [ -e "$entry" ] || [ -L "$entry" ] || continue
            mv "$entry" "$scratch"/ || { cat "$work/err" >&2; cleanup; exit 21; }
        done
        cleanup
        exit 0
    fi
fi
mv "$new" "$scratch" || { mv "$new.old" "$scratch" 2>/dev/null; cleanup; exit 21; }
rm -rf "$new.old" "$work"
exit 0
