// Takes POSIX record locks as fast as it can, in PROCS processes, 1,000 per file
// (byte ranges that do not touch, so each is a kernel object of its own), until it
// is killed or runs out of descriptors. For bench/lock_flood.sh.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/wait.h>
int main(int argc, char **argv) {
    int procs = atoi(argv[1]);
    for (int p = 0; p < procs; p++) {
        if (fork() == 0) {
            char name[64]; long n = 0;
            for (int f = 0;; f++) {
                snprintf(name, sizeof name, "/tmp/lb-%d-%d", p, f);
                int fd = open(name, O_RDWR | O_CREAT, 0600);
                if (fd < 0) { perror("open"); pause(); }
                for (int i = 0; i < 1000; i++) {
                    struct flock l = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 2 * i, .l_len = 1 };
                    if (fcntl(fd, F_SETLK, &l) < 0) { perror("lock"); pause(); }
                    n++;
                }
            }
        }
    }
    for (int p = 0; p < procs; p++) { int st; wait(&st); if (WIFSIGNALED(st)) printf("child killed by %d\n", WTERMSIG(st)); }
    return 0;
}
