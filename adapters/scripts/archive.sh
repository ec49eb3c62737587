#!/bin/sh
# scratchbank archive (T2, T15-T18): tar the scratch to stdout, untranslated.
#
#   archive.sh SCRATCH COMPRESS VERIFY
#     COMPRESS: z (gzip in the sandbox) | raw (the host compresses)
#     VERIFY:   1 lists sizes, mtimes and ctimes before and after tar and names what
#               changed ("scratchbank: raced: ./name"), since BusyBox tar reports no race
#               and GNU tar misses a same-size rewrite within one mtime tick.
#   exit 10: empty or missing scratch; 12: cannot enter or list it; else tar's status.
#
# With SCRATCHBANK_LIBRARY set it only defines archive_scratch (same arguments, its
# status returned, $a_raced 1 when the verifying listings differed), for bank.sh.
set -u
export LC_ALL=C
a_raced=0

a_list() { find . -exec stat -c '%n|%s|%Y|%Z|%f' {} + 2>/dev/null | sort; }

archive_scratch() {
    scratch=$1
    compress=${2:-raw}
    verify=${3:-0}
    a_raced=0
    if [ ! -e "$scratch" ]; then
        echo "scratchbank: $scratch does not exist" >&2
        return 10
    fi
    # "/." follows a scratch that is a symbolic link to a directory (T18).
    cd "$scratch/." 2>/dev/null || { echo "scratchbank: cannot enter $scratch" >&2; return 12; }
    listing=$(ls -A 2>/dev/null) || { echo "scratchbank: cannot list $scratch" >&2; return 12; }
    [ -z "$listing" ] && return 10

    tmp="${TMPDIR:-/tmp}"
    if [ "$verify" = 1 ]; then
        before=$(mktemp "$tmp/.sb-before.XXXXXX") && after=$(mktemp "$tmp/.sb-after.XXXXXX") || verify=0
    fi
    [ "$verify" = 1 ] && a_list >"$before"

    if [ "$compress" = z ]; then
        tar czf - .
    else
        tar cf - .
    fi
    rc=$?

    if [ "$verify" = 1 ]; then
        a_list >"$after"
        if ! cmp -s "$before" "$after"; then
            a_raced=1
            diff -u "$before" "$after" | sed -n 's/^[-+]\(\.[^|]*\)|.*/\1/p' | sort -u |
                while read -r name; do echo "scratchbank: raced: $name" >&2; done
        fi
        rm -f "$before" "$after"
    fi
    return $rc
}

if [ -z "${SCRATCHBANK_LIBRARY:-}" ]; then
    archive_scratch "$1" "${2:-raw}" "${3:-0}"
    exit $?
fi
