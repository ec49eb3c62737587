#!/bin/sh
# scratchbank quiesce (T11-T14): stop every other process of this sandbox before tar
# reads the scratch, check that nothing else runs, and leave a watchdog that continues
# them if the banking side never comes back.
#
#   quiesce.sh stop BUDGET_SECONDS [WAIT_SECONDS]   -> exit 0 all stopped, 4 partial, 3 refused
#   quiesce.sh cont                                  -> continue everything, end the watchdog
#
# Only builtins signal (kill's exit status means nothing; /bin/kill -STOP -1 stops its
# own shell). Refusals come before any signal. Output lines: "refused: ...",
# "unquiesced: ...", "stopped N", then the verdict "scratchbank-quiesced CODE" (the exit
# code), then "watchdog PID": the host takes no report line after the verdict.
#
# Until the verdict is out, the script runs its shell's builtins only (H4), but `sleep`
# in pause: any command looked up on the sandbox's filesystem (date, sleep, readlink,
# mktemp...) runs with the script's user and can write "scratchbank-quiesced 0" to
# /proc/<the script>/fd/1, whatever its own output is redirected to (found by attack: a
# replaced sleep, then date). So the verdict line is checked against the exit code by the
# host, the clock is /proc/uptime read by `read`, a wait sleeps by steps on it (pause), the namespace check
# reads /proc/2/status, and the watchdog (mktemp, setsid, sh) starts once the verdict is
# written (quiesce_watch). A shell whose read, kill, printf, echo or test is not its own
# builtin is refused. The shell itself replaced is out of reach (ADR 0008).
#
# The sandbox is hostile (issue 25): no name is believed. A process's state is read from
# the State: line of /proc/PID/status (and of every task), never from /proc/PID/stat,
# whose first line a name with ") T 0" and a newline forges; PID 1, which kill -1 never
# stops, is quiet only when its write counters (/proc/1/io) did not move over the
# quiesce, whatever it calls itself. Running as root, the script never creates, truncates
# or follows a fixed name the workload can plant: the watchdog's flag lives in a
# directory made by mktemp -d (exclusive, mode 0700), created there with noclobber.
#
# With SCRATCHBANK_LIBRARY set it only defines quiesce_stop (the report in $q_out),
# quiesce_watch and quiesce_cont, for bank.sh: they must run in the shell that tar is started from later,
# never in a subshell (kill -STOP -1 spares only its sender).
set -u
WD_PREFIX="${TMPDIR:-/tmp}/.scratchbank-wd."
# The watchdog: continue everything if nobody says cont within the budget (T14). In a
# session of its own where setsid exists, so that a transport that cuts the exec's
# process group (the local sandbox) does not end it with the exec.
WATCHDOG='trap "" HUP INT
n=0
while [ "$n" -lt "$1" ] && [ -e "$2/armed" ]; do sleep 1; n=$((n + 1)); done
kill -CONT -1 2>/dev/null
rm -f "$2/armed" 2>/dev/null
rmdir "$2" 2>/dev/null'
self=$$
q_out=""

say() { q_out="$q_out$*
"; }

quiesce_cont() {
    kill -CONT -1 2>/dev/null
    # Only a watchdog directory this user made (not a link, owned by us): a name the
    # workload planted is left alone.
    for wd in "$WD_PREFIX"*; do
        [ -d "$wd" ] && [ ! -L "$wd" ] && [ -O "$wd" ] || continue
        rm -f "$wd/armed" 2>/dev/null
        rmdir "$wd" 2>/dev/null
    done
}

# read_status DIR: the last State:, PPid:, Uid: and Name: of DIR/status (a name is
# escaped by the kernel, and comes first: no name stands in for a later line). 1 when
# it cannot be read.
read_status() {
    st_state="" st_ppid="" st_uid="" st_name=""
    while read -r key a b; do
        case $key in
            Name:) st_name="$a${b:+ $b}" ;;
            State:) st_state=$a ;;
            PPid:) st_ppid=$a ;;
            Uid:) st_uid=$a ;;
        esac
    done 2>/dev/null <"$1/status"
    [ -n "$st_state" ]
}

# PID 1 is proven idle only when its counters stay still over at least this window (in
# hundredths of a second), from their first read (before the first stop) to the last
P1_WINDOW_CS=20

