# Shared by the benchmarks that wait for each answer (sourced, not run):
# the guest halt polling of a virtual machine, said in the header and
# optionally set for the run.
#
# A virtual machine's idle CPU (cpuidle driver and governor `haltpoll`)
# polls up to /sys/module/haltpoll/parameters/guest_halt_poll_ns before it
# halts; the kernel's default is 200000 (200 us). At 0, as on this
# project's machines, every wake-up of a thread sleeping on the other CPU is
# an interrupt through the host, and a client that waits for each answer of
# a server thread (a FUSE stat, create or unlink; an NBD client at queue
# depth 1) pays it twice per request: FUSE round trips of 23-25 us at 0
# against 11 us at 200000, where the server's own share is 1-2 us. ext4 and
# the raw file do not wait on another thread, so they do not pay it.
#
#   HALT_POLL_NS=N   run with guest_halt_poll_ns=N, put back at exit
#   halt_poll_apply     (after the EXIT trap is armed) applies HALT_POLL_NS
#   halt_poll_restore   (in the EXIT trap) puts the saved value back
#   halt_poll_describe  prints "guest_halt_poll_ns=N" or "no-haltpoll"

halt_poll_knob=/sys/module/haltpoll/parameters/guest_halt_poll_ns
halt_poll_saved=""

halt_poll_apply() {
    [ -n "${HALT_POLL_NS:-}" ] || return 0
    [ -w "$halt_poll_knob" ] || { echo "HALT_POLL_NS: $halt_poll_knob is not writable (no haltpoll, or not root)" >&2; exit 1; }
    halt_poll_saved=$(cat "$halt_poll_knob")
    echo "$HALT_POLL_NS" >"$halt_poll_knob"
}

halt_poll_restore() {
    [ -n "$halt_poll_saved" ] && echo "$halt_poll_saved" >"$halt_poll_knob"
    halt_poll_saved=""
}

halt_poll_describe() {
    local driver
    driver=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)
    if [ "$driver" = haltpoll ] && [ -r "$halt_poll_knob" ]; then
        echo "guest_halt_poll_ns=$(cat "$halt_poll_knob")${halt_poll_saved:+ (set for this run; was $halt_poll_saved)}"
    else
        echo "cpuidle=$driver"
    fi
}
