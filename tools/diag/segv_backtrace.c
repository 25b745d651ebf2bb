/* LD_PRELOAD helper for diagnosing crashes on the GPU machine: on SIGSEGV/SIGABRT/SIGBUS, print the C
 * backtrace (glibc's backtrace_symbols_fd) to stderr, then die of the signal as before. Installed from
 * a constructor; Python's faulthandler, installed later, chains to it after its own Python traceback.
 * Build: gcc -shared -fPIC -O1 -o $OUT/libsegv.so tools/diag/segv_backtrace.c */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_fatal(int sig) {
    void *frames[64];
    int n = backtrace(frames, 64);
    static const char head[] = "\n== C backtrace (segv_backtrace.c) ==\n";
    if (write(2, head, sizeof head - 1) < 0) { /* nothing to do: the backtrace follows anyway */ }
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    void *warm[1];
    backtrace(warm, 1); /* load libgcc now, not inside the handler */
    signal(SIGSEGV, on_fatal);
    signal(SIGBUS, on_fatal);
    signal(SIGABRT, on_fatal);
}