# uptime_cs: the machine's uptime in hundredths of a second (/proc/uptime, builtins only),
# "" when it cannot be read
uptime_cs() {
    up_cs=""
    up=""
    read -r up _ 2>/dev/null </proc/uptime
    case $up in
        [0-9]*.[0-9][0-9]) up_cs=${up%.*}${up#*.}; up_cs=${up_cs#"${up_cs%%[!0]*}"}; up_cs=${up_cs:-0} ;;
    esac
}

# pause CS: wait CS hundredths of a second on /proc/uptime. Each step sleeps 0.02 s
# (`sleep`, the one command run before the verdict: a spin of builtins alone cost 0.2
# cpu-s a quiesce: with 200 teardowns at once, the host's CPU) with every stream on /dev/null;
# a replaced sleep cannot time the wait (the clock does) and what it writes to the
# script's own stdout cannot pass for the verdict (the host checks the verdict line
# against the exit code: quiesce_verdict, confirmed). Without a sleep the steps spin.
# 1 without a clock, or with one that does not reach the end within 50 times the reads
# a spin takes here (about 100 a hundredth; a step that slept counts 200: a clock that
# stands still ends the wait too, in at most 15 s for the longest, 0.2 s, wait).
pause() {
    uptime_cs
    [ -n "$up_cs" ] || return 1
    p_end=$((up_cs + $1))
    p_left=$(($1 * 5000 + 5000))
    while [ "$up_cs" -lt "$p_end" ]; do
        # a step that slept counts as the ~200 reads a spin makes in its 0.02 s
        if sleep 0.02 </dev/null >/dev/null 2>&1; then p_left=$((p_left - 200)); else p_left=$((p_left - 1)); fi
        [ "$p_left" -gt 0 ] || return 1
        uptime_cs
        [ -n "$up_cs" ] || return 1
    done
    return 0
}

# pid1_writes: PID 1's write counters ("wchar N syscw N"), "" when they cannot be read
pid1_writes() {
    p1_io=""
    while read -r key v; do
        case $key in wchar: | syscw:) p1_io="$p1_io$key$v " ;; esac
    done 2>/dev/null </proc/1/io
}

reasons=""
note() {
    case "$reasons" in
        *"$1"*) ;;
        *) reasons="$reasons
$1"; say "unquiesced: $1" ;;
    esac
}

# -- stop, then check every process and thread ------------------------------------------
# A parent waiting on a vfork'd child shows D until that child execs or exits: when the
# child is stopped (before its exec), the parent is frozen too. A child that exited (Z)
# proves nothing: its vfork is over and the parent runs on (a root shell read in D whose
# child had exec'd, slept and exited before its children were read was taken for frozen,
# by a quiesce whose user cannot read its wchan). So: a stopped child, no child running,
# and the parent still in D when read again.
vfork_wait() {
    w=""
    read -r w 2>/dev/null <"$1/wchan"
    case $w in *vfork*) return 0 ;; esac
    kids=""
    read -r kids 2>/dev/null <"$1/task/$2/children"
    [ -n "$kids" ] || return 1
    held=""
    for k in $kids; do
        read_status "/proc/$k" || continue
        case $st_state in T|t) held=1 ;; Z|X|x) ;; *) return 1 ;; esac
    done
    [ -n "$held" ] || return 1
    read_status "$1" && [ "$st_state" = D ]
}

scan() {
    running=""
    unreadable=""
    checked=0
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        [ "$pid" = "$self" ] && continue
        [ "$pid" = 1 ] && continue
        if ! read_status "$d"; then
            [ -d "$d" ] && unreadable="$unreadable $pid"
            continue
        fi
        state=$st_state ppid=$st_ppid
        [ "$ppid" = "$self" ] && continue
        checked=$((checked + 1))
        case $state in
            T|t|Z|X|x) ;;
            D) vfork_wait "$d" "$pid" || { running="$running $pid:D"; continue; } ;;
            *) running="$running $pid:$state"; continue ;;
        esac
        for t in "$d"/task/*; do
            tid=${t##*/}
            [ "$tid" = "$pid" ] && continue
            read_status "$t" || continue
            case $st_state in T|t|Z|X|x) ;; *) running="$running $pid/$tid:$st_state" ;; esac
        done
    done
}

