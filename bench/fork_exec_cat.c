/* The second floor of exec mode, the plain way: N times fork, in the child dup2 the pipes,
 * setpgid and execve `cat` (found on PATH once, before the loop); in the parent write a
 * 100-byte body, read the echo, waitpid. Prints CPU (self + children) and wall time per spawn,
 * microseconds. Build: cc -O2 -o fork_exec_cat fork_exec_cat.c; run: fork_exec_cat N */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double secs(struct timeval t) { return t.tv_sec + t.tv_usec / 1e6; }

/* The first executable `cat` on PATH. */
static const char *find_cat(char *buf, size_t cap) {
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");
        if (snprintf(buf, cap, "%.*s/cat", (int)n, path) < (int)cap && access(buf, X_OK) == 0) return buf;
        path += n + (path[n] == ':');
    }
    return "/bin/cat";
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    char body[100], buf[4096], cat[4096];
    memset(body, 'x', sizeof body);
    const char *prog = find_cat(cat, sizeof cat);
    char *args[] = {"cat", NULL};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        int in[2], out[2];
        if (pipe(in) || pipe(out)) return 1;
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid == 0) {
            setpgid(0, 0);
            dup2(in[0], 0);
            dup2(out[1], 1);
            close(in[0]);
            close(in[1]);
            close(out[0]);
            close(out[1]);
            execve(prog, args, environ);
            _exit(127);
        }
        close(in[0]);
        close(out[1]);
        if (write(in[1], body, sizeof body) != sizeof body) return 1;
        close(in[1]);
        while (read(out[0], buf, sizeof buf) > 0) {}
        close(out[0]);
        waitpid(pid, NULL, 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    double cpu = secs(self.ru_utime) + secs(self.ru_stime) + secs(kids.ru_utime) + secs(kids.ru_stime);
    double wall = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("%.1f %.1f\n", cpu / n * 1e6, wall / n * 1e6); /* microseconds per spawn */
    return 0;
}
