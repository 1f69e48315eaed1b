/* hot.c - the native workload of the foundation end-to-end tests (issue 2).
 *
 * Built by the tests with `gcc -O2 -fomit-frame-pointer`, so unwinding must use .eh_frame.
 * Call chain main -> outer -> middle -> hot, each noinline; hot spins on a volatile counter
 * until the process is killed. The asm barriers after each call keep the calls from becoming
 * tail calls (a tail call would drop the caller's frame from the stack). Non-static and
 * noclone so the symbols keep their plain names (no .constprop/.isra clones). */
#include <stdio.h>

void hot(void);
void middle(void);
void outer(void);

static volatile unsigned long counter;

__attribute__((noinline, noclone)) void hot(void) {
    for (;;)
        counter++;
}

__attribute__((noinline, noclone)) void middle(void) {
    hot();
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline, noclone)) void outer(void) {
    middle();
    __asm__ volatile("" ::: "memory");
}

int main(void) {
    /* One line so a test can wait for "ready" before sampling. */
    printf("ready\n");
    fflush(stdout);
    outer();
    __asm__ volatile("" ::: "memory");
    return 0;
}