# -- guards, before any signal (T12): 3 (refused) when the sandbox must not be signalled
may_signal() {
    # the host's initial PID namespace shows its kernel threads: PID 2 is kthreadd there,
    # child of none (read by builtins: readlink was the sandbox's, H4)
    if read_status /proc/2 && [ "$st_name" = kthreadd ] && [ "$st_ppid" = 0 ]; then
        say "refused: this is the host's initial PID namespace"
        return 3
    fi
    statpid=""
    read -r statpid _rest 2>/dev/null </proc/self/stat
    [ "$statpid" = "$self" ] || { say "refused: /proc is not this sandbox's own (pid $statpid vs $self)"; return 3; }
    my_uid=""
    nspid_fields=0
    while read -r key a b c d; do
        case $key in
            Uid:) my_uid=$a ;;
            NSpid:) set -f; set -- $a ${b:-} ${c:-} ${d:-}; set +f; nspid_fields=$# ;;
        esac
    done 2>/dev/null </proc/self/status
    [ "$nspid_fields" -gt 1 ] && { say "refused: /proc belongs to a parent PID namespace"; return 3; }
    # kthreadd is hidden from another user by hidepid: its absence proves nothing then
    if [ "$my_uid" != 0 ] && hidepid; then
        say "refused: /proc is mounted hidepid: this user cannot tell the sandbox's PID namespace from the host's"
        return 3
    fi
    return 0
}

# shell_builtins: 0 when read, kill, printf, echo, test and [ are this shell's builtins (no
# function, alias or file stands in for one), else 3 with a refusal
shell_builtins() {
    b_out=$(LC_ALL=C; type read kill printf echo test [ 2>&1)
    for b in read kill printf echo test [; do
        case "
$b_out
" in
            *"
$b is a shell builtin
"*) ;;
            *) say "refused: the shell's $b is not its builtin"; return 3 ;;
        esac
    done
    return 0
}

# hidepid: 0 when /proc is mounted hidepid
hidepid() {
    while read -r _id _p _mm _root mnt _opts rest; do
        [ "$mnt" = /proc ] || continue
        case " $rest " in
            *hidepid=1*|*hidepid=2*|*hidepid=4*|*hidepid=invisible*|*hidepid=noaccess*|*hidepid=ptraceable*)
                return 0 ;;
        esac
    done 2>/dev/null </proc/self/mountinfo
    return 1
}

# -- what a quiesce cannot stop or check (T13), before any signal ------------------------
unstoppable() {
    hidepid && note "/proc is mounted hidepid: other users' processes cannot be checked"

    # PID 1 is never stopped by kill -1: its write counters are read now and once the
    # quiesce has waited (pid1_idle); its name proves nothing
    p1_before=""
    p1_since=""
    if [ "$self" != 1 ]; then
        pid1_writes
        p1_before=$p1_io
        uptime_cs
        p1_since=$up_cs
    fi
}

# clean_name NAME: NAME in $c_out, every character but [A-Za-z0-9._+@:=-] as "?", by
# builtins only: the workload may have replaced tr with one that prints report lines of
# its own ("scratchbank-quiesced 0" read as a quiesce that stopped everything)
NAME_CHARS='abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+@:=-'
clean_name() {
    c_in=$1
    c_out=""
    while [ -n "$c_in" ]; do
        c_rest=${c_in#?}
        c=${c_in%"$c_rest"}
        case $NAME_CHARS in *"$c"*) c_out=$c_out$c ;; *) c_out="$c_out?" ;; esac
        c_in=$c_rest
    done
}

