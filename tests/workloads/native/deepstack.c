/* deepstack.c - the `record --stack-size` end-to-end workload.
 *
 * main -> descend(40) -> ... -> descend(0) -> spin: each descend frame holds a 1 KiB buffer, so
 * main's frame sits ~41 KiB above the spinning frame. A copy of 64 KiB of user stack unwinds to
 * main; a copy of 8 KiB cannot. Built with `gcc -O2 -fomit-frame-pointer` (unwinding by
 * .eh_frame). The asm barriers keep the buffers and the calls (no tail calls). */
#include <stdio.h>

static volatile unsigned long counter;

__attribute__((noinline, noclone)) void spin(void) {
    for (;;)
        counter++;
}

__attribute__((noinline, noclone)) void descend(int n) {
    volatile char buf[1024];
    buf[0] = (char)n;
    if (n == 0)
        spin();
    else
        descend(n - 1);
    __asm__ volatile("" : : "r"(buf) : "memory");
}

int main(void) {
    printf("ready\n");
    fflush(stdout);
    descend(40);
    __asm__ volatile("" ::: "memory");
    return 0;
}
