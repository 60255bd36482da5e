/* The floor of exec mode: N times spawn `cat` with stdin and stdout pipes, write a 100-byte
 * body, read the echo, wait for it. Prints CPU (self + children), wall time and the spawner's
 * own CPU (self alone: what any process that does this pays itself, the floor of the wrapper's
 * own exec CPU) per spawn.
 * Build: cc -O2 -o spawn_floor spawn_floor.c; run: spawn_floor N */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double secs(struct timeval t) { return t.tv_sec + t.tv_usec / 1e6; }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    char body[100], buf[4096];
    memset(body, 'x', sizeof body);
    char *args[] = {"cat", NULL};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        int in[2], out[2];
        if (pipe(in) || pipe(out)) return 1;
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, in[0], 0);
        posix_spawn_file_actions_adddup2(&fa, out[1], 1);
        posix_spawn_file_actions_addclose(&fa, in[1]);
        posix_spawn_file_actions_addclose(&fa, out[0]);
        posix_spawnattr_t at;
        posix_spawnattr_init(&at);
        posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
        posix_spawnattr_setpgroup(&at, 0);
        pid_t pid;
        if (posix_spawnp(&pid, "cat", &fa, &at, args, environ)) return 1;
        close(in[0]);
        close(out[1]);
        if (write(in[1], body, sizeof body) != sizeof body) return 1;
        close(in[1]);
        while (read(out[0], buf, sizeof buf) > 0) {}
        close(out[0]);
        waitpid(pid, NULL, 0);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&at);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    double cpu = secs(self.ru_utime) + secs(self.ru_stime) + secs(kids.ru_utime) + secs(kids.ru_stime);
    double wall = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    double own = secs(self.ru_utime) + secs(self.ru_stime);
    printf("%.1f %.1f %.1f\n", cpu / n * 1e6, wall / n * 1e6, own / n * 1e6); /* µs per spawn */
    return 0;
}