# pid1_idle: PID 1 is proven idle (its counters readable, unmoved since unstoppable over
# at least P1_WINDOW_CS, every task asleep or stopped), else a note says why not. The
# window counts from the first read, so the stop rounds' time is part of it; the check
# reads the counters every 0.05 s and ends as soon as they moved or the window is over.
# Without a clock to read (/proc/uptime), PID 1 is not proven idle: no sleep stands in.
pid1_idle() {
    [ "$self" = 1 ] && return 0
    read_status /proc/1 || st_name="?"
    name=$st_name
    clean_name "$name"
    name=$c_out
    while :; do
        pid1_writes
        [ -n "$p1_before" ] && [ "$p1_before" = "$p1_io" ] || break # moved or unreadable: below
        uptime_cs
        if [ -z "$up_cs" ] || [ -z "$p1_since" ]; then
            note "pid 1 ($name) cannot be stopped from inside and there is no clock (/proc/uptime) to time its writes: not proven idle"
            return 1
        fi
        [ $((up_cs - p1_since)) -ge "$P1_WINDOW_CS" ] && break
        if ! pause 5; then
            note "pid 1 ($name) cannot be stopped from inside and the clock (/proc/uptime) stands still: not proven idle"
            return 1
        fi
    done
    if [ -z "$p1_before" ] || [ -z "$p1_io" ]; then
        note "pid 1 ($name) cannot be stopped from inside and its writes cannot be read: not proven idle"
        return 1
    fi
    if [ "$p1_before" != "$p1_io" ]; then
        note "pid 1 ($name) cannot be stopped from inside and wrote during the quiesce"
        return 1
    fi
    for t in /proc/1/task/*; do
        read_status "$t" || continue
        case $st_state in S|T|t|I) ;; *) note "pid 1 ($name) has a task in state $st_state: not proven idle"; return 1 ;; esac
    done
    return 0
}

# quiesce_stop BUDGET WAIT: 0 all stopped, 4 partial, 3 refused; the report in $q_out.
quiesce_stop() {
    wait_for=$2
    q_out=""
    reasons=""
    shell_builtins || return 3
    may_signal || return 3
    unstoppable
    uptime_cs
    start=$up_cs
    round=0
    clock=1
    while :; do
        kill -STOP -1 2>/dev/null
        scan
        [ -z "$running" ] && [ -z "$unreadable" ] && break
        round=$((round + 1))
        uptime_cs
        if [ -n "$clock" ] && [ -n "$up_cs" ] && [ -n "$start" ]; then
            [ "$round" -ge 5 ] && [ $((up_cs - start)) -ge $((wait_for * 100)) ] && break
        else
            [ "$round" -ge 5 ] && break # no clock: five rounds, back to back
        fi
        pause 20 || clock=""
    done

    for entry in $running; do
        pid=${entry%%[:/]*}
        uid=""
        while read -r key a _; do [ "$key" = Uid: ] && uid=$a; done 2>/dev/null </proc/$pid/status
        state=${entry##*:}
        if [ -n "$uid" ] && [ "$uid" != "$my_uid" ] && [ "$my_uid" != 0 ]; then
            note "process $pid of another user ($uid) could not be stopped"
        elif [ "$state" = D ]; then
            note "task $entry stayed in uninterruptible sleep (D) past ${wait_for}s"
        else
            note "process $entry still running after every stop"
        fi
    done
    for pid in $unreadable; do note "status of process $pid cannot be read"; done
    pid1_idle
    say "stopped $checked"
    [ -n "$reasons" ] && return 4
    return 0
}

# quiesce_watch BUDGET: the watchdog (T14), its line in $q_watch. Only once the verdict is
# written: mktemp, setsid and sh are looked up on the sandbox's filesystem (H4).
quiesce_watch() {
    wd=$(mktemp -d "${WD_PREFIX}XXXXXX" 2>/dev/null) || wd=""
    if [ -n "$wd" ] && (set -C && : >"$wd/armed") 2>/dev/null; then
        detach=""
        command -v setsid >/dev/null 2>&1 && detach=setsid
        # not the call's: a reap after a cut must leave the watchdog running
        SCRATCHBANK_EXEC=watchdog $detach sh -c "$WATCHDOG" watchdog "$1" "$wd" </dev/null >/dev/null 2>&1 &
        q_watch="watchdog $!"
    else
        q_watch="watchdog none"
    fi
}

if [ -z "${SCRATCHBANK_LIBRARY:-}" ]; then
    if [ "${1:-}" = cont ]; then
        quiesce_cont
        echo continued
        exit 0
    fi
    quiesce_stop "${2:-30}" "${3:-5}"
    rc=$?
    printf '%sscratchbank-quiesced %s\n' "$q_out" "$rc"
    if [ "$rc" != 3 ]; then
        quiesce_watch "${2:-30}"
        printf '%s\n' "$q_watch"
    fi
    exit "$rc"
fi
