/* readloop.c - for the --kernel end-to-end test (issue 2): loops on read() from /dev/zero,
 * so most samples land in the kernel's read path (ksys_read / vfs_read) under this process's
 * user frames. Built by the tests with `gcc -O2 -fomit-frame-pointer`; runs until killed. */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

void read_forever(int fd);

static char buf[1 << 16];

__attribute__((noinline, noclone)) void read_forever(int fd) {
    for (;;) {
        if (read(fd, buf, sizeof buf) < 0) {
            perror("read /dev/zero");
            _exit(1);
        }
        __asm__ volatile("" ::: "memory");
    }
}

int main(void) {
    int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0) {
        perror("open /dev/zero");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    read_forever(fd);
    return 0;
}
