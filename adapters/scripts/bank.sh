# scratchbank bank (T11-T16 in one exec): quiesce, archive, continue. Run after
# quiesce.sh and archive.sh, loaded with SCRATCHBANK_LIBRARY set (scripted.py: BANK).
#
#   bank.sh SCRATCH COMPRESS BUDGET_SECONDS WAIT_SECONDS
#
# stdout: quiesce.sh's report lines, ended by "scratchbank-quiesced CODE" (its exit
#   code), written before tar starts so that a cut exec still tells what was stopped
#   (nothing but the shell's builtins runs before it: quiesce.sh);
#   then tar's stream, as archive.sh writes it (verifying unless every process stopped).
# stderr: tar's warnings and the raced lines, then, last, the line
#   "scratchbank-bank: continued"     (the pass did not race: everything runs again),
#   "scratchbank-bank: left stopped"  (a race or a failure: the host continues them,
#                                      after more passes; else the watchdog does), or
#   "scratchbank-bank: nothing stopped" (the quiesce refused before any signal).
# exit: archive.sh's status + 32 x the quiesce's verdict (0 quiesced, 1 partial, 2 refused)
#   while the status is below 32, else the status alone: the host checks the verdict
#   line against it (a line any process of this user could have written first).
quiesce_stop "$3" "$4"
q=$?
printf '%sscratchbank-quiesced %s\n' "$q_out" "$q"
# the watchdog only now: what it runs (mktemp, setsid, sh) is the sandbox's and may print
# anything, and the host takes no report line after the verdict (H4)
[ "$q" = 3 ] || quiesce_watch "$3"
verify=1
[ "$q" = 0 ] && verify=0
archive_scratch "$1" "$2" "$verify"
rc=$?
if [ "$q" = 3 ]; then
    status="nothing stopped"
elif { [ "$rc" = 0 ] || [ "$rc" = 10 ]; } && [ "$a_raced" = 0 ]; then
    quiesce_cont
    status=continued
else
    status="left stopped"
fi
printf 'scratchbank-bank: %s\n' "$status" >&2
# the exit code carries the quiesce's verdict too (H4): a line on stdout can be written by
# any process of the script's user (PID 1, never stopped, opens /proc/<this>/fd/1), the exit
# code only by this shell. archive.sh's status + 32 x (0 quiesced, 1 partial, 2 refused),
# while that status is below 32 (tar's, 10, 12); else the status alone (no verdict in it).
case $q in 0) k=0 ;; 4) k=1 ;; *) k=2 ;; esac
[ "$rc" -lt 32 ] && rc=$((rc + 32 * k))
exit "$rc"
